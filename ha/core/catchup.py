"""Catch-up of one queue for one backup: the plan and its progress.

When a replicating browser opens, the backup announces the positions it already holds. The primary compares them
with the positions on its queue at that moment (the *snapshot*):

- ``dequeues`` = held - primary: the backup must drop these (sent first, as dequeue events);
- ``skip``     = held & primary: both hold them, nothing to send;
- ``to_send``  = primary - held: sent newest first (back of the queue towards the front, the seed's "live update").

Live traffic after the snapshot (positions above ``snapshot_max``) streams separately and is not part of the plan.
The backup inserts catch-up messages in position order among what it holds (a push at the front when it held
nothing below), and appends live messages at the back.

Why it is bounded: ``to_send`` is fixed at the snapshot and only ever shrinks (a send or a dequeue on the primary
removes a position; live enqueues never add one), so catch-up ends after at most ``len(to_send)`` sends whatever
producers do, and consumers taking from the front only shorten it.

Positions reused after a failover: if the backup's epoch is older than the primary's, positions it holds from
``reused_from`` upwards may name different messages on the new primary (they were sent by the old primary but never
reached the promoted broker, which then assigned them again). Pass ``reused_from`` = the first position assigned in
the oldest epoch newer than the backup's; such held positions are dequeued and, if the primary has them, re-sent.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ha.core.idset import PositionSet, as_position_set, valid_positions


@dataclass(frozen=True)
class CatchupPlan:
    """What the primary sends a backup for one queue. The sets are owned by the plan: do not mutate them."""

    dequeues: PositionSet
    skip: PositionSet
    to_send: PositionSet
    # Highest position on the primary queue at the snapshot (0 if empty); live traffic is above it.
    snapshot_max: int

    def send_order(self) -> Iterable[int]:
        """Positions to send, newest first."""
        return reversed(self.to_send)


def plan_catchup(
    primary: Iterable[int], held: Iterable[int], *, reused_from: int | None = None
) -> CatchupPlan:
    """Compute the plan from the primary queue's positions and the backup's held positions.

    ``primary`` and ``held`` may be PositionSets (O(ranges)) or any iterable of ints.
    """
    prim = as_position_set(primary)
    mine = as_position_set(held)
    stale = PositionSet()
    if reused_from is not None and mine and mine.max() >= reused_from:
        stale = mine.intersection(PositionSet.from_ranges([(reused_from, mine.max())]))
        mine = mine.difference(stale)
    dequeues = mine.difference(prim).union(stale)
    skip = mine.intersection(prim)
    to_send = prim.difference(mine)
    return CatchupPlan(dequeues=dequeues, skip=skip, to_send=to_send, snapshot_max=prim.max() if prim else 0)


@dataclass(frozen=True)
class Progress:
    """For ``ha-status`` progress bars and the ``ha.catchup.end`` event."""

    total: int  # messages to send at the start (len(plan.to_send))
    sent: int  # sent so far
    acked: int  # sent and acknowledged by the backup
    dropped: int  # never sent because the primary dequeued them first (consumers helped)
    dequeued_in_flight: int  # sent, then dequeued on the primary before the backup acknowledged them

    @property
    def remaining(self) -> int:
        """Still to send."""
        return self.total - self.sent - self.dropped

    @property
    def fraction(self) -> float:
        """Share of the plan that is finished (acknowledged or no longer needed); 1.0 for an empty plan."""
        if self.total == 0:
            return 1.0
        return (self.acked + self.dropped + self.dequeued_in_flight) / self.total


class QueueCatchup:
    """Progress of one (queue, backup) catch-up on the primary.

    Feed it: ``next_batch`` (what to send now), ``acked`` (backup settled those), ``dequeued`` (primary dequeued
    those). Positions above ``snapshot_max`` (live traffic) are ignored by every method. Unknown or repeated
    acknowledgements are ignored and counted in ``ignored_acks``; nothing here raises on peer input.
    """

    def __init__(self, plan: CatchupPlan) -> None:
        self.plan = plan
        self._pending = plan.to_send.copy()  # not yet sent
        self._unacked = PositionSet()  # sent, not yet acknowledged
        self._total = len(plan.to_send)
        self._sent = 0
        self._acked = 0
        self._dropped = 0
        self._dequeued_in_flight = 0
        self.ignored_acks = 0

    @property
    def done(self) -> bool:
        """Nothing left to send and everything sent acknowledged (or dequeued on the primary)."""
        return not self._pending and not self._unacked

    @property
    def in_flight(self) -> int:
        """Sent and not yet acknowledged: counts against the backup's replication credit."""
        return len(self._unacked)

    def progress(self) -> Progress:
        return Progress(
            total=self._total,
            sent=self._sent,
            acked=self._acked,
            dropped=self._dropped,
            dequeued_in_flight=self._dequeued_in_flight,
        )

    def next_batch(self, limit: int) -> list[int]:
        """Take up to ``limit`` positions to send now, newest first; they become in flight."""
        if limit < 0:
            raise ValueError(f"limit must be >= 0, got {limit}")
        batch: list[int] = []
        while len(batch) < limit and self._pending:
            lo, hi = self._pending.last_range()
            take = min(limit - len(batch), hi - lo + 1)
            first = hi - take + 1
            batch.extend(range(hi, first - 1, -1))
            self._pending.discard_range(first, hi)
            self._unacked.add_range(first, hi)
        self._sent += len(batch)
        return batch

    def give_back(self, positions: Iterable[int]) -> None:
        """Positions from ``next_batch`` that were not sent after all: they are to send again (newest first)."""
        back = as_position_set(positions).intersection(self._unacked)
        self._unacked.difference_update(back)
        self._pending = self._pending.union(back)
        self._sent -= len(back)

    def acked(self, positions: Iterable[object]) -> int:
        """The backup acknowledged ``positions``; returns how many were in flight (the rest is counted as ignored,
        except live positions, which are the guards' business)."""
        got, junk = valid_positions(positions)
        live = self._live_part(got)
        known = got.intersection(self._unacked)
        self._unacked.difference_update(known)
        self._acked += len(known)
        self.ignored_acks += len(got) - len(known) - live + junk
        return len(known)

    def dequeued(self, positions: Iterable[int]) -> PositionSet:
        """The primary dequeued ``positions``: not yet sent ones leave the plan (returned); in-flight ones stop
        waiting.

        The backup learns of the dequeue through the ordinary dequeue events, so an in-flight message that is
        dequeued no longer has to be acknowledged for catch-up to finish.
        """
        got = as_position_set(positions)
        unsent = got.intersection(self._pending)
        self._pending.difference_update(unsent)
        self._dropped += len(unsent)
        in_flight = got.intersection(self._unacked)
        self._unacked.difference_update(in_flight)
        self._dequeued_in_flight += len(in_flight)
        return unsent

    def _live_part(self, positions: PositionSet) -> int:
        if not positions or positions.max() <= self.plan.snapshot_max:
            return 0
        lo = self.plan.snapshot_max + 1
        return len(positions.intersection(PositionSet.from_ranges([(lo, positions.max())])))


