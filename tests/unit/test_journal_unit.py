"""A committed transaction is on disk whole or not at all: the pass's write that holds it opens with a UNIT record,
and recovery (the broker's scan, `ha-admin journal`, the OCF agent's reading) keeps the unit whole or cuts it all."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from broker.store import records as R
from broker.store.journal import Journal, segment_name
from broker.store.store import Image, read_journal

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "resource_agents"))
import agent_core as core


def msg(pos: int, body: bytes = b"m") -> bytes:
    return R.enqueue(1, pos, 2, 2, 0, None, body)  # flags 2: durable


def unit(*records: bytes) -> bytes:
    body = b"".join(records)
    return R.unit(len(body)) + body


BEFORE = R.queue(1, "q", "u1", {"durable": True}, 1) + msg(1) + msg(2)
COMMIT = unit(msg(3), msg(4), R.dequeue(1, 1, 1))


def test_a_whole_unit_is_replayed_like_any_records() -> None:
    recs, end = R.scan(BEFORE + COMMIT)
    assert not end.torn and not end.damaged and end.good == len(BEFORE + COMMIT)
    assert [R.KINDS[r.kind] for r in recs] == ["queue", "enqueue", "enqueue", "unit", "enqueue", "enqueue", "dequeue"]


@pytest.mark.parametrize("cut", [1, 5, len(msg(4)) + 3, len(COMMIT) - len(R.unit(0)) - 1])
def test_a_unit_cut_short_is_a_torn_tail_cut_at_its_start(cut: int) -> None:
    recs, end = R.scan(BEFORE + COMMIT[:-cut])
    assert end.torn and not end.damaged and end.good == len(BEFORE)
    assert [r.kind for r in recs] == [R.QUEUE, R.ENQUEUE, R.ENQUEUE]  # nothing of the commit, not a prefix of it


def test_a_bad_record_inside_a_unit_at_the_tail_cuts_the_whole_unit() -> None:
    data = bytearray(BEFORE + COMMIT)
    data[-3] ^= 0xFF  # the dequeue, the commit's last record, fails its CRC: a torn write
    recs, end = R.scan(bytes(data))
    assert end.torn and end.good == len(BEFORE) and len(recs) == 3


def test_a_bad_unit_followed_by_more_records_is_damage_not_a_torn_tail() -> None:
    data = bytearray(BEFORE + COMMIT + msg(5))
    data[len(BEFORE) + len(R.unit(0)) + 12] ^= 0xFF
    _, end = R.scan(bytes(data), fmt=2)  # a segment that only grows: damage before the end is damage
    assert end.damaged and not end.torn and end.good == len(BEFORE)
    _, end = R.scan(bytes(data))  # format 3: nothing after it says the unit was on disk: a torn commit
    assert end.torn and not end.damaged and end.good == len(BEFORE)
    proof = R.mark(len(data), len(BEFORE) + len(COMMIT))  # a later commit, written once the unit was on disk
    _, end = R.scan(bytes(data) + proof)
    assert end.damaged and not end.torn and end.good == len(BEFORE)


def test_the_journal_writes_a_unit_over_the_rest_of_the_pass(tmp_path: Path) -> None:
    j = Journal(tmp_path)
    j.open_segment(1)
    j.append(R.queue(1, "q", "u1", {"durable": True}, 1))
    j.append(msg(1))
    j.begin_unit()
    offset = j.size + j.pending_bytes  # where the commit's first message lands (as Store.enqueued computes it)
    j.append(msg(2, b"txn"))
    j.begin_unit()  # a second commit in the same pass: the same unit
    j.append(msg(3, b"txn"))
    j.commit()
    j.append(msg(4))  # a later pass with no commit in it: no unit
    j.commit()
    j.begin_unit()  # a commit that journaled nothing (non-durable): nothing is written
    assert j.commit() is None and j.pending_bytes == 0
    j.close()
    data = (tmp_path / segment_name(1)).read_bytes()
    recs, _ = R.scan(data, R.HEADER.size)
    assert [R.KINDS[r.kind] for r in recs] == ["queue", "enqueue", "unit", "enqueue", "enqueue", "mark", "enqueue",
                                               "mark"]
    assert recs[3].offset == offset  # the reserved UNIT bytes kept the offsets right (paged reads use them)
    assert R.read_enqueue(data, offset, "test")[6] == b"txn"


def test_recovery_and_the_agent_keep_none_of_a_torn_commit(tmp_path: Path) -> None:
    journal = tmp_path / "journal"
    journal.mkdir()
    before = BEFORE + R.mark(R.HEADER.size + len(BEFORE), 0)  # a write ends with its MARK
    (journal / segment_name(1)).write_bytes(R.header(1) + before + COMMIT[:-4])
    image, report, _, size = read_journal(journal)
    # the bytes cut are those of the torn write up to its last one that is not zero (zeros after it are what a
    # segment zero-filled in advance holds anyway)
    assert sorted(image.messages[1]) == [1, 2] and report.cut == len(COMMIT[:-4].rstrip(b"\0"))
    assert size == R.HEADER.size + len(before)
    assert core.read_standing(str(tmp_path), "b1").position == 2  # the agent scores what the broker recovers
    (journal / segment_name(1)).write_bytes(R.header(1) + before + COMMIT + R.mark(R.HEADER.size + len(before)
                                                                                   + len(COMMIT), 0))
    image, report, _, _ = read_journal(journal)
    assert sorted(image.messages[1]) == [2, 3, 4] and report.cut == 0
    assert core.read_standing(str(tmp_path), "b1").position == 4


def test_a_message_of_the_largest_allowed_size_is_a_record_the_reader_takes() -> None:
    """--max-message-size goes up to 1 GiB; the reader refused records above 1 GiB, so a message near the limit was
    journaled and then made the journal 'damaged' at the next start. The frame of the longest one, cut short at the
    end of the last segment, is a torn write (needs more bytes), not an impossible length."""
    from annotated_types import Le

    from broker.config import BrokerConfig

    largest = next(m.le for m in BrokerConfig.model_fields["max_message_size"].metadata if isinstance(m, Le))
    head = R.enqueue(1, 7, 2, 2, 0, None, b"")
    length = len(head) - R.FRAME.size + largest
    assert length <= R.MAX_RECORD
    partial = BEFORE + R.FRAME.pack(length, 0) + head[R.FRAME.size:] + b"x" * 100
    recs, end = R.scan(partial)
    assert end.torn and not end.damaged and end.good == len(BEFORE), end.reason
    assert "needs" in end.reason and len(recs) == 3


def test_a_large_duplicate_window_is_written_as_several_records_that_replay_to_it() -> None:
    items = [(b"S" + bytes([i % 251]) * 1000 + str(i).encode(), 1000.0 + i) for i in range(3000)]  # ~3 MB of ids
    data = R.dedup(4, items, reset=True)
    recs, end = R.scan(data)
    assert not end.torn and not end.damaged and end.good == len(data)
    assert len(recs) == 3 and all(r.kind == R.DEDUP and len(r.payload) <= R.DEDUP_CHUNK + 2048 for r in recs)
    parsed = [(*r.dedup_head(), R.dedup_items(r.payload)) for r in recs]
    assert [(q, reset) for q, reset, _ in parsed] == [(4, True), (4, False), (4, False)]
    assert [i for _, _, ids in parsed for i in ids] == items
    image = Image(1 << 30)  # recovery's replay: the window as it was, none of it trimmed
    for r in R.scan(R.queue(4, "q", "u4", {"duplicate-window": 3000}, 1) + R.dedup(4, items[:5], False) + data)[0]:
        image.apply(r, 1)
    assert image.window(4) == items
    small = R.dedup(4, items[:3], reset=True)
    (one,) = R.scan(small)[0]  # one record, as before
    assert (*one.dedup_head(), R.dedup_items(one.payload)) == (4, True, items[:3])


def test_the_replayed_window_is_the_last_whole_one_and_what_came_after_it() -> None:
    """Every segment starts with a whole window (a checkpoint): recovery keeps the DEDUP records after the last one
    and reads their ids once, at the end (it read every id of every record: a third of a second per restart of a
    broker with a window of 100,000 ids in the chaos soak)."""
    ids = [(f"id-{i}".encode(), float(i)) for i in range(10)]
    data = (R.queue(4, "q", "u4", {"duplicate-window": 4}, 1) + R.dedup(4, ids[:3], True) + R.dedup(4, ids[3:5], False)
            + R.dedup(4, ids[5:7], True) + R.dedup(4, ids[7:10], False))
    image = Image()
    for r in R.scan(data)[0]:
        image.apply(r, 1)
    assert image.window(4) == ids[6:10]  # the last whole one (5, 6) and 7..9, the last 4 of them kept
    assert len(image.window_parts[4]) == 2 and image.window(5) is None
