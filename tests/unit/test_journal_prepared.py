"""Format 3: segments zero-filled in advance, and a MARK ending every commit. A torn commit may leave later pages
written and earlier ones zero; recovery cuts it (and everything after it) unless a later intact MARK says its bytes
were already on disk when that later commit was written, which makes it damage. Zeros after the last record are the
clean end of a segment."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from broker.store import records as R
from broker.store import tools as T
from broker.store.journal import PREPARED, Journal, Syncer, segment_name
from broker.store.store import read_journal

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "resource_agents"))
import agent_core as core

QUEUE = R.queue(1, "q", "u1", {"durable": True}, 1)


def msg(pos: int) -> bytes:
    return R.enqueue(1, pos, 2, 2, 0, None, b"body-%d" % pos)


class Segment:
    """Commits laid out as the journal writes them: records, then a MARK with the bytes known to be on disk."""

    def __init__(self) -> None:
        self.data = bytearray(R.header(1))
        self.starts: list[int] = []

    def commit(self, durable: int, *records: bytes) -> int:
        self.starts.append(len(self.data))
        body = b"".join(records)
        self.data += body + R.mark(len(self.data) + len(body), durable)
        return len(self.data)


def four_commits() -> tuple[Segment, list[int]]:
    """c1, c2 each synced before the next was written; c3 and c4 written in one sync window (neither on disk)."""
    s = Segment()
    e1 = s.commit(0, QUEUE, msg(1), msg(2))
    e2 = s.commit(e1, msg(3), msg(4))
    e3 = s.commit(e2, msg(5), msg(6))
    e4 = s.commit(e2, msg(7), R.dequeue(1, 1, 1))
    return s, [e1, e2, e3, e4]


def recover(tmp_path: Path, data: bytes) -> tuple[list[int], int]:
    d = tmp_path / "journal"
    d.mkdir(exist_ok=True)
    (d / segment_name(1)).write_bytes(data)
    image, report, _, size = read_journal(d)
    return sorted(image.messages.get(1, {})), report.cut if size else -1


def test_zeros_after_the_last_commit_are_the_clean_end_of_a_segment(tmp_path: Path) -> None:
    s, ends = four_commits()
    data = bytes(s.data) + bytes(200_000)
    recs, end = R.scan(data, R.HEADER.size)
    assert (end.good, end.torn, end.damaged, end.tail) == (ends[-1], False, False, 0)
    assert [R.KINDS[r.kind] for r in recs].count("mark") == 4
    assert recover(tmp_path, data) == ([2, 3, 4, 5, 6, 7], 0)
    assert core.read_standing(str(tmp_path), "b1").position == 7  # the agent reads zeros as the end too


@pytest.mark.parametrize("at", [0, 1, 5_000, (1 << 20) - 1, 1 << 20, (1 << 20) + 1, 3 << 20])
def test_the_end_of_the_data_is_found_wherever_the_zeros_after_it_begin(at: int) -> None:
    """The end of a segment's data is found by comparing whole steps of it with zeros from the file's end: a byte
    anywhere, at a step's edge or inside one, ends the data there."""
    data = bytearray(4 << 20)
    data[:10] = b"0123456789"
    if at:
        data[len(data) - at] = 7
    assert R.nonzero_end(memoryview(bytes(data)), 10) == (len(data) - at + 1 if at else 10)
    assert R.nonzero_end(memoryview(bytes(data)), 0) == (len(data) - at + 1 if at else 10)


def test_a_commit_torn_with_later_pages_written_is_cut_with_everything_after_it(tmp_path: Path) -> None:
    s, ends = four_commits()
    data = bytearray(s.data) + bytes(100_000)
    c3 = s.starts[2]
    data[c3 : c3 + 20] = bytes(20)  # c3's first page never reached the disk; c4 (a later page) did
    _, end = R.scan(bytes(data), R.HEADER.size)
    assert (end.good, end.torn, end.damaged, end.tail) == (ends[1], True, False, ends[3] - c3)
    messages, cut = recover(tmp_path, bytes(data))
    assert messages == [1, 2, 3, 4] and cut == ends[3] - c3  # c4 is intact but after the tear: cut too
    assert core.read_standing(str(tmp_path), "b1").position == 4


