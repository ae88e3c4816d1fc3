"""An in-memory primary and backup of one replicated queue, joined by the replication protocol's bytes (in the
spirit of h11's ConnectionPair): the pure cores the brokers use - catch-up plan and progress (ha.core.catchup), the
batch format and acknowledgements (ha.core.batch), the guards that hold client settlements (ha.core.guards) - wired
as ha.replicating and ha.replica wire them, minus sockets, proton and the event loop. Tests drive it step by step
(`publish`, `consume`, `pump`, `attach`, `drop`) and check the protocol's promises: the backup ends holding exactly
the primary's messages, and no client settlement is released before the backup holds the message.

It models one batch per pass per direction and no flow bounds (the flow bounds are ha.replicating's business).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from ha.core import batch as B
from ha.core.catchup import CatchupPlan, QueueCatchup, plan_catchup
from ha.core.guards import GuardBook
from ha.core.idset import PositionSet

QUEUE = "q"
BACKUP = "b"
MAX_MESSAGE = 1 << 20


@dataclass
class Backup:
    """What the backup holds: position -> message (a journal would hold the same)."""

    held: dict[int, bytes] = field(default_factory=dict)

    def receive(self, payload: bytes) -> bytes:
        """Apply a batch (whole: parse checks it first) and answer with the acknowledgement transfer's bytes."""
        applied: list[int] = []
        dequeued: list[tuple[int, int]] = []
        for r in B.parse(payload, MAX_MESSAGE):
            if type(r) is not tuple:
                continue  # version-2 state records: not modelled
            if len(r) == 2:
                lo, hi = r  # type: ignore[misc]
                for p in [p for p in self.held if lo <= p <= hi]:
                    del self.held[p]
                dequeued.append((lo, hi))
            else:
                pos, _level, _flags, _count, _expires, body = r  # type: ignore[misc]
                if pos not in self.held:  # as ha.replica: a position held is not replaced
                    self.held[pos] = body
                applied.append(pos)
        return B.encode_acks({QUEUE: PositionSet(sorted(applied)).ranges()}, {QUEUE: dequeued})


@dataclass
class Primary:
    queue: dict[int, bytes] = field(default_factory=dict)
    next_position: int = 1
    guards: GuardBook[str] = field(default_factory=GuardBook)
    settled: list[str] = field(default_factory=list)  # client tokens released, in order
    unguarded: list[str] = field(default_factory=list)  # settled at once: no backup guarded them
    # the one backup's browser (None: not attached)
    qc: QueueCatchup | None = None
    plan: CatchupPlan | None = None
    live: deque[int] = field(default_factory=deque)
    dequeues: PositionSet = field(default_factory=PositionSet)

    def publish(self, body: bytes) -> str:
        pos = self.next_position
        self.next_position += 1
        self.queue[pos] = body
        token = f"m{pos}"
        if not self.guards.hold(QUEUE, [pos], [token], 0.0, len(body)):
            self.unguarded.append(token)
        if self.qc is not None:
            self.live.append(pos)
        return token

    def consume(self, pos: int) -> None:
        del self.queue[pos]
        self.settled += self.guards.dequeued(QUEUE, pos)
        if self.qc is not None:
            self.qc.dequeued([pos])
            self.dequeues.add(pos)

    def attach(self, held: PositionSet, reused_from: int | None) -> None:
        """The backup's browser attaches announcing what it holds (as ha.primary._attach_queue)."""
        self.guards.add_backup(BACKUP)  # before the snapshot (ha.core.catchup.BackupCatchup)
        plan = plan_catchup(PositionSet(sorted(self.queue)), held, reused_from=reused_from)
        self.plan, self.qc = plan, QueueCatchup(plan)
        self.live.clear()
        self.dequeues = plan.dequeues.copy()
        self.settled += self.guards.start(BACKUP, QUEUE, plan.snapshot_max, plan.skip)

    def drop(self) -> None:
        """The backup's connection went away."""
        self.settled += self.guards.drop_backup(BACKUP)
        self.qc = self.plan = None
        self.live.clear()
        self.dequeues = PositionSet()

    def batch(self) -> bytes | None:
        """One pass's transfer to the backup: dequeues, live messages in order, then catch-up newest first."""
        if self.qc is None:
            return None
        w = B.BatchWriter()
        if self.dequeues:
            w.dequeue_ranges(self.dequeues.ranges())
            self.dequeues = PositionSet()
        while self.live:
            pos = self.live.popleft()
            if pos in self.queue:
                w.enqueue(pos, 0, 0, 0, None, self.queue[pos])
        for pos in self.qc.next_batch(1 << 30):
            if pos in self.queue:
                w.enqueue(pos, 0, 0, 0, None, self.queue[pos])
            else:
                self.qc.dequeued([pos])
        return w.payload() if w else None

    def acknowledged(self, payload: bytes) -> None:
        applied, _ = B.parse_acks(payload)
        got = PositionSet.from_ranges(applied.get(QUEUE, []))
        if self.qc is not None:
            self.qc.acked(got)
        self.settled += self.guards.acked(BACKUP, QUEUE, got).released


@dataclass
class Pair:
    primary: Primary = field(default_factory=Primary)
    backup: Backup = field(default_factory=Backup)
    in_flight: deque[bytes] = field(default_factory=deque)  # primary -> backup transfers not yet received
    acks: deque[bytes] = field(default_factory=deque)  # backup -> primary

    def attach(self, reused_from: int | None = None) -> None:
        self.in_flight.clear()
        self.acks.clear()
        self.primary.attach(PositionSet(sorted(self.backup.held)), reused_from)

    def send(self) -> None:
        """The primary's pass: its batch goes on the wire."""
        payload = self.primary.batch()
        if payload is not None:
            self.in_flight.append(payload)

    def deliver(self) -> None:
        """The backup's pass: it applies what arrived and acknowledges."""
        while self.in_flight:
            self.acks.append(self.backup.receive(self.in_flight.popleft()))

    def answer(self) -> None:
        """The primary reads the acknowledgements."""
        while self.acks:
            self.primary.acknowledged(self.acks.popleft())

    def pump(self) -> None:
        for _ in range(3):
            self.send()
            self.deliver()
            self.answer()

    @property
    def caught_up(self) -> bool:
        return self.primary.qc is not None and self.primary.qc.done
