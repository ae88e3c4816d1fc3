"""`ha-admin journal check|stats|cut` on the journals of real brokers: check reports exactly what a SIGKILLed broker
recovers (queues, messages, bytes, wiring, HA standing); damage in the middle of a segment stops the broker, check
names the place, cut sets aside what follows and the broker then serves every message from before the damage; a
torn tail is only reported; a wrong directory is a usage error."""

from __future__ import annotations

import hashlib
import json
import struct
import subprocess
from pathlib import Path
from typing import Any

from proton import Message

from broker.store import records as R
from tests.support.amqp import drain, mgmt, receive, send
from tests.support.cluster import Cluster
from tests.support.disks import fill_up
from tests.support.procs import BIN, BrokerFactory, BrokerProcess, wait_for


def admin(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / "ha-admin"), *args], capture_output=True, text=True, timeout=60, input=stdin)


def snapshot(d: Path) -> dict[str, tuple[int, int, str]]:
    """Every file and directory under `d`: size, modification time and content digest; not the data directory's
    lock file (`cut` takes the lock, and writes its pid there, before it decides anything)."""
    out = {}
    for p in sorted(d.rglob("*")):
        if p == d / "lock":
            continue
        st = p.stat()
        digest = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
        out[str(p.relative_to(d))] = (st.st_size, st.st_mtime_ns, digest)
    return out


