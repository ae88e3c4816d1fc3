"""``GuardBook``: the primary's bookkeeping of delayed completion.

A client delivery (an opaque hashable *token*, e.g. the proton delivery) that was enqueued on replicated queues at
(queue, position) *places* stays unsettled until every guarding backup has released every place: the backup
acknowledged the position, or the primary dequeued it first, or the backup was dropped. Then the token is returned
once, by whichever call released it last, and the caller settles the delivery.

Two ways a backup acknowledges, per (queue, backup):

- *exact*: each acknowledged position releases that place only. This is how catch-up positions (the queue as it was
  when the backup's browser attached) are acknowledged, in any order.
- *in order* (after ``start``): the browser sends the queue's live messages in position order on one link and the
  backup applies them in that order, so an acknowledgement of position p above the browser's snapshot means every
  live place up to p was applied (or dequeued, which released it already). One acknowledgement releases them all,
  walking a cursor forward: the cost per message is a bit cleared, not a set operation.

Peer input never raises: acknowledgements of positions that are not guarded for that backup (unknown, repeated,
already dequeued, from a dropped backup) are ignored and counted (``stats().ignored_acks``) and never release another
token. Misuse by the caller (holding a token or a place twice, an unknown backup in ``hold``, positions that do not
grow on a queue) raises ``ValueError``.

Which backups guard is the caller's policy: a backup guards every hold made after ``add_backup`` (qpid does it when
the backup connects, so that "ready" can mean "caught up and nothing guarded outstanding since joining").

Layout: per queue, the guarded places in position order (a list with a moving head), each a record [token, bitmask
of the backups still waiting, enqueue time, bytes]; per backup a bit and two counters; per (queue, backup) a floor
(the browser's snapshot) and a cursor.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Generic, TypeVar

from ha.core.idset import PositionSet

T = TypeVar("T", bound=Hashable)
Place = tuple[str, int]  # (queue name, position)

_NO_FLOOR = 1 << 62  # before `start`: every acknowledgement is exact
_pos = attrgetter("position")


class _Entry(Generic[T]):
    """One guarded place: the message at (queue, position) and the backups (bits) that still have to release it."""

    __slots__ = ("enqueue_ts", "nbytes", "position", "token", "waiting")

    def __init__(self, token: T, position: int, enqueue_ts: float, nbytes: int, waiting: int):
        self.token = token
        self.position = position
        self.enqueue_ts = enqueue_ts
        self.nbytes = nbytes
        self.waiting = waiting  # bitmask of backups; 0 = released


class _Queue(Generic[T]):
    """The guarded places of one queue, in position order. `entries[i]` has absolute index `base + i`."""

    __slots__ = ("base", "cursors", "entries", "floors", "head", "live")

    def __init__(self) -> None:
        self.entries: list[_Entry[T]] = []
        self.head = 0  # entries before it are released
        self.base = 0
        self.live = 0  # entries not released
        self.floors: dict[int, int] = {}  # backup bit -> positions up to here are acknowledged exactly
        self.cursors: dict[int, int] = {}  # backup bit -> absolute index of the first entry its order has not passed

    def last_position(self) -> int:
        return self.entries[-1].position if self.entries else 0

    def span(self, lo: int, hi: int) -> range:
        """List indexes of the entries with lo <= position <= hi (released ones included)."""
        e = self.entries
        return range(bisect_left(e, lo, lo=self.head, key=_pos), bisect_right(e, hi, lo=self.head, key=_pos))

    def trim(self) -> None:
        e = self.entries
        head = self.head
        n = len(e)
        while head < n and not e[head].waiting:
            head += 1
        if head > 1024 and head * 2 > n:
            del e[:head]
            self.base += head
            head = 0
        self.head = head


class _Backup:
    __slots__ = ("bit", "count", "nbytes")

    def __init__(self, bit: int) -> None:
        self.bit = bit
        self.count = 0  # places this backup has not released
        self.nbytes = 0


@dataclass(frozen=True)
class AckResult(Generic[T]):
    """``released``: tokens now fully released (settle them). ``acked``: (position, enqueue_ts) newly acknowledged
    by this backup, for ``ha.lag``. ``ignored``: positions in the acknowledgement not guarded for this backup."""

    released: tuple[T, ...]
    acked: tuple[tuple[int, float], ...]
    ignored: int


@dataclass(frozen=True)
class InFlight:
    messages: int
    bytes: int


@dataclass(frozen=True)
class GuardStats:
    tokens_held: int
    places_held: int
    ignored_acks: int


class GuardBook(Generic[T]):
    def __init__(self) -> None:
        self._backups: dict[str, _Backup] = {}
        self._all = 0  # bitmask of every present backup
        self._free_bits: list[int] = []
        self._next_bit = 1
        self._queues: dict[str, _Queue[T]] = {}
        self._remaining: dict[T, int] = {}  # token -> places not yet released
        self._places = 0
        self._ignored_acks = 0

    # -- backups ----------------------------------------------------------------------------------------------------

    def add_backup(self, name: str) -> None:
        """``name`` guards every hold from now on. Adding a present backup is an error."""
        if name in self._backups:
            raise ValueError(f"backup {name!r} is already guarding")
        if self._free_bits:
            bit = self._free_bits.pop()
        else:
            bit = self._next_bit
            self._next_bit <<= 1
        self._backups[name] = _Backup(bit)
        self._all |= bit

    def drop_backup(self, name: str) -> list[T]:
        """The backup is lost: release everything it guarded. Returns the tokens now fully released.

        Dropping an unknown backup returns [] (it may have been dropped already).
        """
        book = self._backups.pop(name, None)
        if book is None:
            return []
        bit = book.bit
        self._all &= ~bit
        released: list[T] = []
        for name_q, q in list(self._queues.items()):
            q.floors.pop(bit, None)
            q.cursors.pop(bit, None)
            if book.count:
                for entry in q.entries[q.head:]:
                    if entry.waiting & bit:
                        entry.waiting &= ~bit
                        if not entry.waiting:
                            self._released(name_q, q, entry, released)
                q.trim()
        self._free_bits.append(bit)
        return released

    def start(self, backup: str, queue: str, floor: int, held: Iterable[int] = ()) -> list[T]:
        """``backup``'s browser of ``queue`` attached with the queue's highest position ``floor`` in its snapshot
        and the positions ``held`` it says it holds. Places up to ``floor`` are from now on acknowledged exactly
        (catch-up); above it, in order. Places it holds are released now. Returns the tokens now fully released."""
        book = self._backups.get(backup)
        if book is None:
            return []
        q = self._queue(queue)
        bit = book.bit
        q.floors[bit] = floor
        idx = bisect_right(q.entries, floor, lo=q.head, key=_pos)
        q.cursors[bit] = q.base + idx
        released: list[T] = []
        held_set = held if isinstance(held, PositionSet) else PositionSet(held)
        if held_set and q.live:
            self._exact(book, queue, q, held_set.intersection(PositionSet.from_ranges([(1, floor)])) if floor
                        else PositionSet(), released, [])
        return released

    @property
    def backups(self) -> frozenset[str]:
        return frozenset(self._backups)

    # -- holding and releasing --------------------------------------------------------------------------------------

    def hold(
        self,
        token: T,
        places: Sequence[Place],
        now: float,
        *,
        nbytes: int = 0,
        backups: Iterable[str] | None = None,
    ) -> bool:
        """Guard ``token`` enqueued at ``places`` (at time ``now``, of size ``nbytes``) on every backup.

        ``backups`` restricts the guarding backups (default: all added ones). Returns False when nothing guards it
        (no backup, or no replicated place): settle at once. Validates everything before changing anything.
        Positions on a queue must grow from one hold to the next.
        """
        if token in self._remaining:
            raise ValueError(f"token {token!r} is already held")
        if backups is None and len(places) == 1:
            queue, position = places[0]
            return self.hold_one(token, queue, position, now, nbytes)
        if backups is None:
            mask = self._all
            guards = list(self._backups.values())
        else:
            names = set(backups)
            unknown = names - set(self._backups)
            if unknown:
                raise ValueError(f"unknown backups in hold: {sorted(unknown)}")
            guards = [self._backups[n] for n in names]
            mask = 0
            for g in guards:
                mask |= g.bit
        if not mask or not places:
            return False
        queues = self._queues
        for queue, position in places:  # a place already held is the more useful message than a duplicate
            q = queues.get(queue)
            if q is not None and any(e.position == position and e.waiting for e in q.entries[q.head:]):
                raise ValueError(f"place ({queue!r}, {position}) is already held")
        if len(places) > 1 and len(set(places)) != len(places):
            raise ValueError(f"duplicate places in hold: {list(places)}")
        for queue, position in places:
            if type(position) is not int or position < 1:
                raise ValueError(f"position must be an int >= 1, got {position!r} on queue {queue!r}")
            q = queues.get(queue)
            if q is not None and position <= q.last_position():
                raise ValueError(f"position {position} on queue {queue!r} does not grow (last {q.last_position()})")
        for queue, position in places:
            q = queues.get(queue)
            if q is None:
                q = self._queue(queue)
            q.entries.append(_Entry(token, position, now, nbytes, mask))
            q.live += 1
        n = len(places)
        for g in guards:
            g.count += n
            g.nbytes += n * nbytes
        self._remaining[token] = n
        self._places += n
        return True

    def hold_one(self, token: T, queue: str, position: int, now: float, nbytes: int = 0) -> bool:
        """`hold` of one place on every backup (the usual case, without the list)."""
        mask = self._all
        if not mask:
            return False
        if token in self._remaining:
            raise ValueError(f"token {token!r} is already held")
        if type(position) is not int or position < 1:
            raise ValueError(f"position must be an int >= 1, got {position!r} on queue {queue!r}")
        q = self._queues.get(queue)
        if q is None:
            q = self._queue(queue)
        elif q.entries and position <= q.entries[-1].position:
            if any(e.position == position and e.waiting for e in q.entries[q.head:]):
                raise ValueError(f"place ({queue!r}, {position}) is already held")
            raise ValueError(f"position {position} on queue {queue!r} does not grow (last {q.last_position()})")
        q.entries.append(_Entry(token, position, now, nbytes, mask))
        q.live += 1
        for g in self._backups.values():
            g.count += 1
            g.nbytes += nbytes
        self._remaining[token] = 1
        self._places += 1
        return True

    def acked(self, backup: str, queue: str, positions: Iterable[object]) -> AckResult[T]:
        """``backup`` acknowledged holding ``positions`` of ``queue``.

        ``positions`` is peer input: a PositionSet (cheapest for ranges) or any iterable; items that are not
        positions at all are ignored and counted, like positions not guarded for this backup.
        """
        book = self._backups.get(backup)
        q = self._queues.get(queue) if book is not None else None
        if isinstance(positions, PositionSet):
            got, junk = positions, 0
        else:
            got, junk = _valid(positions)
        total = len(got) + junk
        if book is None or q is None or not got:
            self._ignored_acks += total
            return AckResult((), (), total)
        released: list[T] = []
        acked: list[tuple[int, float]] = []
        bit = book.bit
        floor = q.floors.get(bit, _NO_FLOOR)
        if got.min() <= floor:
            exact = got if got.max() <= floor else got.intersection(PositionSet.from_ranges([(1, floor)]))
            self._exact(book, queue, q, exact, released, acked)
        top = got.max()
        if top > floor:
            self._in_order(book, queue, q, top, released, acked)
        self._ignored_acks += total - len(acked)
        return AckResult(tuple(released), tuple(acked), total - len(acked))

    def _exact(self, book: _Backup, queue: str, q: _Queue[T], positions: PositionSet, released: list[T],
               acked: list[tuple[int, float]]) -> None:
        bit = book.bit
        entries = q.entries
        for lo, hi in positions.ranges():
            for i in q.span(lo, hi):
                entry = entries[i]
                if entry.waiting & bit:
                    self._clear(book, queue, q, entry, released, acked)

    def _in_order(self, book: _Backup, queue: str, q: _Queue[T], top: int, released: list[T],
                  acked: list[tuple[int, float]]) -> None:
        # The hot loop of replication: one pass per acknowledgement batch over the places it releases, with
        # _clear and _released inlined.
        bit = book.bit
        keep = ~bit
        entries = q.entries
        remaining = self._remaining
        i = max(q.cursors.get(bit, q.base) - q.base, q.head)
        n = len(entries)
        count = nbytes = freed = 0
        while i < n:
            entry = entries[i]
            if entry.position > top:
                break
            i += 1
            waiting = entry.waiting
            if not waiting & bit:
                continue
            entry.waiting = waiting = waiting & keep
            count += 1
            nbytes += entry.nbytes
            acked.append((entry.position, entry.enqueue_ts))
            if not waiting:
                freed += 1
                token = entry.token
                left = remaining[token] - 1
                if left:
                    remaining[token] = left
                else:
                    del remaining[token]
                    released.append(token)
        book.count -= count
        book.nbytes -= nbytes
        q.live -= freed
        self._places -= freed
        q.cursors[bit] = q.base + i
        if q.head < n and not entries[q.head].waiting:
            q.trim()

    def _clear(self, book: _Backup, queue: str, q: _Queue[T], entry: _Entry[T], released: list[T],
               acked: list[tuple[int, float]]) -> None:
        entry.waiting &= ~book.bit
        book.count -= 1
        book.nbytes -= entry.nbytes
        acked.append((entry.position, entry.enqueue_ts))
        if not entry.waiting:
            self._released(queue, q, entry, released)

    def dequeued(self, queue: str, positions: int | Iterable[int]) -> list[T]:
        """The primary dequeued ``positions`` of ``queue``: no backup has to acknowledge them any more.

        Positions that are not guarded (the usual case: released before the consumer took them) are ignored.
        """
        q = self._queues.get(queue)
        if q is None or not q.live:
            return []
        got = PositionSet([positions]) if isinstance(positions, int) else (
            positions if isinstance(positions, PositionSet) else PositionSet(sorted(set(positions))))
        released: list[T] = []
        backups = self._backups.values()
        entries = q.entries
        for lo, hi in got.ranges():
            for i in q.span(lo, hi):
                entry = entries[i]
                waiting = entry.waiting
                if not waiting:
                    continue
                for b in backups:
                    if waiting & b.bit:
                        b.count -= 1
                        b.nbytes -= entry.nbytes
                entry.waiting = 0
                self._released(queue, q, entry, released)
        q.trim()
        return released

    def forget_queue(self, queue: str) -> list[T]:
        """The queue was deleted (or stopped replicating): release every guard on it."""
        q = self._queues.get(queue)
        if q is None:
            return []
        released = self.dequeued(queue, PositionSet.from_ranges([(1, q.last_position())])) if q.live else []
        del self._queues[queue]  # a recreated queue numbers from 1 again
        return released

    # -- queries ----------------------------------------------------------------------------------------------------

    def backlog(self, backup: str) -> int:
        """Messages (places) guarded by ``backup`` and not yet released by it; 0 for an unknown backup."""
        book = self._backups.get(backup)
        return 0 if book is None else book.count

    def in_flight(self, backup: str) -> InFlight:
        """What ``backup`` still holds up, for replication credit (--ha-flow-messages / --ha-flow-bytes)."""
        book = self._backups.get(backup)
        return InFlight(0, 0) if book is None else InFlight(book.count, book.nbytes)

    def oldest_unacked_ts(self, backup: str) -> float | None:
        """Enqueue time of the earliest-held place ``backup`` has not released (None if none): for lag_ms."""
        book = self._backups.get(backup)
        if book is None or not book.count:
            return None
        bit = book.bit
        oldest: float | None = None
        for q in self._queues.values():
            for entry in q.entries[q.head:]:
                if entry.waiting & bit:
                    if oldest is None or entry.enqueue_ts < oldest:
                        oldest = entry.enqueue_ts
                    break
        return oldest

    def outstanding(self, backup: str, queue: str) -> PositionSet:
        """A copy of the positions of ``queue`` that ``backup`` has not released."""
        book = self._backups.get(backup)
        q = self._queues.get(queue)
        if book is None or q is None:
            return PositionSet()
        return PositionSet(e.position for e in q.entries[q.head:] if e.waiting & book.bit)

    def is_held(self, token: T) -> bool:
        return token in self._remaining

    def stats(self) -> GuardStats:
        return GuardStats(tokens_held=len(self._remaining), places_held=self._places, ignored_acks=self._ignored_acks)

    # -- internals --------------------------------------------------------------------------------------------------

    def _queue(self, name: str) -> _Queue[T]:
        q = self._queues.get(name)
        if q is None:
            q = self._queues[name] = _Queue()
        return q

    def _released(self, queue: str, q: _Queue[T], entry: _Entry[T], released: list[T]) -> None:
        q.live -= 1
        self._places -= 1
        left = self._remaining[entry.token] - 1
        if left:
            self._remaining[entry.token] = left
        else:
            del self._remaining[entry.token]
            released.append(entry.token)


def _valid(positions: Iterable[object]) -> tuple[PositionSet, int]:
    """Peer input as positions: the ints >= 1 (each once) and how many items were anything else or repeated."""
    good: list[int] = []
    junk = 0
    for p in positions:
        if type(p) is int and p >= 1:  # not bool, not float
            good.append(p)
        else:
            junk += 1
    s = PositionSet(sorted(set(good)))
    return s, junk + len(good) - len(s)
