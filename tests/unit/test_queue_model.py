"""The lean queue against a plain model: whatever the order of enqueues (live at the back, catch-up at the front,
gap fills), acquisitions, releases and dequeues, it hands out and lists exactly what the model says."""

from __future__ import annotations

from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from broker.options import QueueOptions
from broker.queue import ACQUIRED, AVAILABLE, DequeueReason, Entry, Queue


class QueueMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.levels = 3
        self.q = Queue("q", {}, QueueOptions(priority_levels=self.levels))
        self.model: dict[int, dict[str, Any]] = {}  # position -> {"state", "level", "data"}
        self.held: dict[int, Entry] = {}  # acquired by "consumers"
        self.next = 1_000  # live positions start high so catch-up has room below

    # ----- enqueues ------------------------------------------------------------------------------------------------
    @rule(level=st.integers(0, 2), size=st.integers(0, 20))
    def enqueue_live(self, level: int, size: int) -> None:
        pos = max(self.next, self.q.next_position)
        data = bytes(size)
        self.q.enqueue_replica(pos, data, level, 0, 0, None)
        self.model[pos] = {"state": AVAILABLE, "level": level, "data": data}
        self.next = pos + 1

    @rule(levels=st.lists(st.integers(0, 4), min_size=1, max_size=8), gaps=st.lists(st.integers(1, 3), min_size=8,
                                                                                      max_size=8))
    def append_live_batch(self, levels: list[int], gaps: list[int]) -> None:
        """A backup's live batch applied in one go (`append_replicas`), positions ascending with gaps."""
        pos = max(self.next, self.q.next_position)
        records = []
        for level, gap in zip(levels, gaps, strict=False):
            records.append((pos, level, 0, 0, 0.0, bytes([level])))
            self.model[pos] = {"state": AVAILABLE, "level": min(level, self.levels - 1), "data": bytes([level])}
            pos += gap
        assert self.q.append_replicas(records) == (records[0][0], records[-1][0])
        self.next = records[-1][0] + 1

    @rule(level=st.integers(0, 2), offset=st.integers(1, 999))
    def enqueue_anywhere_below(self, level: int, offset: int) -> None:
        pos = self.next - offset
        if pos < 1 or pos in self.model:
            return
        self.q.enqueue_replica(pos, b"x", level, 0, 0, None)
        self.model[pos] = {"state": AVAILABLE, "level": level, "data": b"x"}

    @rule(level=st.integers(0, 2))
    def enqueue_at_the_front(self, level: int) -> None:
        lowest = min(self.model, default=self.next)
        pos = lowest - 1
        if pos < 1 or pos in self.model:
            return
        self.q.enqueue_replica(pos, b"f", level, 0, 0, None)
        self.model[pos] = {"state": AVAILABLE, "level": level, "data": b"f"}

    @rule(priority=st.integers(0, 9))
    def enqueue_client(self, priority: int) -> None:
        e = self.q.enqueue(b"client", priority)
        assert e.position not in self.model
        self.model[e.position] = {"state": AVAILABLE, "level": self.q.level_of(priority), "data": b"client"}
        self.next = max(self.next, e.position + 1)

    # ----- consumers -----------------------------------------------------------------------------------------------
    @rule()
    def acquire(self) -> None:
        avail = [(-m["level"], p) for p, m in self.model.items() if m["state"] == AVAILABLE]
        e = self.q.acquire_next(now=0.0)
        if not avail:
            assert e is None
            return
        want = min(avail)[1]
        assert e is not None and e.position == want, (e, want)
        self.model[want]["state"] = ACQUIRED
        self.held[want] = e

    @precondition(lambda self: self.held)
    @rule(data=st.data(), failed=st.booleans())
    def release(self, data: st.DataObject, failed: bool) -> None:
        pos = data.draw(st.sampled_from(sorted(self.held)))
        self.q.release(self.held.pop(pos), delivery_failed=failed)
        self.model[pos]["state"] = AVAILABLE

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def accept(self, data: st.DataObject) -> None:
        pos = data.draw(st.sampled_from(sorted(self.held)))
        self.q.dequeue(self.held.pop(pos), DequeueReason.ACCEPTED)
        del self.model[pos]

    @precondition(lambda self: self.model)
    @rule(data=st.data(), width=st.integers(0, 30))
    def dequeue_range(self, data: st.DataObject, width: int) -> None:
        lo = data.draw(st.sampled_from(sorted(self.model)))
        n = self.q.dequeue_range(lo, lo + width, DequeueReason.REPLICATED)
        gone = [p for p in self.model if lo <= p <= lo + width]
        assert n == len(gone)
        for p in gone:
            del self.model[p]
            self.held.pop(p, None)

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def browse(self, data: st.DataObject) -> None:
        cursor = data.draw(st.integers(0, self.next))
        e = self.q.browse_after(cursor, now=0.0)
        want = min((p for p, m in self.model.items() if p > cursor and m["state"] == AVAILABLE), default=None)
        assert (e.position if e else None) == want

    # ----- what must always hold -------------------------------------------------------------------------------
    @invariant()
    def lists_exactly_the_model(self) -> None:
        assert list(self.q.positions()) == sorted(self.model)
        assert [p for lo, hi in self.q.position_ranges() for p in range(lo, hi + 1)] == sorted(self.model)
        assert self.q.depth == len(self.model)
        assert self.q.acquired_count == sum(1 for m in self.model.values() if m["state"] == ACQUIRED)
        assert self.q.bytes == sum(len(m["data"]) for m in self.model.values())
        assert self.q.has_available() == any(m["state"] == AVAILABLE for m in self.model.values())

    @invariant()
    def positions_after_agree(self) -> None:
        if self.model:
            mid = sorted(self.model)[len(self.model) // 2]
            assert list(self.q.positions_after(mid)) == sorted(p for p in self.model if p > mid)


QueueMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=60, deadline=None)
TestQueueModel = QueueMachine.TestCase


