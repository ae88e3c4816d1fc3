"""The durable store: durable messages on durable queues survive a SIGKILL; nothing else touches the disk; a torn
tail is cut, damage elsewhere and a newer format stop the broker with a message; a full disk refuses durable
messages with a precise error and loses nothing already acknowledged."""

from __future__ import annotations

import os
import struct
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from proton import Delivery, Message
from proton.utils import BlockingConnection, SendException

from broker.store import records as R
from tests.broker.helpers import outcome
from tests.support.amqp import connect, drain, mgmt, receive, send, settle_last
from tests.support.bulk import fill, number_of
from tests.support.cluster import Cluster
from tests.support.disks import fill_up
from tests.support.procs import BIN, ROOT, BrokerFactory, BrokerProcess, wait_for


def journal_dir(b: BrokerProcess) -> Path:
    return b.data_dir / "journal"


def segments(b: BrokerProcess) -> list[Path]:
    return sorted(journal_dir(b).glob("*.jnl"))


def durable_queue(b: BrokerProcess, name: str, **args: object) -> None:
    with mgmt(b.url) as m:
        m.call("CREATE", "queue", name, {"arguments": {"durable": True, **args}})


def restart_after_kill(b: BrokerProcess) -> None:
    b.kill()
    b.start()


def publish_until_refused(url: str, address: str, ids: bool = False) -> tuple[list[int], Delivery]:
    """Send durable messages of ~10 KiB ("N-yyy...", with ids `order-N`) one at a time until one is not accepted:
    the numbers accepted, and the delivery that was not (a small disk is full long before 10,000)."""
    conn = connect(url, timeout=30)
    accepted: list[int] = []
    try:
        s = conn.create_sender(address)
        for i in range(10_000):
            d = s.link.send(Message(id=f"order-{i}" if ids else None, body=f"{i}-{'y' * 10_000}", durable=True))
            conn.wait(lambda d=d: bool(d.remote_state), timeout=30)
            if d.remote_state != Delivery.ACCEPTED:
                return accepted, d
            accepted.append(i)
    finally:
        conn.close()
    raise AssertionError("10,000 messages were all accepted: the disk did not fill up")


def broker_on_a_small_disk(brokers: BrokerFactory, small_disk: Path) -> tuple[BrokerProcess, Path]:
    """A broker whose journal is on the 8 MiB tmpfs, 5 MiB of it taken by a ballast file (returned: what else
    fills the disk, for the operator to free)."""
    ballast = small_disk / "ballast"
    ballast.write_bytes(b"\0" * (5 * 1024 * 1024))
    b = brokers(start=False)
    b.data_dir = small_disk / "data"
    b.start()
    return b, ballast


def test_durable_messages_of_durable_queues_survive_a_kill_in_order(brokers: BrokerFactory) -> None:
    b = brokers()
    durable_queue(b, "orders")
    with mgmt(b.url) as m:
        m.call("CREATE", "queue", "scratch", {})
    send(b.url, "orders", list(range(1, 201)), durable=True)
    send(b.url, "orders", ["not durable"], durable=False)
    send(b.url, "scratch", ["gone"], durable=True)
    assert receive(b.url, "orders", 50) == list(range(1, 51))
    restart_after_kill(b)
    assert drain(b.url, "orders") == list(range(51, 201))
    with mgmt(b.url) as m:
        assert m.request("READ", "queue", "scratch").status == 404  # a non-durable queue is not kept
        q = m.call("READ", "queue", "orders").body
    assert q["next-position"] >= 201  # positions go on from the highest journaled one
    recovered = next(e for e in b.events(since_start=True) if e["event"] == "journal.recovered")
    assert recovered["messages"] == 150 and recovered["queues"] == 1


def test_non_durable_traffic_never_touches_the_disk(brokers: BrokerFactory) -> None:
    b = brokers()
    durable_queue(b, "dq")
    with mgmt(b.url) as m:
        m.call("CREATE", "queue", "vq", {})
    send(b.url, "dq", ["warm"], durable=True)
    before = sum(p.stat().st_size for p in segments(b))
    send(b.url, "dq", list(range(500)), durable=False)  # a durable queue, non-durable messages
    send(b.url, "vq", list(range(500)), durable=True)  # durable messages, a non-durable queue
    assert receive(b.url, "dq", 501)[0] == "warm"
    receive(b.url, "vq", 500)
    after = sum(p.stat().st_size for p in segments(b))
    assert after - before < 64  # one dequeue record (the durable "warm"), nothing else


def test_group_commit_writes_many_messages_per_write_and_sync(brokers: BrokerFactory) -> None:
    b = brokers()
    durable_queue(b, "burst")
    with mgmt(b.url) as m:
        c0 = m.call("READ", "broker", "broker").body["journal"]["commits"]
    fill(b.url, "burst", 2000, start=0, durable=True)  # pipelined: many in flight, confirmed together
    with mgmt(b.url) as m:
        commits = m.call("READ", "broker", "broker").body["journal"]["commits"] - c0
    assert commits < 2000 / 5, commits  # a write and an fdatasync per pass, not per message
    restart_after_kill(b)
    assert drain(b.url, "burst") == list(range(2000))