class BackupCatchup:
    """Every queue's catch-up for one backup; ``ready`` decides the ``catchup`` -> ``ready`` transition.

    Order that makes "ready" safe: make the backup a guard (``GuardBook.add_backup``) *before* taking any queue's
    snapshot. Then every message settled to a client is either guarded by this backup or was on its queue at the
    snapshot (so in the plan), and "every expected queue's catch-up is done" means the backup holds all of them.
    """

    def __init__(self, queues: Iterable[str] = ()) -> None:
        self._expected: set[str] = set(queues)
        self._queues: dict[str, QueueCatchup] = {}

    def expect(self, queue: str) -> None:
        """``queue`` must catch up before the backup is ready (its browser is being opened)."""
        self._expected.add(queue)

    def start(self, queue: str, plan: CatchupPlan) -> QueueCatchup:
        """The primary answered the browser of ``queue`` with ``plan`` (restarts the queue's catch-up)."""
        self._expected.add(queue)
        tracker = QueueCatchup(plan)
        self._queues[queue] = tracker
        return tracker

    def get(self, queue: str) -> QueueCatchup | None:
        return self._queues.get(queue)

    def forget(self, queue: str) -> None:
        """The queue was deleted or stopped replicating: no longer needed for ready."""
        self._expected.discard(queue)
        self._queues.pop(queue, None)

    def waiting_for(self) -> list[str]:
        """Queues not caught up yet (not started or not done), sorted."""
        return sorted(q for q in self._expected if q not in self._queues or not self._queues[q].done)

    @property
    def ready(self) -> bool:
        return not self.waiting_for()

    def progress(self) -> Progress:
        """Summed over queues, for one progress bar per backup."""
        ps = [t.progress() for t in self._queues.values()]
        return Progress(
            total=sum(p.total for p in ps),
            sent=sum(p.sent for p in ps),
            acked=sum(p.acked for p in ps),
            dropped=sum(p.dropped for p in ps),
            dequeued_in_flight=sum(p.dequeued_in_flight for p in ps),
        )