def test_a_write_whose_mark_never_reached_the_disk_is_cut_whole(tmp_path: Path) -> None:
    """c4's last page (its MARK) stayed zero: its records read as whole, then zeros, which looked like the clean end
    of the segment, and c4's message and dequeue were kept though c4 was never confirmed. Nothing of a write counts
    until its MARK is read."""
    s, ends = four_commits()
    data = bytes(s.data[: ends[3] - R.MARK_SIZE]) + bytes(100_000)
    _, end = R.scan(data, R.HEADER.size)
    assert (end.good, end.torn, end.committed) == (ends[3] - R.MARK_SIZE, False, ends[2])  # the scan's own view
    end = R.last_end(end, R.HEADER.size, R.FORMAT)
    assert (end.good, end.torn, end.damaged, end.tail) == (ends[2], True, False, ends[3] - R.MARK_SIZE - ends[2])
    assert "no mark" in end.reason
    assert recover(tmp_path, data) == ([1, 2, 3, 4, 5, 6], ends[3] - R.MARK_SIZE - ends[2])
    assert core.read_standing(str(tmp_path), "b1").position == 6  # the agent does not count position 7 either
    seg = T.examine(1, data, last=True)
    assert seg.status is T.Verdict.TORN and seg.good == ends[2] and seg.kinds["enqueue"] == 6
    assert T.examine(1, data, last=False).status is T.Verdict.CLEAN  # an earlier segment keeps them (older releases)


def test_a_message_is_never_kept_without_the_dedup_record_of_its_id(tmp_path: Path) -> None:
    """A pass's write holds its messages, then the ids they added to duplicate windows: a tear inside the ids kept
    the message and lost its id (a resend was then taken twice). The write is cut whole: neither is kept."""
    s, ends = four_commits()
    ids = R.dedup(1, [(b"id-8", 1.0)], False)
    e5 = s.commit(ends[3], msg(8), ids)
    whole = bytes(s.data) + bytes(10_000)
    d = tmp_path / "journal"
    d.mkdir()
    (d / segment_name(1)).write_bytes(whole)
    image = read_journal(d)[0]
    assert 8 in image.messages[1] and image.window(1) == [(b"id-8", 1.0)]
    torn = bytearray(whole)
    torn[e5 - R.MARK_SIZE - 3] ^= 0xFF  # the id's record fails its CRC
    (d / segment_name(1)).write_bytes(bytes(torn))
    image, report, _, size = read_journal(d)
    assert 8 not in image.messages[1] and image.window(1) is None and size == ends[3]
    assert report.cut == e5 - ends[3] and "where its write begins" in report.cut_reason
    assert core.read_standing(str(tmp_path), "b1").position == 7


def test_damage_a_later_commit_saw_on_disk_is_damage_not_a_tear(tmp_path: Path) -> None:
    s, _ = four_commits()
    data = bytearray(s.data) + bytes(100_000)
    data[s.starts[1] + 12] ^= 0xFF  # inside c2, which was on disk when c3 and c4 were written (their MARKs say so)
    _, end = R.scan(bytes(data), R.HEADER.size)
    assert end.damaged and not end.torn and end.good == s.starts[1]
    assert "a later commit says it was already on disk" in end.reason
    with pytest.raises(R.JournalError, match=r"journal damaged in 00000001\.jnl"):
        recover(tmp_path, bytes(data))