def test_a_torn_tail_is_cut_and_reported(brokers: BrokerFactory) -> None:
    b = brokers()
    durable_queue(b, "t")
    send(b.url, "t", list(range(10)), durable=True)
    b.kill()
    last = segments(b)[-1]
    good = last.stat().st_size
    record = R.enqueue(1, 999, 0, 2, 0, None, b"\x00\x53\x77\xa1\x04torn")
    with last.open("ab") as f:
        f.write(record[: len(record) // 2])  # a crash in the middle of a write
    b.start()
    torn = [e for e in b.events(since_start=True) if e["event"] == "journal.torn_tail"]
    assert torn and torn[0]["bytes"] == len(record[: len(record) // 2].rstrip(b"\0"))  # zeros at the end are not
    #                                                                          told from a zero-filled segment's rest
    assert drain(b.url, "t") == list(range(10))
    assert last.stat().st_size == good or not last.exists()  # cut back (or dropped: nothing live on it)


def test_segments_are_zero_filled_in_advance_and_a_torn_commit_in_one_is_cut(brokers: BrokerFactory) -> None:
    seg = 256 * 1024
    b = brokers("--journal-segment-bytes", str(seg))
    durable_queue(b, "z")
    fill(b.url, "z", 600, start=0, durable=True, pad=300)  # past half a segment: the next one is prepared
    wait_for(lambda: stats(b)["prepared"] >= 1, 10, what="a segment zero-filled in advance")
    fill(b.url, "z", 600, start=600, durable=True, pad=300)  # the growing segment gives way to the prepared one
    assert stats(b)["preallocated"]
    b.kill()
    last = segments(b)[-1]
    data = last.read_bytes()
    # The end of the whole records (not of the bytes that are not zero: the last MARK ends in zeros when no sync of
    # this segment had returned before its commit was written, as after a roll-over into the prepared segment)
    end = R.scan(memoryview(data), R.HEADER.size)[1].good
    assert len(data) == seg and end < seg and not any(data[end:])  # written into, with zeros after the data
    # A crash while two commits were in flight, the second one's page on disk and the first one's not:
    r3, r4 = (R.enqueue(1, p, 0, 2, 0, None, b"lost") for p in (5000, 5001))
    c3 = r3 + R.mark(end + len(r3), end)  # both written after the last sync, which covered `end` bytes
    c4 = r4 + R.mark(end + len(c3) + len(r4), end)
    torn = bytes(20) + c3[20:] + c4
    with last.open("r+b") as f:
        f.seek(end)
        f.write(torn)
    b.start()
    cut = [e["bytes"] for e in b.events(since_start=True) if e["event"] == "journal.torn_tail"]
    assert cut == [len(torn)]  # from the torn commit to the end of the intact one after it
    assert last.stat().st_size == end  # cut there (and the zeros it was not written into)
    assert [number_of(x) for x in drain(b.url, "z")] == list(range(1200))
    send(b.url, "z", ["after"], durable=True)
    restart_after_kill(b)
    assert drain(b.url, "z") == ["after"]


def test_a_write_a_crash_cut_short_is_cut_whole_so_a_resend_is_taken_once(brokers: BrokerFactory) -> None:
    """A crash (a power loss) can leave a write's first page on disk and not its last: the message kept, the DEDUP
    record of its id and the write's MARK lost. Recovery kept the message and forgot its id, so the publisher's
    resend (it never had the confirmation) was taken as new: two copies. A write now counts only with its MARK:
    the message is cut with its id, and the resend is the only copy."""
    b = brokers()
    durable_queue(b, "orders", **{"duplicate-window": 1000})
    for i in range(3):
        send(b.url, "orders", [f"order-{i}"], id=f"id-{i}", durable=True)
    b.kill()
    last = segments(b)[-1]
    recs, end = R.scan(memoryview(last.read_bytes()), R.HEADER.size)
    marks = [r.offset for r in recs if r.kind == R.MARK]
    write = [r for r in recs if r.offset > marks[-2]]  # the last write: the last message, its id, the MARK
    assert [R.KINDS[r.kind] for r in write] == ["enqueue", "dedup", "mark"]
    with last.open("r+b") as f:  # the page holding the id and the MARK never reached the disk
        f.seek(write[1].offset)
        f.write(bytes(end.good - write[1].offset))
    b.start()
    torn = [e for e in b.events(since_start=True) if e["event"] == "journal.torn_tail"]
    assert torn and torn[0]["bytes"] == write[1].offset - write[0].offset  # the message's record, cut
    send(b.url, "orders", ["order-2"], id="id-2", durable=True)  # the publisher's resend
    assert drain(b.url, "orders") == ["order-0", "order-1", "order-2"]


def test_a_prepared_segment_a_crash_took_before_its_header_was_synced_is_dropped(brokers: BrokerFactory) -> None:
    b = brokers()
    durable_queue(b, "h")
    send(b.url, "h", list(range(5)), durable=True)
    b.kill()
    number = int(segments(b)[-1].name[:8]) + 1
    orphan = bytearray(256 * 1024)  # renamed from the preparer, written, then the crash: only a later page is there
    orphan[9000:9040] = R.enqueue(1, 77, 0, 2, 0, None, b"never confirmed")[:40]
    (journal_dir(b) / f"{number:08d}.jnl").write_bytes(bytes(orphan))
    b.start()
    assert receive(b.url, "h", 2) == [0, 1]  # served: the start (and its new segment) is complete
    assert (journal_dir(b) / f"{number:08d}.jnl").read_bytes()[:4] == R.MAGIC  # dropped, its number begun afresh
    torn = [e for e in b.events(since_start=True) if e["event"] == "journal.torn_tail"]
    assert torn and "never written" in torn[0]["description"]
    restart_after_kill(b)  # and the next start finds a journal it starts from, not an empty file in the middle
    assert drain(b.url, "h") == [2, 3, 4]


def test_dropped_segments_give_their_disk_space_back(brokers: BrokerFactory) -> None:
    b = brokers("--journal-segment-bytes", str(64 * 1024))
    durable_queue(b, "d")
    for round_ in range(4):  # ~1 MiB each: many segments written, rolled over and dropped once consumed
        fill(b.url, "d", 250, start=round_ * 250, durable=True, pad=4000)
        assert [number_of(x) for x in drain(b.url, "d")] == list(range(round_ * 250, (round_ + 1) * 250))
    assert any(e["event"] == "journal.segment.dropped" for e in b.events())
    assert b.proc is not None
    fds = Path(f"/proc/{b.proc.pid}/fd")
    held = [os.readlink(fds / f) for f in os.listdir(fds)]
    deleted = [t for t in held if t.endswith("(deleted)")]
    assert not deleted, f"the broker still holds deleted files open (their space is not freed): {deleted[:5]}"
    assert len([t for t in held if t.endswith(".jnl")]) <= 3


def test_no_segment_is_zero_filled_without_room_for_two(brokers: BrokerFactory, small_disk: Path) -> None:
    b = brokers("--journal-segment-bytes", str(4 * 1024 * 1024), start=False)
    b.data_dir = small_disk / "data"
    b.start()
    durable_queue(b, "s")
    fill(b.url, "s", 250, start=0, durable=True, pad=10_000)  # 2.5 MB: more than half a segment
    wait_for(lambda: any(e["event"] == "journal.prepare.skipped" for e in b.events()), 10,
             what="the preparer to see the disk is too small")
    skipped = next(e for e in b.events() if e["event"] == "journal.prepare.skipped")
    assert "free, fewer than 2 segments" in skipped["description"]
    assert not (journal_dir(b) / "prepared.tmp").exists() and stats(b)["prepared"] == 0
    assert stats(b)["failed"] is None  # the spare segment never filled the disk
    restart_after_kill(b)
    assert [number_of(x) for x in drain(b.url, "s")] == list(range(250))


def stats(b: BrokerProcess) -> dict[str, object]:
    with mgmt(b.url) as m:
        return m.call("READ", "broker", "broker").body["journal"]  # type: ignore[no-any-return]


def test_damage_in_the_middle_stops_the_broker_with_where_and_what_to_do(brokers: BrokerFactory) -> None:
    b = brokers()
    durable_queue(b, "d")
    send(b.url, "d", list(range(20)), durable=True)
    b.kill()
    last = segments(b)[-1]
    data = bytearray(last.read_bytes())
    data[R.HEADER.size + 12] ^= 0xFF  # inside the first record, with good records after it
    last.write_bytes(bytes(data))
    proc = b.start(wait=False).proc
    assert proc is not None
    assert proc.wait(30) == 2
    err = b.stderr_file.read_text()
    assert f"journal damaged in {last.name}" in err and "ha-admin journal cut" in err
    assert last.read_bytes() == bytes(data)  # nothing was changed


def test_a_journal_from_a_newer_format_is_refused(brokers: BrokerFactory) -> None:
    b = brokers()
    durable_queue(b, "n")
    b.kill()
    last = segments(b)[-1]
    data = bytearray(last.read_bytes())
    struct.pack_into(">H", data, 4, R.FORMAT + 1)
    last.write_bytes(bytes(data))
    proc = b.start(wait=False).proc
    assert proc is not None
    assert proc.wait(30) == 2
    assert f"journal format {R.FORMAT + 1} is newer than this broker's" in b.stderr_file.read_text()


def test_a_data_dir_that_is_a_file_or_cannot_be_made_stops_the_broker_with_a_message(tmp_path: Path) -> None:
    a_file = tmp_path / "a-file"
    a_file.write_text("keep\n")
    for data_dir, expected in [(a_file, f"--data-dir {a_file}: not a directory"),
                               (a_file / "data", f"--data-dir {a_file / 'data'}: cannot create it: Not a directory")]:
        for check in ([], ["--validate-config"]):  # the check says what the start would, without making anything
            r = subprocess.run([str(BIN / "ha-broker"), "--port", "0", "--data-dir", str(data_dir), *check],
                               capture_output=True, text=True, timeout=30)
            assert r.returncode == 2, r.stderr
            assert r.stderr.strip() == f"ha-broker: {expected}"  # one line, no traceback
    assert a_file.read_text() == "keep\n"


def test_a_log_or_pid_file_that_cannot_be_written_stops_the_broker_with_one_line(tmp_path: Path) -> None:
    """They were tracebacks (exit 1): a parent that is a file, a log file that is a directory."""
    a_file = tmp_path / "a-file"
    a_file.write_text("keep\n")
    for args, expected in [
        (["--log-file", str(a_file / "b.log")], f"--log-file {a_file / 'b.log'}: its directory {a_file}: not a "
                                                "directory"),
        (["--log-file", str(tmp_path)], f"--log-file {tmp_path}: is a directory"),
        (["--pid-file", str(a_file / "b.pid")], f"--pid-file {a_file / 'b.pid'}: its directory {a_file}: not a "
                                                "directory"),
    ]:
        for check in ([], ["--validate-config"]):
            r = subprocess.run([str(BIN / "ha-broker"), "--port", "0", *args, *check], capture_output=True, text=True,
                               timeout=30)
            assert (r.returncode, r.stderr) == (2, f"ha-broker: {expected}\n"), (check, r.stderr)
    assert a_file.read_text() == "keep\n"


def test_a_journal_file_that_cannot_be_opened_is_named_and_the_journal_left_intact(brokers: BrokerFactory) -> None:
    b = brokers()
    durable_queue(b, "q")
    send(b.url, "q", ["one", "two"], durable=True)
    b.kill()
    before = {p.name: p.read_bytes() for p in segments(b)}
    blocker = journal_dir(b) / "99999999.jnl"  # a directory where a segment file should be
    blocker.mkdir()
    proc = b.start(wait=False).proc
    assert proc is not None
    assert proc.wait(30) == 2
    assert f"ha-broker: journal: {blocker}: Is a directory" in b.stderr_file.read_text()  # not "cannot listen"
    assert [e["description"] for e in b.events(since_start=True) if e["event"] == "journal.refused"] == [
        f"journal: {blocker}: Is a directory"]
    assert {p.name: p.read_bytes() for p in segments(b) if p.is_file()} == before
    blocker.rmdir()
    b.start()
    assert drain(b.url, "q") == ["one", "two"]


def test_a_read_only_data_dir_stops_the_broker_with_a_message_and_keeps_its_messages(
        brokers: BrokerFactory) -> None:
    if os.geteuid() != 0:
        pytest.skip("a read-only bind mount needs root")
    b = brokers()
    durable_queue(b, "q")
    send(b.url, "q", ["kept"], durable=True)
    b.kill()
    d = str(b.data_dir)
    subprocess.run(["mount", "--bind", d, d], check=True, timeout=30)
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", d], check=True, timeout=30)
        for path, reason in [(d, "not writable (a read-only file system)"),
                             (f"{d}/new/deeper", "cannot create it: Read-only file system")]:
            r = subprocess.run([str(BIN / "ha-broker"), "--data-dir", path, "--validate-config"],
                               capture_output=True, text=True, timeout=30)
            assert (r.returncode, r.stderr.strip()) == (2, f"ha-broker: --data-dir {path}: {reason}")
        proc = b.start(wait=False).proc
        assert proc is not None
        assert proc.wait(30) == 2
        assert f"ha-broker: --data-dir {d}: not writable (a read-only file system)" in b.stderr_file.read_text()
    finally:
        subprocess.run(["umount", d], check=True, timeout=30)
    b.start()
    assert drain(b.url, "q") == ["kept"]


def test_a_second_broker_on_the_same_data_dir_is_refused_and_the_first_keeps_its_messages(
        brokers: BrokerFactory) -> None:
    first = brokers(name="one")
    durable_queue(first, "q")
    send(first.url, "q", ["a", "b"], durable=True)
    second = brokers(name="two", start=False)
    second.data_dir = first.data_dir  # an operator's slip: the same --data-dir twice
    proc = second.start(wait=False).proc
    assert proc is not None and proc.wait(30) == 2
    assert first.proc is not None
    assert (f"ha-broker: --data-dir {first.data_dir}: in use by another process, pid {first.proc.pid} (it holds "
            f"{first.data_dir / 'lock'}: a broker, or ha-admin journal cut)") in second.stderr_file.read_text()
    send(first.url, "q", ["c"], durable=True)  # the first is untouched and goes on
    first.kill()  # the kernel drops the lock with the process
    second.start()
    assert drain(second.url, "q") == ["a", "b", "c"]


def test_old_segments_are_dropped_or_compacted_and_recovery_is_exact(brokers: BrokerFactory) -> None:
    b = brokers("--journal-segment-bytes", str(64 * 1024))
    durable_queue(b, "long")
    durable_queue(b, "busy")
    send(b.url, "long", ["stays"], durable=True)  # pins the first segment...
    body = "x" * 1000
    for round_ in range(6):  # ... while a busy queue fills and empties many segments
        send(b.url, "busy", [f"{round_}-{i}-{body}" for i in range(100)], durable=True)
        assert len(receive(b.url, "busy", 100)) == 100
    events = b.events()
    assert any(e["event"] == "journal.segment.compacted" for e in events)
    assert any(e["event"] == "journal.segment.dropped" for e in events)
    assert len(segments(b)) <= 3
    restart_after_kill(b)
    assert drain(b.url, "long") == ["stays"]
    assert drain(b.url, "busy") == []


def test_segments_whose_big_messages_are_all_live_are_not_compacted(brokers: BrokerFactory) -> None:
    """A backlog of 4 KB messages nobody consumes fills segment after segment, every message live: copying a
    segment forward frees nothing. (A fixed guess of 200 bytes a record took such segments for nearly empty and
    compacted one at every roll-over; the copy filled the next segment, so it went on every pass, forever.)"""
    b = brokers("--journal-segment-bytes", str(64 * 1024))
    durable_queue(b, "backlog")
    bodies = [f"{i}-{'z' * 4000}" for i in range(300)]  # ~1.2 MB: about 20 segments
    for i in range(0, 300, 50):
        send(b.url, "backlog", bodies[i:i + 50], durable=True)
    assert len(segments(b)) >= 10
    time.sleep(1.0)  # passes go on: a storm would show here
    events = b.events()
    assert not [e for e in events if e["event"] == "journal.segment.compacted"]
    restart_after_kill(b)
    assert drain(b.url, "backlog") == bodies


def test_a_segment_whose_one_live_message_is_big_is_not_compacted(brokers: BrokerFactory) -> None:
    """The estimate of a segment's live bytes goes by its queues' mean message size; a queue of many small messages
    and one big one makes it wrong. Compaction counts the bytes it would copy before it writes anything."""
    b = brokers("--journal-segment-bytes", str(64 * 1024))
    durable_queue(b, "mixed")
    big = "big-" + "b" * 60_000
    send(b.url, "mixed", [big], durable=True)  # nearly all of segment 1
    small = [f"small-{i}" for i in range(3000)]  # the following segments
    for i in range(0, 3000, 500):
        send(b.url, "mixed", small[i:i + 500], durable=True)
    assert len(segments(b)) >= 4
    events = b.events()
    assert not [e for e in events if e["event"] == "journal.segment.compacted"], "60 KB copied to free 64 KiB"
    restart_after_kill(b)
    assert receive(b.url, "mixed", 3001) == [big, *small]
    after = [f"after-{i}-{'a' * 1000}" for i in range(100)]
    send(b.url, "mixed", after, durable=True)  # roll-overs: segment 1 is dead now, and dropped
    wait_for(lambda: any(e["event"] == "journal.segment.dropped" and e["segment"] == 1 for e in b.events()), 10,
             what="segment 1 dropped")
    assert drain(b.url, "mixed") == after


def test_a_full_disk_refuses_durable_messages_and_loses_nothing_acknowledged(
    brokers: BrokerFactory, small_disk: Path
) -> None:
    b, ballast = broker_on_a_small_disk(brokers, small_disk)  # the operator frees the ballast later
    durable_queue(b, "full")
    with mgmt(b.url) as m:
        m.call("CREATE", "queue", "memory", {})
    accepted, refused = publish_until_refused(b.url, "full")
    assert refused.remote_state == Delivery.REJECTED
    assert refused.remote.condition.name == "amqp:resource-limit-exceeded"
    assert "disk full" in refused.remote.condition.description
    # the refused message is on no queue: its publisher will send it again, and it must not arrive twice
    assert [int(str(x).split("-")[0]) for x in drain(b.url, "full", browse=True)] == accepted
    send(b.url, "memory", ["non-durable traffic still flows"])  # nothing else is refused
    assert drain(b.url, "memory") == ["non-durable traffic still flows"]
    with mgmt(b.url) as m:
        assert "disk full" in m.call("READ", "broker", "broker").body["journal"]["failed"]
    assert any(e["event"] == "journal.failed" for e in b.events())
    assert len(accepted) > 10
    b.kill()
    brim = fill_up(small_disk, "brim")  # not a byte left: the restarted broker cannot even open a segment
    b.start()  # restarted on a full disk: it starts, serves, and refuses what it cannot journal
    with pytest.raises(SendException):
        send(b.url, "full", [f"x-{'z' * 100_000}"], durable=True)
    with mgmt(b.url) as m:
        assert "journal: " in m.call("READ", "broker", "broker").body["journal"]["failed"]
    # Consumers are served; their consumptions cannot be written yet and are written once there is room (not
    # forgotten: these three must not come back after the restart below)
    assert [int(str(x).split("-")[0]) for x in receive(b.url, "full", 3)] == accepted[:3]
    ballast.unlink()  # the operator frees space
    brim.unlink()
    wait_for(lambda: any(e["event"] == "journal.writable" for e in b.events()), 10,
             what="writes to succeed again once there is room")
    send(b.url, "full", ["after"], durable=True)
    restart_after_kill(b)
    rest = drain(b.url, "full")
    assert [int(str(x).split("-")[0]) for x in rest[:-1]] == accepted[3:] and rest[-1] == "after"


def durable_outcome(url: str, address: str, body: str) -> Delivery:
    """One durable message's delivery, as its publisher sees it (accepted or refused; no resend)."""
    conn = connect(url)
    try:
        d = conn.create_sender(address).link.send(Message(body=body, durable=True))
        conn.wait(lambda: bool(d.remote_state), timeout=10)
    finally:
        conn.close()
    return d


def test_under_min_disk_free_durable_messages_are_refused_until_there_is_room(
    brokers: BrokerFactory, small_disk: Path
) -> None:
    """--min-disk-free (RabbitMQ's disk_free_limit, Artemis' max-disk-usage): while the journal's disk has less
    free space, durable messages are refused before any write fails; non-durable traffic and consumers carry on;
    the broker shows why; once there is room they are taken again, and nothing acknowledged is lost."""
    b = brokers("--min-disk-free", "4M", start=False)
    b.data_dir = small_disk / "data"  # an 8 MiB tmpfs
    b.start()
    durable_queue(b, "q")
    with mgmt(b.url) as m:
        m.call("CREATE", "queue", "memory", {})
        assert m.call("READ", "broker", "broker").body["journal"]["low-disk"] is None
    send(b.url, "q", ["before-0", "before-1"], durable=True)
    ballast = small_disk / "ballast"
    ballast.write_bytes(bytes(5 << 20))  # what else fills the disk: under 4 MiB free
    low = wait_for(lambda: [e for e in b.events() if e["event"] == "journal.disk.low"], 5,
                   what="journal.disk.low within a second or two")
    assert low[0]["limit"] == 4 << 20 and 0 < low[0]["free"] < 4 << 20
    d = durable_outcome(b.url, "q", "while-low")
    assert outcome(d) == (Delivery.REJECTED, "amqp:resource-limit-exceeded")
    assert "free, under --min-disk-free 4.0 MiB: durable messages are refused" in d.remote.condition.description
    send(b.url, "memory", ["non-durable traffic still flows"])
    assert drain(b.url, "memory") == ["non-durable traffic still flows"]
    assert receive(b.url, "q", 1) == ["before-0"]  # consumers are served
    stats = subprocess.run([str(BIN / "ha-admin"), "--broker", b.url, "journal", "stats"], capture_output=True,
                           text=True, timeout=30)
    assert "DISK LOW: the journal's disk has" in " ".join(stats.stdout.split()), stats.stdout + stats.stderr
    assert f"(--min-disk-free {4 << 20:,})" in stats.stdout
    ballast.unlink()
    wait_for(lambda: [e for e in b.events() if e["event"] == "journal.disk.ok"], 5, what="journal.disk.ok")
    send(b.url, "q", ["after"], durable=True)
    restart_after_kill(b)
    assert drain(b.url, "q") == ["before-1", "after"]


def test_a_backup_under_min_disk_free_makes_its_primary_refuse_durable_messages(
    brokers: BrokerFactory, small_disk: Path
) -> None:
    """RabbitMQ's disk alarm is cluster-wide: a backup whose journal disk goes under its --min-disk-free stays in
    the cluster (it journals and acknowledges what it is sent) and tells its primary, which refuses durable
    messages, naming the backup, until the backup has room again or leaves. Non-durable traffic and consumers carry
    on; ha-status and `ha-admin journal stats` on the primary say why."""
    c = Cluster(brokers, 2, ["--min-disk-free", "4M"])
    c[1].data_dir = small_disk / "data"  # the backup's journal on an 8 MiB tmpfs
    c.start_with_primary(0)
    durable_queue(c[0], "q")
    with mgmt(c[0].url) as m:
        m.call("CREATE", "queue", "memory", {})
    before = [f"m{i}" for i in range(50)]
    send(c[0].url, "q", before, durable=True)  # each settled only once the ready backup journaled it
    ballast = small_disk / "ballast"
    ballast.write_bytes(bytes(5 << 20))
    wait_for(lambda: [e for e in c[0].events() if e["event"] == "ha.backup.disk.low"], 10,
             what="the primary told of the backup's low disk")
    d = durable_outcome(c[0].url, "q", "while-low")
    assert outcome(d) == (Delivery.REJECTED, "amqp:resource-limit-exceeded")
    assert d.remote.condition.description.startswith(f"not taken: backup {c[1].name}: the journal's disk has ")
    send(c[0].url, "memory", ["non-durable traffic still flows"])
    assert receive(c[0].url, "q", 1) == ["m0"]  # consumers are served
    st = Cluster.status(c[1])
    assert st["state"] == "ready" and "under --min-disk-free 4.0 MiB" in st["journal_low_disk"]
    assert Cluster.status(c[0])["journal_low_disk"] is None  # the primary's own disk is not low
    assert Cluster.status(c[0])["backups_low_disk"] == [c[1].name]
    assert not [e for e in c[0].events() if e["event"] == "ha.backup.lost"]
    wait_for(lambda: c.queue_bodies(1, "memory") == ["non-durable traffic still flows"]
             and c.queue_bodies(1, "q") == before[1:], 10, what="the backup to go on replicating")
    text = subprocess.run([str(BIN / "ha-status"), "--broker", c[0].url], capture_output=True, text=True, timeout=30)
    flat = " ".join(text.stdout.split())
    assert "DISK LOW: the journal's disk has" in flat and f"DURABLE REFUSED: disk low on backup {c[1].name}" in flat, flat
    stats = subprocess.run([str(BIN / "ha-admin"), "--broker", c[0].url, "journal", "stats"], capture_output=True,
                           text=True, timeout=30)
    assert f"backup {c[1].name} DISK LOW: the journal's disk has" in " ".join(stats.stdout.split()), stats.stdout
    ballast.unlink()
    wait_for(lambda: [e for e in c[0].events() if e["event"] == "ha.backup.disk.ok"], 10, what="ha.backup.disk.ok")
    assert outcome(durable_outcome(c[0].url, "q", "after"))[0] == Delivery.ACCEPTED
    wait_for(lambda: c.queue_bodies(1, "q") == [*before[1:], "after"], 10, what="'after' on the backup")
    ballast.write_bytes(bytes(5 << 20))  # low again; then the backup goes: it no longer holds the primary back
    wait_for(lambda: len([e for e in c[0].events() if e["event"] == "ha.backup.disk.low"]) == 2, 10,
             what="the second report")
    assert outcome(durable_outcome(c[0].url, "q", "refused"))[0] == Delivery.REJECTED
    c[1].kill()
    wait_for(lambda: [e for e in c[0].events() if e["event"] == "ha.backup.lost"], 10, what="ha.backup.lost")
    assert outcome(durable_outcome(c[0].url, "q", "alone"))[0] == Delivery.ACCEPTED
    assert drain(c[0].url, "q") == [*before[1:], "after", "alone"]


def test_a_message_refused_by_a_full_disk_is_on_no_queue_of_the_primary_or_its_backup(
    brokers: BrokerFactory, small_disk: Path
) -> None:
    """A durable message whose journal write failed is refused to its publisher; it was already on its queues (and
    on its way to the backup): it is taken off them again, on the backup too, so that the publisher's resend is
    the only copy anyone receives."""
    c = Cluster(brokers, 2, [])
    c[0].data_dir = small_disk / "data"  # the primary's journal on an 8 MiB tmpfs
    (small_disk / "ballast").write_bytes(b"\0" * (5 * 1024 * 1024))
    c.start_with_primary(0)
    with mgmt(c[0].url) as m:
        m.call("CREATE", "queue", "full", {"arguments": {"durable": True}})
        m.call("CREATE", "queue", "plain", {})
        m.call("CREATE", "exchange", "both", {"exchange-type": "fanout", "arguments": {"durable": True}})
        for q in ("full", "plain"):
            m.call("CREATE", "binding", None, {"source": "both", "destination": q, "binding-key": ""})
    accepted, d = publish_until_refused(c[0].url, "both")
    assert outcome(d) == (Delivery.REJECTED, "amqp:resource-limit-exceeded") and len(accepted) > 10

    def numbers(i: int, queue: str) -> list[int]:
        return [int(str(x).split("-")[0]) for x in c.queue_bodies(i, queue)]

    for queue in ("full", "plain"):  # the durable queue that could not journal it, and the other it was routed to
        assert numbers(0, queue) == accepted, queue
        wait_for(lambda queue=queue: numbers(1, queue) == accepted, 10, what=f"the backup's {queue} as the primary's")


def test_a_transaction_whose_commit_cannot_be_journaled_leaves_nothing_on_its_queue(
    brokers: BrokerFactory, small_disk: Path
) -> None:
    """A transaction stands or falls whole: when the write of its commit fails (the disk is full), the discharge
    is refused and none of its messages may reach a consumer."""
    from tests.support.txn import Txn

    b, _ = broker_on_a_small_disk(brokers, small_disk)
    durable_queue(b, "orders")
    send(b.url, "orders", ["before"], durable=True)
    conn = connect(b.url, timeout=30)
    try:
        sender = conn.create_sender("orders")
        txn = Txn(conn)
        for i in range(4):  # 4 MiB in one commit: more than the disk has left
            txn.send(sender, Message(body=f"{i}-{'t' * (1 << 20)}", durable=True))
        assert txn.commit() == "failed"
        assert "disk full" in txn.condition.description
    finally:
        conn.close()
    assert drain(b.url, "orders", browse=True) == ["before"]
    assert receive(b.url, "orders", 1) == ["before"]
    assert drain(b.url, "orders") == []


def _consume_and_overflow(url: str, queue: str) -> Any:
    """Take the one message of `queue` and accept it in a transaction that also sends 4 MiB of durable messages to
    the queue "overflow" (more than the disk has left): the commit is the journal's first write to fail. Returns
    the failed Txn. (Not to `queue` itself: its consumer, with credit again, would take one of them in the pass of
    the commit, before the write failed, and keep it: docs/durability.md.)"""
    from tests.support.txn import Txn

    conn = connect(url, timeout=30)
    try:
        receiver = conn.create_receiver(queue, credit=1)
        assert receiver.receive(timeout=10).body == "keep"
        sender = conn.create_sender("overflow")
        txn = Txn(conn)
        txn.accept(receiver)
        for i in range(4):
            txn.send(sender, Message(body=f"{i}-{'t' * (1 << 20)}", durable=True))
        assert txn.commit() == "failed"
        return txn
    finally:
        conn.close()


def test_a_commit_whose_write_fails_gives_back_the_message_it_accepted(
    brokers: BrokerFactory, small_disk: Path
) -> None:
    """The journal's first failure falls on a commit's own write (the disk fills up with it): the client is told
    the transaction was rolled back, so the message it accepted must be there for it again, and stay there exactly
    once after a restart. (The accept stood in memory: the message was gone until a restart brought it back.)"""
    b, ballast = broker_on_a_small_disk(brokers, small_disk)
    durable_queue(b, "orders")
    durable_queue(b, "overflow")
    send(b.url, "orders", ["keep"], durable=True)
    txn = _consume_and_overflow(b.url, "orders")
    assert txn.condition.name == "amqp:transaction:rollback" and "disk full" in txn.condition.description
    assert drain(b.url, "orders", browse=True) == ["keep"]  # its accept undone
    assert drain(b.url, "overflow", browse=True) == []  # and none of its messages kept
    conn = connect(b.url)
    try:
        m = conn.create_receiver("orders", credit=1).receive(timeout=10)
        assert (m.body, m.first_acquirer) == ("keep", False) and m.delivery_count >= 1  # released as by a roll back
    finally:
        conn.close()  # not accepted: back again
    ballast.unlink()
    wait_for(lambda: any(e["event"] == "journal.writable" for e in b.events()), 10, what="journal.writable")
    restart_after_kill(b)
    assert drain(b.url, "orders") == ["keep"] and drain(b.url, "overflow") == []


def test_a_commit_whose_write_fails_on_the_primary_leaves_the_message_on_its_backup(
    brokers: BrokerFactory, small_disk: Path
) -> None:
    """The same on a primary: the backup, which had the message acquired, is never sent the dequeue, so the message
    survives a failover (it was gone from the backup for good)."""
    c = Cluster(brokers, 2, [])
    c[0].data_dir = small_disk / "data"  # the primary's journal on an 8 MiB tmpfs
    (small_disk / "ballast").write_bytes(b"\0" * (5 * 1024 * 1024))
    c.start_with_primary(0)
    durable_queue(c[0], "orders")
    durable_queue(c[0], "overflow")
    send(c[0].url, "orders", ["keep"], durable=True)
    txn = _consume_and_overflow(c[0].url, "orders")
    assert txn.condition.name == "amqp:transaction:rollback"
    assert c.queue_bodies(0, "orders") == ["keep"]
    wait_for(lambda: c.queue_bodies(1, "orders") == ["keep"], 10, what="the backup still holding it")
    assert c.queue_bodies(1, "overflow") == []
    c[0].kill()
    c.promote(1)
    c.wait_state(1, "active")
    assert drain(c[1].url, "orders") == ["keep"] and drain(c[1].url, "overflow") == []


def test_a_transaction_that_consumes_while_the_journal_cannot_write_is_rolled_back_and_its_message_kept(
    brokers: BrokerFactory, small_disk: Path
) -> None:
    """While the journal cannot write, a transaction that accepts a durable message is rolled back before any of it
    is applied, as one that publishes one is: its consumer is told why and the message is still there for it. (It
    was applied first: had its commit's write failed too, the accept stood in memory and not on disk while its
    consumer was told the transaction had failed; the message was gone until a restart brought it back.)"""
    from tests.support.txn import Txn

    b, _ = broker_on_a_small_disk(brokers, small_disk)
    durable_queue(b, "orders")
    send(b.url, "orders", ["keep"], durable=True)
    accepted, d = publish_until_refused(b.url, "orders")  # the journal has failed: the disk is full
    assert outcome(d)[1] == "amqp:resource-limit-exceeded"
    conn = connect(b.url, timeout=30)
    try:
        receiver = conn.create_receiver("orders", credit=1)
        assert receiver.receive(timeout=10).body == "keep"
        txn = Txn(conn)
        txn.accept(receiver)
        assert txn.commit() == "failed"
        assert "journal" in txn.condition.description
    finally:
        conn.close()
    assert [str(x).split("-")[0] for x in drain(b.url, "orders", browse=True)] == ["keep", *map(str, accepted)]


def test_the_resend_of_a_message_a_full_disk_refused_is_taken_by_a_duplicate_window(
    brokers: BrokerFactory, small_disk: Path
) -> None:
    """A queue with a duplicate window drops a resend whose id it has seen: the id of a message refused because its
    write failed must not count as seen, or the publisher's resend would be confirmed and stored nowhere."""
    b, ballast = broker_on_a_small_disk(brokers, small_disk)
    durable_queue(b, "orders", **{"duplicate-window": 100_000})
    accepted, d = publish_until_refused(b.url, "orders", ids=True)
    assert outcome(d) == (Delivery.REJECTED, "amqp:resource-limit-exceeded")
    refused = len(accepted)
    ballast.unlink()  # the operator frees space; the publisher sends the refused message again
    wait_for(lambda: any(e["event"] == "journal.writable" for e in b.events()), 10, what="journal.writable")
    send(b.url, "orders", [f"{refused}-again"], id=f"order-{refused}", durable=True)
    restart_after_kill(b)
    got = [str(x) for x in drain(b.url, "orders")]
    assert [int(x.split("-")[0]) for x in got] == [*accepted, refused] and got[-1] == f"{refused}-again"


def test_the_id_of_a_message_that_is_not_durable_outlives_a_restart_only_once_the_message_went(
        brokers: BrokerFactory) -> None:
    """A durable queue's duplicate window was journaled with every id it took: the id of a message that is not
    durable came back after a restart and its message did not, so the publisher's resend (it never had the
    confirmation) was confirmed and dropped as a duplicate of nothing: lost. Such an id is journaled only once its
    message went (consumed here): a resend of that one would deliver it twice."""
    b = brokers()
    durable_queue(b, "orders", **{"duplicate-window": 1000})
    send(b.url, "orders", ["consumed"], id="id-c", durable=False)
    assert receive(b.url, "orders", 1) == ["consumed"]
    send(b.url, "orders", ["kept"], id="id-k", durable=True)
    send(b.url, "orders", ["volatile"], id="id-v", durable=False)
    restart_after_kill(b)
    for body, mid, durable in (("consumed", "id-c", False), ("kept", "id-k", True), ("volatile", "id-v", False)):
        send(b.url, "orders", [body], id=mid, durable=durable)  # the publisher resends all three
    assert drain(b.url, "orders") == ["kept", "volatile"]


def test_a_full_window_comes_back_after_a_restart_with_the_ids_it_held(brokers: BrokerFactory) -> None:
    """The id of a message that is not durable is journaled when the message leaves its queue, after ids taken
    later: recovery puts the ids back in the order they were taken, so that a window at its `duplicate-window`
    count keeps the same ones (here it kept "n" and lost "d", and a resend of "d" was taken twice)."""
    b = brokers()
    durable_queue(b, "orders", **{"duplicate-window": 2})
    send(b.url, "orders", ["n"], id="id-n", durable=False)
    send(b.url, "orders", ["d"], id="id-d", durable=True)
    assert receive(b.url, "orders", 1) == ["n"]  # its id is journaled now, after "d"'s
    send(b.url, "orders", ["e"], id="id-e", durable=True)  # the window: d, e
    restart_after_kill(b)
    send(b.url, "orders", ["d"], id="id-d", durable=True)  # a resend: dropped
    assert drain(b.url, "orders") == ["d", "e"]


def test_positions_of_messages_consumed_since_the_last_checkpoint_are_not_reused_after_a_restart(
        brokers: BrokerFactory) -> None:
    """A queue's next position came back from its last checkpoint and its messages still queued: those enqueued and
    consumed since left only their DEQUEUE records, and their positions were given out again (a backup's catch-up
    and the OCF agent's measure of the store assume they never are)."""
    b = brokers()
    durable_queue(b, "p")
    send(b.url, "p", ["a", "b", "c"], durable=True)
    assert receive(b.url, "p", 3) == ["a", "b", "c"]
    restart_after_kill(b)
    with mgmt(b.url) as m:
        assert m.call("READ", "queue", "p").body["next-position"] == 4


def test_a_failed_delivery_count_survives_a_restart_and_so_does_the_delivery_limit(brokers: BrokerFactory) -> None:
    """The count of failed deliveries was journaled only with the message's first record: after a restart a poison
    message started again from 0 (delivery-count 0 to its consumer, --delivery-limit counting anew)."""
    b = brokers()
    with mgmt(b.url) as m:
        m.call("CREATE", "queue", "dlq", {"arguments": {"durable": True}})
        m.call("CREATE", "exchange", "dlx", {"exchange-type": "fanout", "arguments": {"durable": True}})
        m.call("CREATE", "binding", None, {"source": "dlx", "destination": "dlq", "binding-key": ""})
        m.call("CREATE", "queue", "work", {"arguments": {"durable": True, "delivery-limit": 3,
                                                         "alternate-exchange": "dlx"}})
    send(b.url, "work", ["poison", "fine"], durable=True)

    def fail_first() -> int:
        c = BlockingConnection(b.url, timeout=10)
        try:
            r = c.create_receiver("work", credit=1)
            got = r.receive(timeout=10)
            assert got.body == "poison"
            settle_last(r, Delivery.MODIFIED, failed=True)
            r.close()
            return int(got.delivery_count)
        finally:
            c.close()

    assert [fail_first(), fail_first()] == [0, 1]
    restart_after_kill(b)
    assert fail_first() == 2  # the third failed delivery: the limit is reached
    wait_for(lambda: drain(b.url, "dlq", browse=True) == ["poison"], what="the poison message dead-lettered")
    assert drain(b.url, "work") == ["fine"]


def test_a_count_that_cannot_be_journaled_leaves_the_message_at_its_last_record(
        brokers: BrokerFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """A failed delivery writes the message again (with its count); when that write fails (an I/O error), the
    message must stay where its last record on disk is, and be counted there: else the segment holding it is
    dropped at the next roll-over as if nothing on it were live, and the message is lost at the next start."""
    monkeypatch.setenv("PYTHONPATH", str(ROOT))  # the broker process imports tests.support.journal_plugin
    b = brokers("--journal-segment-bytes", str(64 * 1024), "--plugin", "tests.support.journal_plugin:install")
    durable_queue(b, "q")
    durable_queue(b, "filler")
    send(b.url, "q", ["keep"], durable=True)  # in segment 1

    def segment() -> int:
        with mgmt(b.url) as m:
            return int(m.call("READ", "broker", "broker").body["journal"]["segment"])

    def roll_to(number: int) -> None:
        while segment() < number:
            send(b.url, "filler", [f"{i}-{'y' * 4000}" for i in range(4)], durable=True)
            drain(b.url, "filler")

    roll_to(2)  # segments 1 and 2: nothing compacted yet
    assert segment() == 2
    with mgmt(b.url) as m:
        m.call("BREAK", "test-journal", None)
    c = BlockingConnection(b.url, timeout=10)
    try:
        r = c.create_receiver("q", credit=1)
        assert r.receive(timeout=10).body == "keep"
        settle_last(r, Delivery.MODIFIED, failed=True)  # its record in segment 2 cannot be written
        r.close()
    finally:
        c.close()
    wait_for(lambda: any(e["event"] == "journal.failed" for e in b.events()), 10, what="the write to fail")
    with mgmt(b.url) as m:
        m.call("MEND", "test-journal", None)
    wait_for(lambda: any(e["event"] == "journal.writable" for e in b.events()), 10, what="writes to succeed again")
    roll_to(3)  # segment 1 is dropped here if nothing on it counts as live
    restart_after_kill(b)
    assert drain(b.url, "q") == ["keep"]
