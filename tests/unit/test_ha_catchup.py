"""Catch-up plans and their progress, including the proof that catch-up cannot chase live traffic forever."""

from __future__ import annotations

from collections.abc import Callable

from hypothesis import given, settings
from hypothesis import strategies as st

from ha.core.catchup import BackupCatchup, CatchupPlan, QueueCatchup, plan_catchup
from ha.core.idset import PositionSet

pos_sets = st.sets(st.integers(min_value=1, max_value=60)).map(PositionSet)


def test_plan_dequeues_skips_and_sends_newest_first() -> None:
    held = PositionSet.from_ranges([(1, 5), (9, 9)])
    primary = PositionSet.from_ranges([(4, 10)])
    plan = plan_catchup(primary, held)
    assert list(plan.dequeues) == [1, 2, 3]
    assert list(plan.skip) == [4, 5, 9]
    assert list(plan.send_order()) == [10, 8, 7, 6]
    assert plan.snapshot_max == 10


def test_plan_accepts_plain_lists() -> None:
    plan = plan_catchup([3, 1, 2], [])
    assert list(plan.send_order()) == [3, 2, 1] and not plan.dequeues and not plan.skip


def test_empty_primary_queue_dequeues_everything_held() -> None:
    plan = plan_catchup(PositionSet(), PositionSet([1, 2]))
    assert list(plan.dequeues) == [1, 2] and plan.snapshot_max == 0
    assert QueueCatchup(plan).done


@given(pos_sets, pos_sets)
def test_plan_partitions_held_and_primary(primary: PositionSet, held: PositionSet) -> None:
    plan = plan_catchup(primary, held)
    assert plan.dequeues | plan.skip == held
    assert plan.skip | plan.to_send == primary
    assert not (plan.dequeues & primary) and not (plan.to_send & held)


def test_positions_reused_after_a_failover_are_replaced() -> None:
    """The backup got 101-102 from the old primary; the promoted one never had them and reassigned 101 onwards."""
    held = PositionSet.from_ranges([(1, 102)])
    primary = PositionSet.from_ranges([(50, 105)])
    plan = plan_catchup(primary, held, reused_from=101)
    assert list(plan.dequeues) == [*range(1, 50), 101, 102]
    assert list(plan.skip) == list(range(50, 101))
    assert list(plan.send_order()) == [105, 104, 103, 102, 101]
    # Without the epoch information the stale 101-102 would wrongly be skipped.
    assert 101 in plan_catchup(primary, held).skip


def run(
    tracker: QueueCatchup,
    primary: PositionSet,
    *,
    live_per_step: int,
    consumed_per_step: int,
    batch: int,
    max_steps: int,
    after_send: Callable[[list[int]], None] | None = None,
) -> int:
    """Drive one catch-up step by step: producers append, consumers take from the front, the primary sends a batch
    and the backup acknowledges it. Returns the number of steps until done (or max_steps + 1 if never)."""
    next_pos = (primary.max() if primary else 0) + 1
    for step in range(1, max_steps + 1):
        for _ in range(live_per_step):
            primary.add(next_pos)
            next_pos += 1
        for _ in range(min(consumed_per_step, len(primary))):
            front = primary.min()
            primary.discard(front)
            tracker.dequeued([front])
        sent = tracker.next_batch(batch)
        assert all(p in primary for p in sent), "sent a message the primary no longer has"
        if after_send is not None:
            after_send(sent)
        tracker.acked(sent)
        if tracker.done:
            return step
    return max_steps + 1


def test_catchup_ends_within_its_initial_size_while_producers_outrun_it() -> None:
    """Boundedness: N live messages arrive for every single message sent, yet catch-up ends in <= |initial| steps."""
    n = 500
    primary = PositionSet.from_ranges([(1, n)])
    tracker = QueueCatchup(plan_catchup(primary, PositionSet()))
    steps = run(tracker, primary, live_per_step=n, consumed_per_step=0, batch=1, max_steps=10 * n)
    assert steps == n
    assert len(primary) == n + n * n, "the live traffic really did arrive"
    assert tracker.progress().fraction == 1.0 and tracker.progress().sent == n


def test_a_plan_that_chases_live_traffic_would_never_end() -> None:
    """The same harness detects an unbounded scheme: adding live messages to the plan never finishes."""
    n = 50
    primary = PositionSet.from_ranges([(1, n)])
    tracker = QueueCatchup(plan_catchup(primary, PositionSet()))

    def chase(_: list[int]) -> None:  # a naive updater that also sends whatever arrived meanwhile
        tracker._pending.update(PositionSet.from_ranges([(tracker.plan.snapshot_max + 1, primary.max())]))
        object.__setattr__(tracker.plan, "snapshot_max", primary.max())

    steps = run(
        tracker, primary, live_per_step=2, consumed_per_step=0, batch=1, max_steps=20 * n, after_send=chase
    )
    assert steps > 20 * n