def test_a_cut_for_damage_starts_where_the_damaged_write_begins(tmp_path: Path) -> None:
    """A cut at the bad record left the whole records before it in its write without their MARK; the segment, now
    the last, lost them at the broker's next start (a torn tail that `check` had not announced). The cut starts
    where that write begins, and the broker recovers what `check` said it would."""
    s, ends = four_commits()
    data = bytearray(s.data) + bytes(10_000)
    bad = s.starts[1] + len(msg(3))  # message 4, the second record of c2, which c3's MARK says was on disk
    data[bad + 12] ^= 0xFF
    d = tmp_path / "journal"
    d.mkdir()
    (d / segment_name(1)).write_bytes(bytes(data))
    ins = T.inspect(d)
    plan = T.plan_cut(ins.segments, ins.problem)
    assert ins.verdict is T.Verdict.DAMAGED and plan is not None and plan.at == ends[0]
    assert plan.lost_kinds == {"enqueue": 4, "mark": 3, "dequeue": 1}  # 3 (before the bad one), 5, 6, 7
    assert "where the write holding it begins" in plan.reason
    T.apply_cut(d, plan, "20260101T000000Z")
    image, report, _, _ = read_journal(d)
    assert report.cut == 0 and sorted(image.messages[1]) == [1, 2]
    assert T.inspect(d).verdict is T.Verdict.CLEAN


def test_the_standing_of_a_stopped_broker_is_that_of_its_last_whole_write(tmp_path: Path) -> None:
    """`ha-admin` reads the HA standing of a broker that is down from its journal: a STATE record in a write whose
    MARK never reached the disk is cut by the broker, and not read as its standing either."""
    s = Segment()
    s.commit(0, QUEUE, R.document(R.STATE, {"epoch": 3, "role": "primary"}))
    torn = R.document(R.STATE, {"epoch": 4, "role": "primary"})
    d = tmp_path / "journal"
    d.mkdir()
    (d / segment_name(1)).write_bytes(bytes(s.data) + torn + bytes(1000))
    assert T.last_state(d) == {"epoch": 3, "role": "primary"}
    (d / segment_name(1)).write_bytes(bytes(s.data) + torn + R.mark(len(s.data) + len(torn), 0))
    assert T.last_state(d) == {"epoch": 4, "role": "primary"}


def test_damage_in_the_last_commits_no_sync_covered_reads_as_a_tear() -> None:
    s, ends = four_commits()
    data = bytearray(s.data)
    data[s.starts[2] + 12] ^= 0xFF  # c3: no later MARK says it was on disk (c4 was written before c3's sync)
    _, end = R.scan(bytes(data), R.HEADER.size)
    assert end.torn and end.good == ends[1]


def test_a_mark_inside_a_message_body_proves_nothing() -> None:
    s, ends = four_commits()
    forged = R.enqueue(1, 8, 2, 2, 0, None, R.mark(0, 1 << 40))  # a client's body holding a MARK's bytes
    s.commit(ends[1], forged)
    data = bytearray(s.data)
    data[s.starts[2] + 12] ^= 0xFF
    _, end = R.scan(bytes(data), R.HEADER.size)
    assert end.torn and not end.damaged  # its offset does not match where it lies: not a commit's MARK


def test_a_zero_filled_last_segment_whose_header_never_reached_the_disk_is_dropped_not_refused(tmp_path: Path) -> None:
    s, ends = four_commits()
    d = tmp_path / "journal"
    d.mkdir()
    (d / segment_name(1)).write_bytes(bytes(s.data[: ends[1]]))
    orphan = bytearray(64 * 1024)  # taken from the preparer, header and first commit written, crash before any sync:
    orphan[5000:5100] = b"x" * 100  # only a later page reached the disk
    (d / segment_name(2)).write_bytes(bytes(orphan))
    image, report, numbers, size = read_journal(d)
    assert numbers == [1, 2] and size == 0 and report.cut == 5100 and "never written" in report.cut_reason
    assert sorted(image.messages[1]) == [1, 2, 3, 4]
    assert core.read_standing(str(tmp_path), "b1").position == 4
    seg = T.examine(2, bytes(orphan), last=True)
    assert seg.status is T.Verdict.TORN and seg.bad_bytes == 5100
    assert T.examine(2, bytes(orphan), last=False).status is T.Verdict.DAMAGED  # not the last: damage


