"""The journal tools' rules on hand-made segment files: a verdict agrees with what the broker's own reader does, a
cut keeps every byte (moved aside, never deleted) and leaves exactly the image `check` announced, and a broker
holding the journal is found through /proc and its pid file."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from broker.queue import DURABLE
from broker.store import records as R
from broker.store import tools as T
from broker.store.journal import segment_name
from broker.store.store import read_journal


def segment(n: int, *records: bytes) -> bytes:
    """A format-2 segment (one that only grows: a bad record before its end is damage). Format 3's rules (MARK
    records, zero-filled segments) have their tests in tests/unit/test_journal_prepared.py."""
    return R.HEADER.pack(R.MAGIC, 2, n) + b"".join(records)


def msg(pos: int, body: bytes = b"payload", qid: int = 1) -> bytes:
    return R.enqueue(qid, pos, 0, DURABLE, 0, None, body)


def wiring(qid: int = 1, name: str = "orders", next_position: int = 1) -> bytes:
    return R.queue(qid, name, f"uuid-{qid}", {"durable": True}, next_position)


def write(d: Path, segments: list[bytes]) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    for i, data in enumerate(segments, 1):
        (d / segment_name(i)).write_bytes(data)
    return d


def flip(data: bytes, at: int) -> bytes:
    b = bytearray(data)
    b[at] ^= 0xFF
    return bytes(b)


def three_segments() -> list[bytes]:
    """orders: positions 1-30, ten per segment; 1-5 consumed (the dequeue is in segment 2)."""
    s1 = segment(1, wiring(), *(msg(p, b"m%d" % p) for p in range(1, 11)))
    s2 = segment(2, wiring(next_position=11), *(msg(p, b"m%d" % p) for p in range(11, 21)), R.dequeue(1, 1, 5))
    s3 = segment(3, wiring(next_position=21), *(msg(p, b"m%d" % p) for p in range(21, 31)),
                 R.document(R.STATE, {"epoch": 4, "role": "backup", "state": "ready", "ready_epoch": 4}))
    return [s1, s2, s3]


def offset_of(data: bytes, position: int) -> int:
    return next(r.offset for r in R.scan(data, R.HEADER.size)[0] if r.kind == R.ENQUEUE and r.enqueue()[1] == position)


# ----- one segment -----------------------------------------------------------------------------------------------
def test_a_clean_segment_is_counted_by_kind() -> None:
    data = three_segments()[1]
    s = T.examine(2, data, last=False)
    assert s.status is T.Verdict.CLEAN and s.good == s.size == len(data)
    assert s.kinds == {"queue": 1, "enqueue": 10, "dequeue": 1}
    assert s.message_bytes == sum(len(b"m%d" % p) for p in range(11, 21))


def test_a_torn_record_is_a_torn_tail_only_in_the_last_segment() -> None:
    good = segment(1, wiring(), msg(1))
    torn = good + msg(2)[:9]
    last = T.examine(1, torn, last=True)
    assert last.status is T.Verdict.TORN and (last.good, last.bad_bytes) == (len(good), 9)
    earlier = T.examine(1, torn, last=False)
    assert earlier.status is T.Verdict.DAMAGED and "not the last" in earlier.reason


def test_a_bad_record_with_records_after_it_is_damage_and_what_follows_is_counted() -> None:
    data = segment(1, wiring(), *(msg(p) for p in range(1, 11)), R.dequeue(1, 1, 2))
    bad = offset_of(data, 4)
    s = T.examine(1, flip(data, bad + R.FRAME.size + 5), last=True)
    assert s.status is T.Verdict.DAMAGED and s.good == bad and "fails its CRC" in s.reason
    assert s.kinds == {"queue": 1, "enqueue": 3}
    assert s.beyond == {"enqueue": 6, "dequeue": 1}  # positions 5-10 and the dequeue: lost by a cut


@pytest.mark.parametrize(("data", "last", "status"), [
    (b"", True, T.Verdict.CLEAN),  # created, header never written: nothing to cut
    (R.header(1)[:6], True, T.Verdict.TORN),
    (R.header(1)[:6], False, T.Verdict.DAMAGED),
    (b"XJNL" + R.header(1)[4:], True, T.Verdict.DAMAGED),
    (R.HEADER.pack(R.MAGIC, R.FORMAT + 1, 1) + msg(1), True, T.Verdict.NEWER),
])
def test_headers_are_judged_as_the_broker_judges_them(data: bytes, last: bool, status: T.Verdict) -> None:
    s = T.examine(1, data, last)
    assert s.status is status and s.good == 0


# ----- a directory -----------------------------------------------------------------------------------------------
def test_a_clean_journal_reports_what_the_broker_recovers(tmp_path: Path) -> None:
    d = write(tmp_path / "journal", three_segments())
    ins = T.inspect(d)
    assert ins.verdict is T.Verdict.CLEAN and ins.problem is None and T.plan_cut(ins.segments, None) is None
    doc = T.report(ins)
    [q] = doc["queues"]
    assert (q["name"], q["messages"], q["first"], q["last"], q["next"]) == ("orders", 25, 6, 30, 31)
    assert q["bytes"] == sum(len(b"m%d" % p) for p in range(6, 31))
    assert doc["standing"]["ready_epoch"] == 4
    assert [s["live_messages"] for s in doc["segments"]] == [5, 10, 10]
    assert "verdict: clean" in T.check_lines(doc, "DIR")[-1]


def test_a_torn_tail_is_reported_with_its_place_and_size(tmp_path: Path) -> None:
    segs = three_segments()
    segs[2] += msg(31)[:20]
    d = write(tmp_path / "journal", segs)
    ins = T.inspect(d)
    assert ins.verdict is T.Verdict.TORN and T.plan_cut(ins.segments, ins.problem) is None
    assert ins.problem is not None
    assert (ins.problem.file, ins.problem.offset, ins.problem.bytes) == ("00000003.jnl", len(segs[2]) - 20, 20)
    assert read_journal(d)[1].cut == 20  # the broker agrees
    assert "torn tail: 20 bytes at 00000003.jnl" in T.check_lines(T.report(ins), "DIR")[-1]


def test_a_newer_format_anywhere_is_refused_and_never_cut(tmp_path: Path) -> None:
    segs = three_segments()
    segs[1] = R.HEADER.pack(R.MAGIC, R.FORMAT + 1, 2) + segs[1][R.HEADER.size:]
    ins = T.inspect(write(tmp_path / "journal", segs))
    assert ins.verdict is T.Verdict.NEWER and T.plan_cut(ins.segments, ins.problem) is None


def test_cut_keeps_every_byte_and_leaves_exactly_the_image_check_announced(tmp_path: Path) -> None:
    segs = three_segments()
    bad = offset_of(segs[1], 15)
    segs[1] = flip(segs[1], bad + R.FRAME.size + 3)
    d = write(tmp_path / "journal", segs)
    with pytest.raises(R.JournalError):
        read_journal(d)  # the broker refuses
    ins = T.inspect(d)
    assert ins.verdict is T.Verdict.DAMAGED
    plan = T.plan_cut(ins.segments, ins.problem)
    assert plan is not None
    assert (plan.file, plan.at, plan.moved) == ("00000002.jnl", bad, ("00000003.jnl",))
    assert plan.lost_kinds == {"enqueue": 15, "dequeue": 1, "queue": 1, "state": 1}  # 16-20 and 21-30
    announced = T.summarise(ins.image)
    assert [q["messages"] for q in announced["queues"]] == [14]  # 1-14: the dequeue of 1-5 was after the damage

    cut_dir = T.apply_cut(d, plan, "20260101T000000Z")
    assert cut_dir == d / "cut-20260101T000000Z"
    assert (cut_dir / "00000002.jnl").read_bytes() == segs[1]  # kept whole
    assert (cut_dir / "00000003.jnl").read_bytes() == segs[2]  # moved whole
    assert (d / "00000002.jnl").read_bytes() == segs[1][:bad]
    assert sorted(p.name for p in d.glob("*.jnl")) == ["00000001.jnl", "00000002.jnl"]
    image, rec, _, _ = read_journal(d)  # the broker starts, with what check announced
    assert T.summarise(image) == announced and rec.cut == 0
    assert T.inspect(d).verdict is T.Verdict.CLEAN
    again = T.CutPlan("00000002.jnl", bad, 0, (), 0, {}, "test")  # a second cut in the same second
    assert T.apply_cut(d, again, "20260101T000000Z").name == "cut-20260101T000000Z-2"


def test_a_bad_header_moves_the_whole_segment_aside(tmp_path: Path) -> None:
    segs = three_segments()
    segs[1] = b"XJNL" + segs[1][4:]
    d = write(tmp_path / "journal", segs)
    ins = T.inspect(d)
    plan = T.plan_cut(ins.segments, ins.problem)
    assert plan is not None and plan.at == 0 and plan.cut_bytes == len(segs[1])
    cut_dir = T.apply_cut(d, plan, "t")
    assert sorted(p.name for p in cut_dir.glob("*.jnl")) == ["00000002.jnl", "00000003.jnl"]
    assert [q["messages"] for q in T.summarise(read_journal(d)[0])["queues"]] == [10]


def test_what_a_cut_loses_reads_as_a_sentence_with_or_without_records_after_the_damage() -> None:
    assert T.describe_lost({"enqueue": 3, "queue": 1}) == "the damaged record and 3 enqueue, 1 queue records after it"
    assert T.describe_lost({}) == "the damaged record (no whole record can be read after it)"  # not "no records records"


# ----- who holds the journal -------------------------------------------------------------------------------------
def fake_process(proc: Path, pid: int, cmdline: list[str], open_files: list[Path]) -> None:
    (proc / str(pid) / "fd").mkdir(parents=True)
    (proc / str(pid) / "cmdline").write_bytes(b"\0".join(c.encode() for c in cmdline) + b"\0")
    for i, f in enumerate(open_files, 3):
        os.symlink(f, proc / str(pid) / "fd" / str(i))


def test_a_process_with_a_segment_open_holds_the_journal(tmp_path: Path) -> None:
    d = write(tmp_path / "data" / "journal", three_segments())
    proc = tmp_path / "proc"
    fake_process(proc, 4242, ["python3", "/opt/venv/bin/ha-broker", "--data-dir", "x"], [d / "00000003.jnl"])
    fake_process(proc, 4343, ["vim"], [tmp_path / "elsewhere.txt"])
    held, notes = T.holders(tmp_path / "data", d, proc)
    assert held == ["pid 4242 (python3 /opt/venv/bin/ha-broker --data-dir x) has 00000003.jnl open"]
    assert notes == []


def test_the_pid_file_counts_only_for_a_running_broker(tmp_path: Path) -> None:
    data = tmp_path / "data"
    d = write(data / "journal", three_segments())
    proc = tmp_path / "proc"
    fake_process(proc, 77, ["/usr/bin/ha-broker", "--ha-cluster"], [])
    fake_process(proc, 78, ["/usr/sbin/sshd"], [])
    (data / T.PID_FILE).write_text("77\n")
    held, _ = T.holders(data, d, proc)
    assert held == [f"pid 77 (/usr/bin/ha-broker --ha-cluster) from {data / T.PID_FILE} is running"]
    (data / T.PID_FILE).write_text("78\n")  # the pid was reused after a reboot
    held, notes = T.holders(data, d, proc)
    assert held == [] and "not a broker" in notes[0]
    (data / T.PID_FILE).write_text("79\n")
    held, notes = T.holders(data, d, proc)
    assert held == [] and "not running" in notes[0]


def test_each_verdict_has_its_own_exit_code_and_only_clean_and_torn_start() -> None:
    codes = [T.EXIT_CODE[v] for v in T.Verdict]
    assert len(set(codes)) == len(codes) and not {1, 2} & set(codes)  # 1, 2: ha-admin's refusal and usage
    assert T.EXIT_CODE[T.Verdict.CLEAN] == 0 and set(T.STARTS) == {T.Verdict.CLEAN, T.Verdict.TORN}


def test_the_index_only_replay_counts_what_the_full_replay_holds(tmp_path: Path) -> None:
    segs = three_segments()
    segs[2] += msg(7, b"written again by compaction")  # a later record of a live position stands
    d = write(tmp_path / "journal", segs)
    ins = T.inspect(d)
    assert ins.image.paged  # the tools keep 20 bytes a message, not its body
    assert T.summarise(ins.image) == T.summarise(read_journal(d)[0])
    [q] = T.summarise(ins.image)["queues"]
    assert (q["messages"], q["first"], q["last"]) == (25, 6, 30)


def test_an_unreadable_segment_stops_the_replay_there(tmp_path: Path) -> None:
    segs = three_segments()
    d = write(tmp_path / "journal", segs)
    (d / "00000002.jnl").unlink()
    (d / "00000002.jnl").mkdir()  # reading it fails (as a permission or I/O error would)
    ins = T.inspect(d)
    assert ins.verdict is T.Verdict.UNREADABLE and ins.problem is not None and ins.problem.file == "00000002.jnl"
    assert T.plan_cut(ins.segments, ins.problem) is None
    assert [q["messages"] for q in T.summarise(ins.image)["queues"]] == [10]  # segment 1 only
    assert "verdict: unreadable: 00000002.jnl" in T.check_lines(T.report(ins), "DIR")[-1]


def test_an_empty_journal_is_clean(tmp_path: Path) -> None:
    d = tmp_path / "journal"
    d.mkdir()
    ins = T.inspect(d)
    assert ins.verdict is T.Verdict.CLEAN and ins.segments == []
    assert "an empty journal" in T.check_lines(T.report(ins), "DIR")[-1]


def test_a_journal_directory_that_cannot_be_listed_is_unreadable_not_empty(tmp_path: Path) -> None:
    """The broker does not start on it, and the check says so (it said "clean": an empty journal)."""
    d = tmp_path / "journal"
    d.write_text("not a directory")  # listing fails (as a permission or I/O error would)
    ins = T.inspect(d)
    assert ins.verdict is T.Verdict.UNREADABLE
    assert f"verdict: unreadable: {d}" in T.check_lines(T.report(ins), "DIR")[-1]
    with pytest.raises(R.JournalError, match="cannot list"):
        read_journal(d)