@settings(max_examples=60, deadline=None)
@given(
    initial=st.integers(min_value=0, max_value=120),
    held=st.sets(st.integers(min_value=1, max_value=150)),
    live=st.integers(min_value=0, max_value=20),
    consumed=st.integers(min_value=0, max_value=5),
    batch=st.integers(min_value=1, max_value=7),
)
def test_catchup_is_bounded_for_any_traffic(
    initial: int, held: set[int], live: int, consumed: int, batch: int
) -> None:
    primary = PositionSet.from_ranges([(1, initial)]) if initial else PositionSet()
    plan = plan_catchup(primary, PositionSet(held))
    total = len(plan.to_send)
    tracker = QueueCatchup(plan)
    if total == 0:
        assert tracker.done
        return
    steps = run(
        tracker, primary, live_per_step=live, consumed_per_step=consumed, batch=batch, max_steps=total
    )
    assert steps <= -(-total // batch)
    p = tracker.progress()
    assert p.sent + p.dropped == total and p.fraction == 1.0


def test_consumers_shorten_catchup() -> None:
    n = 100
    primary = PositionSet.from_ranges([(1, n)])
    tracker = QueueCatchup(plan_catchup(primary, PositionSet()))
    steps = run(tracker, primary, live_per_step=1, consumed_per_step=3, batch=1, max_steps=n)
    assert steps == 25  # sends 100, 99, ... while consumers eat 1, 2, 3, ...: they meet at a quarter
    p = tracker.progress()
    assert (p.sent, p.dropped) == (25, 75)


def plan_of(n: int) -> CatchupPlan:
    return plan_catchup(PositionSet.from_ranges([(1, n)]), PositionSet())


def test_batches_go_back_to_front_and_progress_counts() -> None:
    tracker = QueueCatchup(plan_of(10))
    assert tracker.next_batch(4) == [10, 9, 8, 7]
    assert tracker.in_flight == 4 and not tracker.done
    assert tracker.acked([9, 10]) == 2
    p = tracker.progress()
    assert (p.total, p.sent, p.acked, p.remaining, p.fraction) == (10, 4, 2, 6, 0.2)
    assert tracker.next_batch(100) == [6, 5, 4, 3, 2, 1]
    assert tracker.next_batch(5) == []
    tracker.acked(PositionSet.from_ranges([(1, 8)]))
    assert tracker.done and tracker.progress().fraction == 1.0


def test_odd_orders_are_ignored_and_counted_never_crash() -> None:
    tracker = QueueCatchup(plan_of(5))
    assert tracker.acked([3]) == 0  # acknowledged before it was sent
    assert tracker.acked([99]) == 0  # a live position: not catch-up's business, not counted
    assert tracker.ignored_acks == 1
    assert tracker.next_batch(2) == [5, 4]
    assert tracker.acked([5]) == 1
    assert tracker.acked([5]) == 0  # repeated
    assert tracker.ignored_acks == 2
    tracker.dequeued([4])  # in flight, dequeued on the primary before the backup acknowledged it
    tracker.dequeued([1, 2, 3, 77])  # never sent: leaves the plan; 77 is live and unknown
    assert tracker.done
    p = tracker.progress()
    assert (p.acked, p.dropped, p.dequeued_in_flight, p.fraction) == (1, 3, 1, 1.0)
    assert tracker.acked([4]) == 0  # late acknowledgement of the dequeued one


def test_junk_acknowledgements_are_counted() -> None:
    tracker = QueueCatchup(plan_of(3))
    tracker.next_batch(3)
    assert tracker.acked([0, "x", None, 3]) == 1
    assert tracker.ignored_acks == 3


def test_backup_is_ready_only_when_every_expected_queue_caught_up() -> None:
    backup = BackupCatchup(["a", "b"])
    assert not backup.ready and backup.waiting_for() == ["a", "b"]
    ta = backup.start("a", plan_of(2))
    backup.start("b", plan_catchup([], []))  # an empty queue is caught up at once
    backup.expect("c")
    assert backup.waiting_for() == ["a", "c"]
    ta.acked(ta.next_batch(2))
    assert backup.waiting_for() == ["c"]
    backup.forget("c")
    assert backup.ready
    assert backup.progress().total == 2 and backup.progress().fraction == 1.0
