"""A commit that cannot be written (a full disk, an I/O error, no segment open) hands what had already happened
(consumptions, wiring, the HA standing) to the next commit: a consumed message must not come back after a restart
because its consumption fell in a failed write. The messages the commit brought (refused to their publishers) and
their duplicate-detection ids are dropped, and a transaction's unit fails whole."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from broker.store import records as R
from broker.store.journal import Journal, SegmentFull, segment_name


def msg(pos: int) -> bytes:
    return R.enqueue(1, pos, 2, 2, 0, None, b"m")  # flags 2: durable


def kinds(records: list[bytes]) -> list[str]:
    return [R.KINDS[r[R.FRAME.size]] for r in records]


def written(directory: Path) -> list[str]:
    recs, end = R.scan((directory / segment_name(1)).read_bytes(), R.HEADER.size)
    assert not end.torn and not end.damaged
    return [R.KINDS[r.kind] for r in recs]


def a_pass(j: Journal) -> None:
    j.append(R.queue(1, "q", "u1", {"durable": True}, 1))
    j.append(msg(1))
    j.append(R.dequeue(1, 1, 1))
    j.append(R.dedup(1, [(b"id-1", 1.0)], False))
    j.append(R.document(R.BIND, {"exchange": "x", "queue": "q", "key": "k"}))
    j.append(R.document(R.STATE, {"epoch": 2}))


def test_with_no_segment_open_the_next_commit_writes_the_consumptions_and_the_wiring(tmp_path: Path) -> None:
    j = Journal(tmp_path)
    a_pass(j)
    with pytest.raises(R.JournalError, match="no segment open"):
        j.commit()
    assert kinds(j.pending) == ["queue", "dequeue", "bind", "state"]
    assert j.pending_bytes == sum(len(r) for r in j.pending)
    j.open_segment(1)
    j.append(msg(2))
    assert j.commit() is not None
    j.close()
    assert written(tmp_path) == ["queue", "dequeue", "bind", "state", "enqueue", "mark"]


def test_a_failed_write_keeps_them_too_and_writes_nothing(tmp_path: Path) -> None:
    j = Journal(tmp_path)
    j.open_segment(1)
    j.commit()
    size = (tmp_path / segment_name(1)).stat().st_size
    good, j.fd = j.fd, os.open(tmp_path / segment_name(1), os.O_RDONLY)  # every write fails (EBADF)
    a_pass(j)
    with pytest.raises(R.JournalError, match="write failed"):
        j.commit()
    assert (tmp_path / segment_name(1)).stat().st_size == size
    assert kinds(j.pending) == ["queue", "dequeue", "bind", "state"]
    os.close(j.fd)
    j.fd = good
    assert j.commit() is not None
    j.close()
    assert written(tmp_path)[-5:] == ["queue", "dequeue", "bind", "state", "mark"]


def test_a_failed_transaction_unit_keeps_nothing(tmp_path: Path) -> None:
    j = Journal(tmp_path)
    j.begin_unit()
    a_pass(j)
    with pytest.raises(R.JournalError):
        j.commit()
    assert j.pending == [] and j.pending_bytes == 0


def test_a_failed_unit_keeps_what_came_before_it_and_what_earlier_failed_writes_carried(tmp_path: Path) -> None:
    """A durable queue declared while the disk was full, then a transaction's unit that fails too: the queue's
    record is still written with the next commit (else its messages taken later are not recovered)."""
    j = Journal(tmp_path)
    a_pass(j)
    with pytest.raises(R.JournalError, match="no segment open"):
        j.commit()  # carried: queue, dequeue, bind, state
    j.append(R.dequeue(1, 5, 5))  # earlier in the pass than the transaction
    j.begin_unit()
    j.append(msg(7))
    j.append(R.dequeue(1, 6, 6))
    with pytest.raises(R.JournalError, match="no segment open"):
        j.commit()
    assert kinds(j.pending) == ["queue", "dequeue", "bind", "state", "dequeue"]
    assert j.pending_bytes == sum(len(r) for r in j.pending)


def test_two_failed_units_of_a_pass_keep_what_came_between_and_after_them(tmp_path: Path) -> None:
    """Two commits in one pass are two units: another consumer's dequeue and a queue declared between or after
    them are carried to the next write, not dropped with the units (one unit spanned from the first commit to the
    end of the pass)."""
    j = Journal(tmp_path)
    a_pass(j)
    with pytest.raises(R.JournalError, match="no segment open"):
        j.commit()  # carried: queue, dequeue, bind, state
    for _ in range(2):
        j.begin_unit()
        j.append(msg(7))
        j.append(R.dequeue(1, 6, 6))
        j.end_unit()
        j.append(R.dequeue(2, 9, 9))  # between and after the commits
    j.begin_unit()  # a commit that journaled nothing: no unit
    j.end_unit()
    with pytest.raises(R.JournalError, match="no segment open"):
        j.commit()
    assert kinds(j.pending) == ["queue", "dequeue", "bind", "state", "dequeue", "dequeue"]
    assert j.pending_bytes == sum(len(r) for r in j.pending)


def test_two_units_of_a_pass_are_written_and_read_back_each_whole(tmp_path: Path) -> None:
    j = Journal(tmp_path)
    j.open_segment(1)
    for p in (1, 2):
        j.begin_unit()
        j.append(msg(p))
        j.end_unit()
        j.append(R.dequeue(2, 9, 9))
    assert j.commit() is not None
    j.close()
    assert written(tmp_path)[-7:] == ["unit", "enqueue", "dequeue", "unit", "enqueue", "dequeue", "mark"]


def test_a_commit_that_would_take_its_segment_past_the_locations_offsets_is_not_written(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A message's location keeps its offset in 32 bits (`segment << 32 | offset`): a commit that would take its
    segment past that (a pass gathering gigabytes of durable messages) writes nothing, keeps what a failed commit
    keeps, and asks for a new segment, where the next commit fits."""
    j = Journal(tmp_path)
    j.open_segment(1)
    j.commit()
    size = (tmp_path / segment_name(1)).stat().st_size
    monkeypatch.setattr(R, "LOC_OFFSET", size + 250)  # the 4 GiB, scaled down: room for the kept records alone
    a_pass(j)
    assert not j.full()
    with pytest.raises(SegmentFull, match=r"past the 4 GiB a segment may hold") as refused:
        j.commit()
    assert refused.value.condition == "amqp:resource-limit-exceeded"
    assert (tmp_path / segment_name(1)).stat().st_size == size
    assert kinds(j.pending) == ["queue", "dequeue", "bind", "state"]
    assert j.full()
    j.open_segment(2)
    assert not j.full()
    assert j.commit() is not None
    j.close()
    recs, _ = R.scan((tmp_path / segment_name(2)).read_bytes(), R.HEADER.size)
    assert [R.KINDS[r.kind] for r in recs] == ["queue", "dequeue", "bind", "state", "mark"]