def test_a_rolled_over_segment_is_closed_once_what_named_it_is_synced(tmp_path: Path) -> None:
    j = Journal(tmp_path, segment_size=64 * 1024)
    j.open_segment(1)
    j.append(msg(1))
    t = j.commit()  # no syncer thread: synced on the spot
    first = j.fd
    j.open_segment(2)  # everything named it is synced: closed at once
    with pytest.raises(OSError):
        os.fstat(first)
    j.syncer = Syncer(lambda t: None, lambda t, e: None)  # a syncer that never runs: requests stay outstanding
    j.append(R.enqueue(1, 2, 2, 2, 0, None, bytes(8000)))  # too big to be synced on the spot
    t = j.commit()
    assert t is not None and j.synced < t
    second = j.fd
    j.open_segment(3)  # synced here (the roll-over's own fdatasync), but the syncer may still hold the fd
    os.fstat(second)
    j.mark_synced(t)
    with pytest.raises(OSError):
        os.fstat(second)
    j.syncer = None
    j.close()


def wait_until(cond: object, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not cond():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_the_journal_rolls_over_to_a_prepared_segment_and_marks_what_was_on_disk(tmp_path: Path) -> None:
    synced: list[int] = []
    j = Journal(tmp_path, segment_size=64 * 1024)
    j.start(synced.append, lambda t, e: None)
    j.open_segment(1)
    assert not j.prealloc and not j.full()
    j.append(QUEUE)
    pos = 0
    while j.size < 40 * 1024:  # past half a segment: the preparer is asked for the next one
        for _ in range(50):
            pos += 1
            j.append(msg(pos))
        j.mark_synced(j.commit() or 0)  # as if each commit was synced before the next
    wait_until(lambda: j.full())  # a segment that grows gives way as soon as a prepared one is ready
    assert (tmp_path / PREPARED).stat().st_size == 64 * 1024
    j.open_segment(2)
    assert j.prealloc and not (tmp_path / PREPARED).exists()
    assert (tmp_path / segment_name(2)).stat().st_size == 64 * 1024  # written into, not grown
    for i in range(1, 4):
        j.append(msg(pos + i))
        j.commit()  # small, nothing in flight: synced on the spot (no deferring without an event loop)
    j.close()
    data = (tmp_path / segment_name(2)).read_bytes()
    recs, end = R.scan(data, R.HEADER.size)
    assert not end.torn and not end.damaged and len(data) == 64 * 1024
    marks = [(r.offset, *R._MARK.unpack_from(r.payload)[1:]) for r in recs if r.kind == R.MARK]
    assert all(offset == at for offset, at, _ in marks)  # each says where it lies
    assert [durable for _, _, durable in marks] == [0] + [at + R.MARK_SIZE for _, at, _ in marks[:-1]]
    image, report, numbers, _ = read_journal(tmp_path)
    assert numbers == [1, 2] and report.cut == 0 and sorted(image.messages[1]) == list(range(1, pos + 4))


def test_an_id_written_twice_counts_once_before_the_window_is_cut_to_its_count(tmp_path: Path) -> None:
    """A write that failed has its window's ids written again with the next one, so an id may be in the journal
    twice: the window comes back with the last `duplicate-window` distinct ids (here b was cut for the second c and
    d, and a resend of b would have been taken twice)."""
    s = Segment()
    s.commit(0, R.queue(1, "q", "u1", {"durable": True, "duplicate-window": 4}, 1),
             R.dedup(1, [(b"Sa", 1.0), (b"Sb", 2.0), (b"Sc", 3.0), (b"Sd", 4.0)], True))
    s.commit(0, R.dedup(1, [(b"Sc", 3.0), (b"Sd", 4.0), (b"Se", 5.0)], False))
    d = tmp_path / "journal"
    d.mkdir()
    (d / segment_name(1)).write_bytes(bytes(s.data))
    assert read_journal(d)[0].window(1) == [(b"Sb", 2.0), (b"Sc", 3.0), (b"Sd", 4.0), (b"Se", 5.0)]