def test_a_million_fifo_messages_leave_no_dead_weight() -> None:
    """Enqueue/acquire/accept in FIFO order keeps the spine trimmed (the lean layout's point)."""
    q = Queue("fifo", {}, QueueOptions())
    for _ in range(200_000):
        q.enqueue(b"m")
        e = q.acquire_next(now=0.0)
        assert e is not None
        q.dequeue(e)
    assert q.depth == 0 and len(q._spine) - q._head == 0


def test_catch_up_newest_first_goes_to_the_front_in_order() -> None:
    q = Queue("c", {}, QueueOptions())
    for pos in range(5001, 5011):  # live traffic first
        q.enqueue_replica(pos, b"live", 0, 0, 0, None)
    for pos in range(5000, 0, -1):  # then catch-up, newest first
        q.enqueue_replica(pos, b"old", 0, 0, 0, None)
    assert list(q.positions()) == list(range(1, 5011))
    assert q._extra is None  # all at the front: no sorted side list needed
    assert [q.acquire_next(now=0.0).position for _ in range(3)] == [1, 2, 3]  # type: ignore[union-attr]


def test_a_batch_that_is_not_a_run_at_the_back_is_left_whole() -> None:
    """`append_replicas` applies nothing (the caller goes one by one) unless every record is a plain enqueue above
    the queue's positions, ascending."""
    q = Queue("r", {}, QueueOptions())
    q.enqueue_replica(10, b"ten", 0, 0, 0, None)
    e = (11, 0, 0, 0, 0.0, b"x")
    for records in ([(10, 0, 0, 0, 0.0, b"x")],  # not above what the queue holds
                    [e, (11, 0, 0, 0, 0.0, b"y")],  # a position twice
                    [(13, 0, 0, 0, 0.0, b"x"), (12, 0, 0, 0, 0.0, b"y")],  # descending (catch-up)
                    [e, (12, 0, 16, 0, 0.0, b"y")],  # a flag that needs more than an insert (HELD)
                    [e, (12, 13)]):  # a dequeue range
        assert q.append_replicas(records) is None
        assert sorted(q.entries) == [10] and q.next_position == 11 and q.bytes == 3
    assert q.append_replicas([e, (12, 0, 1, 2, 0.0, b"yy")]) == (11, 12)
    assert [q.acquire_next().position for _ in range(3)] == [10, 11, 12]  # type: ignore[union-attr]
    assert q.entries[12].count == 2 and q.bytes == 6 and q.next_position == 13
