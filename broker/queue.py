"""A queue: messages numbered by position, consumers that acquire, browsers that copy.

Pure Python (no proton): the server feeds it and sends what it hands out. Every change of a message's fate goes
through the observers (enqueued, acquired, released, dequeued), which is what replication listens to.
"""

from __future__ import annotations

import time
import uuid as uuidlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from enum import Enum
from typing import Any, Protocol

from sortedcontainers import SortedList

from broker.message import Payload
from broker.options import QueueOptions


class QueueFull(Exception):
    """The queue is at max-count/max-size with policy reject."""


class DequeueReason(Enum):
    ACCEPTED = "accepted"
    REJECTED = "rejected"
    EXPIRED = "expired"
    RING = "ring"  # pushed out by a newer message on a ring queue
    REPLACED = "replaced"  # last-value queue: a newer message with the same key
    PURGED = "purged"
    REPLICATED = "replicated"  # a backup applying the primary's dequeue
    DELETED = "deleted"  # the queue was deleted


AVAILABLE = 0
ACQUIRED = 1


@dataclass(slots=True, eq=False)
class Entry:
    position: int
    msg: Payload
    level: int
    state: int = AVAILABLE
    delivery_count: int = 0
    redelivered: bool = False
    enqueued_at: float = 0.0
    expires_at: float | None = None  # the message's own TTL, else the queue's default-ttl


class QueueObserver(Protocol):
    """What replication (or anything else) sees of a queue. Called synchronously on the reactor thread."""

    def enqueued(self, queue: Queue, entry: Entry) -> None: ...
    def acquired(self, queue: Queue, entry: Entry) -> None: ...
    def released(self, queue: Queue, entry: Entry) -> None: ...
    def dequeued(self, queue: Queue, entry: Entry, reason: DequeueReason) -> None: ...


@dataclass(slots=True)
class QueueStats:
    enqueued: int = 0
    dequeued: int = 0
    expired: int = 0
    rejected_full: int = 0
    ring_evicted: int = 0