def read_only(data_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`ha-admin ARGS` that must not change a byte, a name or a time under `data_dir` (check, stats)."""
    before = snapshot(data_dir)
    r = admin(*args)
    assert snapshot(data_dir) == before, f"ha-admin {' '.join(args)} changed {data_dir}"
    return r


def check(b: BrokerProcess, *extra: str) -> subprocess.CompletedProcess[str]:
    return read_only(b.data_dir, "journal", "check", "--data-dir", str(b.data_dir), *extra)


def offline_stats(b: BrokerProcess) -> tuple[int, dict[str, Any]]:
    r = read_only(b.data_dir, "journal", "stats", "--data-dir", str(b.data_dir), "--json")
    return r.returncode, json.loads(r.stdout) if r.returncode == 0 else {}


def check_json(b: BrokerProcess) -> tuple[int, dict[str, Any]]:
    r = check(b, "--json")
    return r.returncode, json.loads(r.stdout)


def segments(b: BrokerProcess) -> list[Path]:
    return sorted((b.data_dir / "journal").glob("*.jnl"))


def durable_queue(b: BrokerProcess, name: str) -> None:
    with mgmt(b.url) as m:
        m.call("CREATE", "queue", name, {"arguments": {"durable": True}})


def test_check_after_a_kill_reports_exactly_what_the_broker_recovers(brokers: BrokerFactory) -> None:
    c = Cluster(brokers, 1, [])
    c.start_with_primary(0)  # a one-broker cluster: the journal holds its HA standing too
    b = c[0]
    durable_queue(b, "orders")
    durable_queue(b, "audit")
    with mgmt(b.url) as m:
        m.call("CREATE", "queue", "scratch", {})
        m.call("CREATE", "exchange", "events", {"exchange-type": "topic", "arguments": {"durable": True}})
        m.call("CREATE", "binding", None, {"source": "events", "destination": "audit", "binding-key": "a.#"})
    send(b.url, "orders", [f"order {i}" for i in range(1, 121)], durable=True)
    assert receive(b.url, "orders", 20) == [f"order {i}" for i in range(1, 21)]
    send(b.url, "audit", [{"n": i, "blob": "z" * i} for i in range(30)], durable=True)
    send(b.url, "scratch", ["not kept"] * 5, durable=True)  # a non-durable queue: never on disk
    with mgmt(b.url) as m:
        live = {q: m.call("READ", "queue", q).body for q in ("orders", "audit")}
    status = subprocess.run([str(BIN / "ha-status"), "--broker", b.url, "-f", "json"], capture_output=True,
                            text=True, timeout=30)
    assert json.loads(status.stdout)["members"][0]["journal_failed"] is None  # writing: nothing to show
    b.kill()

    rc, doc = check_json(b)
    assert rc == 0 and doc["verdict"] == "clean" and doc["problem"] is None
    queues = {q["name"]: q for q in doc["queues"]}
    assert set(queues) == {"orders", "audit"}
    for name, q in queues.items():
        assert (q["messages"], q["bytes"]) == (live[name]["depth"], live[name]["bytes"])
    assert (queues["orders"]["first"], queues["orders"]["last"], queues["orders"]["next"]) == (21, 120, 121)
    assert doc["exchanges"] == [{"name": "events", "type": "topic", "arguments": {"durable": True}}]
    assert doc["bindings"] == [{"exchange": "events", "queue": "audit", "key": "a.#"}]
    st = doc["standing"]
    assert (st["epoch"], st["role"], st["state"], st["ready_epoch"]) == (1, "primary", "active", 1)
    assert sum(s["live_messages"] for s in doc["segments"]) == 130

    text = check(b)
    assert text.returncode == 0
    assert "orders: 100 messages" in text.stdout and "audit: 30 messages" in text.stdout
    assert "HA standing: epoch 1, role primary, state active, ready_epoch 1" in text.stdout
    assert text.stdout.rstrip().splitlines()[-1].startswith("verdict: clean")
    rc, st = offline_stats(b)
    assert rc == 0 and (st["verdict"], st["messages"], st["durable-queues"]) == ("clean", 130, 2)
    assert st["bytes"] == doc["bytes"] and st["disk_bytes"] == sum(p.stat().st_size for p in segments(b))

    b.start()  # the broker recovers what check reported, to the byte
    recovered = next(e for e in b.events(since_start=True) if e["event"] == "journal.recovered")
    assert (recovered["messages"], recovered["bytes"]) == (doc["messages"], doc["bytes"]) == (130, sum(
        q["bytes"] for q in live.values()))


def numbered(data: bytes) -> int:
    """The number a journaled message of the damage test carries."""
    m = Message()
    m.decode(data)
    return int(str(m.body).split("-")[0])


def test_damage_in_a_middle_segment_is_named_cut_and_every_message_before_it_is_served(
    brokers: BrokerFactory,
) -> None:
    b = brokers("--journal-segment-bytes", str(64 * 1024))
    durable_queue(b, "d")
    sent = [f"{i}-{'x' * 1000}" for i in range(250)]
    send(b.url, "d", sent, durable=True)
    b.kill()
    segs = segments(b)
    assert len(segs) >= 4
    victim = segs[1]  # neither the first nor the last segment
    data = bytearray(victim.read_bytes())
    enqueues = [r for r in R.scan(data, R.HEADER.size)[0] if r.kind == R.ENQUEUE]
    rec = enqueues[len(enqueues) // 2]
    first_lost = numbered(rec.enqueue()[6])
    data[rec.offset + R.FRAME.size + 40] ^= 0xFF  # a bit rot in the middle of a record
    victim.write_bytes(bytes(data))
    after = {p.name: p.read_bytes() for p in segs if p.name > victim.name}

    proc = b.start(wait=False).proc
    assert proc is not None and proc.wait(30) == 2  # the broker refuses to start
    assert f"journal damaged in {victim.name} at byte {rec.offset}" in b.stderr_file.read_text()

    r = check(b)
    assert r.returncode == 4
    assert f"verdict: damaged: {victim.name} at byte {rec.offset:,}: record at byte {rec.offset} fails its CRC" \
        in r.stdout
    assert f"d: {first_lost} messages" in r.stdout  # what the broker serves after the cut
    rc, doc = check_json(b)
    assert rc == 4 and doc["problem"]["file"] == victim.name and doc["problem"]["offset"] == rec.offset
    assert doc["cut"]["moved"] == sorted(after)
    assert doc["cut"]["lost_kinds"]["enqueue"] == len(sent) - first_lost - 1  # the bad record is not counted
    assert offline_stats(b)[1]["verdict"] == "damaged"

    asking = subprocess.Popen([str(BIN / "ha-admin"), "journal", "cut", "--data-dir", str(b.data_dir)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lock = b.data_dir / "lock"
    wait_for(lambda: lock.read_text().strip() == str(asking.pid), timeout=30)  # the cut holds the data dir ...
    proc = b.start(wait=False).proc  # ... so a broker started meanwhile refuses to
    assert proc is not None and proc.wait(30) == 2
    assert f"in use by another process, pid {asking.pid}" in b.stderr_file.read_text()
    asking.communicate("n\n", timeout=60)
    assert asking.returncode == 1 and victim.read_bytes() == bytes(data)  # asked, declined, nothing changed

    cut = admin("journal", "cut", "--data-dir", str(b.data_dir), "--yes")
    assert cut.returncode == 0, cut.stderr
    assert f"cut {victim.name} at byte {rec.offset:,}" in cut.stdout and "the journal is clean" in cut.stdout
    [kept] = (b.data_dir / "journal").glob("cut-*")
    assert (kept / victim.name).read_bytes() == bytes(data)  # nothing destroyed: the damaged segment whole ...
    assert {name: (kept / name).read_bytes() for name in after} == after  # ... and every later one
    assert victim.stat().st_size == rec.offset

    b.start()
    refused = admin("journal", "cut", "--data-dir", str(b.data_dir), "--yes")
    assert refused.returncode == 1 and "refusing to cut: a broker holds" in refused.stderr
    assert b.proc is not None and f"(pid {b.proc.pid} holds {b.data_dir / 'lock'})" in refused.stderr
    assert drain(b.url, "d") == sent[:first_lost]


def test_a_torn_tail_is_reported_and_left_to_the_broker(brokers: BrokerFactory) -> None:
    b = brokers()
    durable_queue(b, "t")
    send(b.url, "t", list(range(10)), durable=True)
    stats = admin("--broker", b.url, "journal", "stats", "--json")  # online, from the running broker
    assert stats.returncode == 0, stats.stderr
    st = json.loads(stats.stdout)
    assert st["segments"] >= 1 and st["durable-queues"] == 1 and st["written"] > 0 and st["commits"] > 0
    assert st["failed"] is None and st["broker"] == b.name
    assert "state           writable" in admin("--broker", b.url, "journal", "stats").stdout
    b.kill()
    last = segments(b)[-1]
    good = last.stat().st_size
    record = R.enqueue(1, 999, 0, 2, 0, None, b"\x00\x53\x77\xa1\x04torn")
    with last.open("ab") as f:
        f.write(record[:15])  # a crash in the middle of a write
    r = check(b)
    assert r.returncode == 3  # the broker starts with it: it cuts the tail itself
    torn = len(record[:15].rstrip(b"\0"))  # zeros at its end are not told from a zero-filled segment's rest
    assert f"verdict: torn tail: {torn} bytes at {last.name} byte {good:,}" in r.stdout
    assert "t: 10 messages" in r.stdout
    cut = admin("journal", "cut", "--data-dir", str(b.data_dir), "--yes")
    assert cut.returncode == 0 and "nothing to cut: only a torn tail" in cut.stdout
    assert last.stat().st_size == good + 15  # left to the broker
    rc, offline = offline_stats(b)
    assert (rc, offline["verdict"], offline["messages"]) == (0, "torn", 10)
    b.start()
    assert [e["bytes"] for e in b.events(since_start=True) if e["event"] == "journal.torn_tail"] == [torn]
    assert drain(b.url, "t") == list(range(10))


def test_a_newer_format_segment_is_refused_by_check_and_left_alone_by_cut(brokers: BrokerFactory) -> None:
    b = brokers("--journal-segment-bytes", str(64 * 1024))
    durable_queue(b, "n")
    send(b.url, "n", [f"{i}-{'x' * 1000}" for i in range(150)], durable=True)
    b.kill()
    segs = segments(b)
    assert len(segs) >= 3
    newer = segs[1]
    data = bytearray(newer.read_bytes())
    struct.pack_into(">H", data, 4, R.FORMAT + 1)  # as a later release would write it
    newer.write_bytes(bytes(data))

    r = check(b)
    assert r.returncode == 5, r.stdout + r.stderr
    assert (f"verdict: newer format: {newer.name}: journal format {R.FORMAT + 1} is newer than this broker's "
            f"({R.FORMAT})") in r.stdout
    rc, doc = check_json(b)
    assert (rc, doc["verdict"], doc["problem"]["file"]) == (5, "newer-format", newer.name) and "cut" not in doc
    cut = read_only(b.data_dir, "journal", "cut", "--data-dir", str(b.data_dir), "--yes")
    assert cut.returncode == 5 and "refusing to cut: verdict: newer format" in cut.stderr
    assert not list((b.data_dir / "journal").glob("cut-*"))
    proc = b.start(wait=False).proc  # the broker agrees
    assert proc is not None and proc.wait(30) == 2
    assert f"journal format {R.FORMAT + 1} is newer" in b.stderr_file.read_text()


def test_a_missing_or_wrong_directory_is_a_usage_error(tmp_path: Path, brokers: BrokerFactory) -> None:
    for cmd in ("check", "cut", "stats"):
        r = admin("journal", cmd, "--data-dir", str(tmp_path / "nowhere"))
        assert r.returncode == 2 and f"{tmp_path / 'nowhere'}: no such directory" in r.stderr, (cmd, r.stderr)
    (tmp_path / "afile").write_text("x")
    r = admin("journal", "check", "--data-dir", str(tmp_path / "afile"))
    assert r.returncode == 2 and "not a directory" in r.stderr
    (tmp_path / "empty").mkdir()
    for cmd in ("check", "cut", "stats"):
        r = read_only(tmp_path / "empty", "journal", cmd, "--data-dir", str(tmp_path / "empty"))
        assert r.returncode == 2 and "holds no journal" in r.stderr, (cmd, r.stderr)
    r = admin("journal", "check")
    assert r.returncode == 2 and "--data-dir" in r.stderr  # required
    b = brokers("--no-journal")
    r = admin("--broker", b.url, "journal", "stats")
    assert r.returncode == 1 and "keeps no journal" in r.stderr


def test_an_empty_journal_directory_is_clean_and_the_broker_starts_empty(tmp_path: Path,
                                                                          brokers: BrokerFactory) -> None:
    b = brokers(start=False)
    (b.data_dir / "journal").mkdir(parents=True)
    r = check(b)
    assert r.returncode == 0 and "0 segments" in r.stdout and "an empty journal" in r.stdout
    assert offline_stats(b) == (0, {"journal": str(b.data_dir / "journal"), "verdict": "clean", "disk_bytes": 0,
                                    "messages": 0, "bytes": 0, "segments": 0, "durable-queues": 0})
    b.start()
    with mgmt(b.url) as m:
        assert m.call("READ", "broker", "broker").body["journal"]["durable-queues"] == 0


BIG = "z" * 20_000  # more than a page: a full tmpfs has no room for it


def ha_status(b: BrokerProcess, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / "ha-status"), "--broker", b.url, *args], capture_output=True, text=True,
                          timeout=30)


def member(b: BrokerProcess, name: str) -> dict[str, Any]:
    r = ha_status(b, "-f", "json")
    assert r.returncode == 0, r.stderr
    rows: list[dict[str, Any]] = json.loads(r.stdout)["members"]
    return next(m for m in rows if m["name"] == name)


def test_ha_status_shows_a_backup_whose_disk_is_full_until_it_can_write_again(
    brokers: BrokerFactory, small_disk: Path
) -> None:
    c = Cluster(brokers, 2, [])
    c[1].data_dir = small_disk / "data"  # the backup's journal is on the small disk
    c.start_with_primary(0)
    primary, backup = c[0], c[1]
    durable_queue(primary, "q")
    send(primary.url, "q", ["before 1", "before 2"], durable=True)
    assert member(primary, "b2")["journal_failed"] is None
    ballast = fill_up(small_disk)

    send(primary.url, "q", [f"during {i} {BIG}" for i in range(5)], durable=True)  # it carries on without it
    wait_for(lambda: any(e["event"] == "journal.failed" for e in backup.events()), 20,
             what="the backup's journal to fail")
    wait_for(lambda: any(e["event"] == "ha.backup.lost" for e in primary.events()), 20,
             what="the primary to let the backup go")
    row = member(primary, "b2")
    assert "disk full" in row["journal_failed"], row
    text = ha_status(primary).stdout
    b2 = next(line for line in text.splitlines() if line.lstrip("│ ").startswith("b2"))
    assert "JOURNAL CANNOT WRITE: journal: disk full" in b2
    assert member(primary, "b1")["journal_failed"] is None
    stats = admin("--broker", backup.url, "journal", "stats")
    assert stats.returncode == 0 and "FAILED: journal: disk full" in stats.stdout

    ballast.unlink()  # the operator frees space: the backup writes again, comes back and catches up
    wait_for(lambda: any(e["event"] == "journal.writable" for e in backup.events()), 20,
             what="the backup's journal to write again")
    c.wait_state(1, "ready", timeout=30)
    assert member(primary, "b2")["journal_failed"] is None
    assert "JOURNAL CANNOT WRITE" not in ha_status(primary).stdout
    expected = ["before 1", "before 2", *(f"during {i} {BIG}" for i in range(5))]
    wait_for(lambda: c.queue_bodies(1, "q") == expected, 20, what="the backup to catch up")