class Queue:
    def __init__(
        self,
        name: str,
        arguments: dict[str, Any],
        options: QueueOptions,
        uuid: str | None = None,
        temporary: bool = False,
    ) -> None:
        self.name = name
        self.arguments = arguments
        self.options = options
        self.uuid = uuid or str(uuidlib.uuid4())
        self.temporary = temporary
        self.next_position = 1
        self.entries: dict[int, Entry] = {}
        self._order: SortedList = SortedList()  # every position present (available or acquired)
        self._available: list[SortedList] = [SortedList() for _ in range(options.priority_levels)]
        self._lvq: dict[Any, int] = {}  # last-value key -> position
        self.bytes = 0
        self.observers: list[QueueObserver] = []
        self.stats = QueueStats()
        self.consumer_count = 0  # acquiring consumers and plain browsers; not replication links
        self.had_consumer = False
        self.deleted = False
        # Backups lock replicated queues: nothing is dispatched locally until promoted.
        self.locked = False

    # ----- inspection -------------------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.entries)

    @property
    def depth(self) -> int:
        return len(self.entries)

    @property
    def acquired_count(self) -> int:
        return len(self.entries) - sum(len(a) for a in self._available)

    def positions(self) -> Iterator[int]:
        return iter(self._order)

    def positions_after(self, after: int) -> Iterator[int]:
        """Positions greater than `after`, in order."""
        return iter(self._order.irange(minimum=after, inclusive=(False, True)))

    def next_after(self, after: int) -> int | None:
        return next(self.positions_after(after), None)

    def get(self, position: int) -> Entry | None:
        return self.entries.get(position)

    def has_available(self) -> bool:
        return not self.locked and any(self._available)

    def has_room(self, msg: Payload) -> bool:
        """Would a message fit without breaking max-count/max-size (policy reject)? Ring and last-value queues
        always make room."""
        o = self.options
        if o.ring or (o.max_count is None and o.max_size is None):
            return True
        if o.lvq_key is not None:
            return True  # a replacement needs no room; enqueue() decides
        if o.max_count is not None and self.depth + 1 > o.max_count:
            return False
        return not (o.max_size is not None and self.bytes + msg.size > o.max_size)

    def _level_of(self, msg: Payload) -> int:
        n = self.options.priority_levels
        if n == 1:
            return 0
        p = min(max(msg.priority, 0), 9)
        return min(p * n // 10, n - 1)

    # ----- enqueue ----------------------------------------------------------------------------------------------
    def enqueue(
        self, msg: Payload, position: int | None = None, now: float | None = None, replicated: bool = False
    ) -> Entry:
        """Add a message at the back, or at an explicit position. Raises QueueFull.

        `replicated` is a backup applying its primary's enqueue: limits and last-value replacement were already
        applied on the primary (which also sends the resulting dequeues), so they are not applied again here.
        """
        opts = self.options
        lvq_old: int | None = None
        if replicated:
            pass
        elif opts.lvq_key is not None and msg.properties is not None:
            key = msg.properties.get(opts.lvq_key)
            if key is not None:
                old = self._lvq.get(key)
                if old is not None and old in self.entries and self.entries[old].state == AVAILABLE:
                    lvq_old = old
        if lvq_old is None and not replicated and not self._make_room(msg.size):
            self.stats.rejected_full += 1
            raise QueueFull(f"queue {self.name} is full")
        if position is None:
            position = self.next_position
        elif position in self.entries:
            raise ValueError(f"position {position} already on queue {self.name}")
        if position >= self.next_position:
            self.next_position = position + 1
        t = time.time() if now is None else now
        expires = msg.expires_at
        if expires is None and opts.default_ttl is not None:
            expires = msg.arrived_at + opts.default_ttl
        entry = Entry(position, msg, self._level_of(msg), enqueued_at=t, expires_at=expires)
        self.entries[position] = entry
        self._order.add(position)
        self._available[entry.level].add(position)
        self.bytes += msg.size
        self.stats.enqueued += 1
        if opts.lvq_key is not None and msg.properties is not None:
            key = msg.properties.get(opts.lvq_key)
            if key is not None and self._lvq.get(key, 0) < position:
                self._lvq[key] = position
        for o in self.observers:
            o.enqueued(self, entry)
        if lvq_old is not None:
            self.dequeue(self.entries[lvq_old], DequeueReason.REPLACED)
        return entry

    def _make_room(self, size: int) -> bool:
        opts = self.options
        if opts.max_count is None and opts.max_size is None:
            return True

        def over() -> bool:
            return (opts.max_count is not None and len(self.entries) + 1 > opts.max_count) or (
                opts.max_size is not None and self.bytes + size > opts.max_size
            )

        if not over():
            return True
        if not opts.ring:
            return False
        for pos in list(self._order):
            if not over():
                break
            e = self.entries[pos]
            if e.state == AVAILABLE:
                self.stats.ring_evicted += 1
                self.dequeue(e, DequeueReason.RING)
        return not over()

    # ----- consumers --------------------------------------------------------------------------------------------
    def acquire_next(self, now: float | None = None, skip: set[int] | None = None) -> Entry | None:
        """Take the next available message (highest priority band, then lowest position) for a consumer,
        passing over positions in `skip` (messages this consumer declared undeliverable)."""
        if self.locked:
            return None
        for level in range(len(self._available) - 1, -1, -1):
            avail = self._available[level]
            while avail:
                if skip:
                    pos = next((p for p in avail if p not in skip), 0)
                    if not pos:
                        break
                    avail.remove(pos)
                else:
                    pos = avail.pop(0)
                entry = self.entries[pos]
                exp = entry.expires_at
                if exp is not None and exp <= (now if now is not None else time.time()):
                    self._expire(entry)
                    continue
                entry.state = ACQUIRED
                for o in self.observers:
                    o.acquired(self, entry)
                return entry
        return None

    def browse_after(self, cursor: int, include_acquired: bool = False, now: float | None = None) -> Entry | None:
        """The next message after position `cursor`, for a browser (copy); skips expired messages."""
        if self.locked and not include_acquired:
            return None
        t = now if now is not None else time.time()
        for pos in self._order.irange(minimum=cursor, inclusive=(False, True)):
            e = self.entries[pos]
            if e.state != AVAILABLE and not include_acquired:
                continue
            if e.expires_at is not None and e.expires_at <= t and e.state == AVAILABLE:
                continue
            return e
        return None

    def release(self, entry: Entry, delivery_failed: bool = False, redelivered: bool = True) -> None:
        """Put an acquired message back at its old place."""
        if entry.state != ACQUIRED or self.entries.get(entry.position) is not entry:
            return
        entry.state = AVAILABLE
        if delivery_failed:
            entry.delivery_count += 1
        entry.redelivered = entry.redelivered or redelivered
        self._available[entry.level].add(entry.position)
        for o in self.observers:
            o.released(self, entry)

    def dequeue(self, entry: Entry, reason: DequeueReason = DequeueReason.ACCEPTED) -> None:
        """Forget a message for good."""
        pos = entry.position
        if self.entries.get(pos) is not entry:
            return
        del self.entries[pos]
        self._order.remove(pos)
        if entry.state == AVAILABLE:
            self._available[entry.level].discard(pos)
        self.bytes -= entry.msg.size
        self.stats.dequeued += 1
        if self.options.lvq_key is not None and entry.msg.properties is not None:
            key = entry.msg.properties.get(self.options.lvq_key)
            if key is not None and self._lvq.get(key) == pos:
                del self._lvq[key]
        for o in self.observers:
            o.dequeued(self, entry, reason)

    def dequeue_positions(self, positions: Iterable[int], reason: DequeueReason) -> int:
        n = 0
        for pos in positions:
            e = self.entries.get(pos)
            if e is not None:
                self.dequeue(e, reason)
                n += 1
        return n

    def _expire(self, entry: Entry) -> None:
        self.stats.expired += 1
        self.dequeue(entry, DequeueReason.EXPIRED)

    def expire(self, now: float | None = None) -> int:
        """Drop available messages whose TTL has passed. Returns how many."""
        t = time.time() if now is None else now
        expired = [
            e
            for e in self.entries.values()
            if e.state == AVAILABLE and e.expires_at is not None and e.expires_at <= t
        ]
        for e in expired:
            self._expire(e)
        return len(expired)

    def purge(self) -> list[Entry]:
        gone = [self.entries[p] for p in list(self._order)]
        for e in gone:
            self.dequeue(e, DequeueReason.PURGED)
        return gone

    def drop_all(self) -> int:
        """Forget every message at once, without per-message observer calls (the queue is being deleted)."""
        n = len(self.entries)
        self.entries.clear()
        self._order = SortedList()
        self._available = [SortedList() for _ in range(self.options.priority_levels)]
        self._lvq.clear()
        self.bytes = 0
        self.stats.dequeued += n
        return n

    def update_options(self, arguments: dict[str, Any], options: QueueOptions) -> None:
        if options.priority_levels != self.options.priority_levels:
            raise ValueError("priority-levels cannot change")
        self.arguments = arguments
        self.options = options
