"""``GuardBook``: the primary's bookkeeping of delayed completion, one record per queue per pass.

A client delivery that was enqueued on a replicated queue stays unsettled until every guarding backup has released
its *place* (queue, position): the backup acknowledged the position, or the primary dequeued it first, or the
backup was dropped. The caller gives each place a *token* (e.g. the client's pending completion; a delivery routed
to two queues has two places and is settled when both tokens came back) and gets each token back exactly once, from
whichever call released its place.

What a pass of the primary routed to a queue is held as one *group*: its positions (ascending), their tokens, the
bitmask of the backups still waiting, the time and the bytes. Two ways a backup acknowledges, per (queue, backup):

- *in order* (after ``start``): a browser sends the queue's live messages in position order on one link and the
  backup applies (and dequeues) them in that order, so an acknowledgement of position p above the browser's
  snapshot means every live place up to p was applied or dequeued. One acknowledgement releases whole groups,
  walking a cursor forward: the cost per message is a token handed back, not a set operation.
- *exact* (up to the browser's snapshot, and before ``start``): catch-up positions are acknowledged in any order;
  each releases its own place (a group touched this way is split into single places first: rare, small).

Peer input never raises: acknowledgements of positions that are not guarded for that backup (unknown, repeated,
already released, from a dropped backup) are ignored and counted (``stats().ignored_acks``) and never release
another place. Misuse by the caller (positions that do not grow on a queue, mismatched lists) raises ``ValueError``.

Which backups guard is the caller's policy: a backup guards every hold made after ``add_backup`` (qpid does it when
the backup connects, so that "ready" can mean "caught up and nothing guarded outstanding since joining").
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Generic, TypeVar

from ha.core.idset import PositionSet

T = TypeVar("T", bound=Hashable)

_NO_FLOOR = 1 << 62  # before `start`: every acknowledgement is exact
_hi = attrgetter("hi")


class _Group(Generic[T]):
    """Places of one queue held together (one pass), positions ascending; `waiting` 0 = released."""

    __slots__ = ("hi", "nbytes", "positions", "tokens", "ts", "waiting")

    def __init__(self, positions: list[int], tokens: list[T], ts: float, nbytes: int, waiting: int) -> None:
        self.positions = positions
        self.tokens = tokens
        self.ts = ts
        self.nbytes = nbytes
        self.waiting = waiting
        self.hi = positions[-1]

    @property
    def lo(self) -> int:
        return self.positions[0]

    def split(self, k: int) -> _Group[T]:
        """Keep the first `k` places here; return the rest as a new group (bytes shared pro rata)."""
        n = len(self.positions)
        moved = self.nbytes * (n - k) // n
        rest = _Group(self.positions[k:], self.tokens[k:], self.ts, moved, self.waiting)
        del self.positions[k:]
        del self.tokens[k:]
        self.nbytes -= moved
        self.hi = self.positions[-1]
        return rest


class _Queue(Generic[T]):
    """The groups of one queue, ascending. `groups[i]` has absolute index `base + i`."""

    __slots__ = ("base", "cursors", "floors", "groups", "head")

    def __init__(self) -> None:
        self.groups: list[_Group[T]] = []
        self.head = 0  # groups before it are released
        self.base = 0
        self.floors: dict[int, int] = {}  # backup bit -> positions up to here are acknowledged exactly
        self.cursors: dict[int, int] = {}  # backup bit -> absolute index of the first group its order has not passed

    def last_position(self) -> int:
        return self.groups[-1].hi if self.groups else 0

    def find(self, lo: int, hi: int) -> range:
        """List indexes of the groups that may hold positions in lo..hi (released ones included)."""
        g = self.groups
        i = bisect_left(g, lo, lo=self.head, key=_hi)
        j = i
        while j < len(g) and g[j].positions[0] <= hi:
            j += 1
        return range(i, j)

    def split_at(self, i: int, k: int) -> None:
        """Split group `i` after its first `k` places (indexes after it shift by one: cursors follow)."""
        g = self.groups
        g.insert(i + 1, g[i].split(k))
        absolute = self.base + i
        for bit, c in self.cursors.items():
            if c > absolute:
                self.cursors[bit] = c + 1

    def trim(self) -> None:
        g = self.groups
        head = self.head
        n = len(g)
        while head < n and not g[head].waiting:
            head += 1
        if head > 256 and head * 2 > n:
            del g[:head]
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
    """``released``: one token per place now released by everyone (settle what they stand for). ``acked``: the
    groups of places this backup newly acknowledged, as (positions, hold time), for ``ha.lag``. ``ignored``:
    positions in the acknowledgement not guarded for this backup."""

    released: tuple[T, ...]
    acked: tuple[tuple[tuple[int, ...], float], ...]
    ignored: int

    @property
    def count(self) -> int:
        return sum(len(p) for p, _ in self.acked)

    def sample(self, i: int) -> tuple[int, float]:
        """(position, hold time) of the i-th acknowledged place."""
        for positions, ts in self.acked:
            if i < len(positions):
                return positions[i], ts
            i -= len(positions)
        raise IndexError(i)


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
        """The backup is lost: release everything it guarded. Returns the tokens of the places now released.

        Dropping an unknown backup returns [] (it may have been dropped already).
        """
        book = self._backups.pop(name, None)
        if book is None:
            return []
        bit = book.bit
        self._all &= ~bit
        released: list[T] = []
        for q in self._queues.values():
            q.floors.pop(bit, None)
            q.cursors.pop(bit, None)
            if book.count:
                for g in q.groups[q.head:]:
                    if g.waiting & bit:
                        g.waiting &= ~bit
                        if not g.waiting:
                            self._release(g, released)
                q.trim()
        self._free_bits.append(bit)
        return released

    def start(self, backup: str, queue: str, floor: int, held: Iterable[int] = ()) -> list[T]:
        """``backup``'s browser of ``queue`` attached with the queue's highest position ``floor`` in its snapshot
        and the positions ``held`` it says it holds. Places up to ``floor`` are from now on acknowledged exactly
        (catch-up); above it, in order. Places it holds are released now. Returns the tokens released."""
        book = self._backups.get(backup)
        if book is None:
            return []
        q = self._queue(queue)
        bit = book.bit
        q.floors[bit] = floor
        q.cursors[bit] = q.base + bisect_right(q.groups, floor, lo=q.head, key=_hi)
        released: list[T] = []
        if floor:
            got = held if isinstance(held, PositionSet) else PositionSet(sorted(set(held)))
            mine = got.intersection(PositionSet.from_ranges([(1, floor)])) if got else got
            if mine:
                self._exact(book, q, mine, released, [])
        return released

    @property
    def backups(self) -> frozenset[str]:
        return frozenset(self._backups)

    @property
    def guarding(self) -> bool:
        """Is any backup guarding (holds would guard)?"""
        return bool(self._all)

    # -- holding and releasing --------------------------------------------------------------------------------------

    def hold(self, queue: str, positions: Sequence[int], tokens: Sequence[T], now: float, nbytes: int = 0,
             *, backups: Iterable[str] | None = None) -> bool:
        """Guard the places ``positions`` of ``queue`` (ascending, above any held before on it) with their
        ``tokens``, enqueued at ``now`` with ``nbytes`` in all, on every backup (``backups`` restricts them).
        Returns False when nothing guards them (no backup): the caller settles at once."""
        if backups is None:
            mask = self._all
            guards: Iterable[_Backup] = self._backups.values()
        else:
            names = set(backups)
            unknown = names - set(self._backups)
            if unknown:
                raise ValueError(f"unknown backups in hold: {sorted(unknown)}")
            guards = [self._backups[n] for n in names]
            mask = 0
            for b in guards:
                mask |= b.bit
        if not mask or not positions:
            return False
        n = len(positions)
        if len(tokens) != n:
            raise ValueError(f"{n} positions but {len(tokens)} tokens")
        first = positions[0]
        if type(first) is not int or first < 1:
            raise ValueError(f"positions must be ints >= 1, got {first!r} on queue {queue!r}")
        q = self._queues.get(queue)
        if q is None:
            q = self._queue(queue)
        elif q.groups and first <= q.groups[-1].hi:
            raise ValueError(f"position {first} on queue {queue!r} does not grow (last {q.groups[-1].hi})")
        ps = list(positions)
        if n > 1 and ps[-1] - ps[0] < n - 1:  # (only the ends are checked: this runs once per pass and queue)
            raise ValueError(f"positions on queue {queue!r} must be ascending and distinct")
        g = _Group(ps, list(tokens), now, nbytes, mask)
        q.groups.append(g)
        for b in guards:
            b.count += n
            b.nbytes += nbytes
        self._places += n
        if q.floors:  # a group across a backup's floor is split there (exact below, in order above)
            for floor in q.floors.values():
                if first <= floor < ps[-1]:
                    for i in range(len(q.groups) - 1, -1, -1):  # the new group's parts are at the end
                        part = q.groups[i]
                        if part.positions[0] <= floor < part.hi:
                            q.split_at(i, bisect_right(part.positions, floor))
                            break
                        if part.hi < first:
                            break
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
        acked: list[tuple[tuple[int, ...], float]] = []
        floor = q.floors.get(book.bit, _NO_FLOOR)
        if got.min() <= floor:
            exact = got if got.max() <= floor else got.intersection(PositionSet.from_ranges([(1, floor)]))
            self._exact(book, q, exact, released, acked)
        top = got.max()
        if top > floor:
            self._in_order(book, q, top, released, acked)
        n = sum(len(p) for p, _ in acked)
        ignored = max(total - n, 0)
        self._ignored_acks += ignored
        return AckResult(tuple(released), tuple(acked), ignored)

    def _exact(self, book: _Backup, q: _Queue[T], positions: PositionSet, released: list[T],
               acked: list[tuple[tuple[int, ...], float]]) -> None:
        bit = book.bit
        for lo, hi in positions.ranges():
            i = q.find(lo, hi).start
            while i < len(q.groups) and q.groups[i].positions[0] <= hi:
                g = q.groups[i]
                if not g.waiting & bit:
                    i += 1
                    continue
                ps = g.positions
                a, b = bisect_left(ps, lo), bisect_right(ps, hi)
                if a == b:
                    i += 1
                    continue
                if b < len(ps):
                    q.split_at(i, b)  # the part after hi stays waiting
                if a > 0:
                    q.split_at(i, a)  # the part before lo stays waiting
                    i += 1
                self._clear(book, q.groups[i], released, acked)
                i += 1
        q.trim()

    def _in_order(self, book: _Backup, q: _Queue[T], top: int, released: list[T],
                  acked: list[tuple[tuple[int, ...], float]]) -> None:
        bit = book.bit
        groups = q.groups
        i = max(q.cursors.get(bit, q.base) - q.base, q.head)
        floor = q.floors.get(bit, 0)
        while i < len(groups) and groups[i].hi <= floor:  # catch-up places (held before the browser): exact only
            i += 1
        while i < len(groups):
            g = groups[i]
            if g.positions[0] > top:
                break
            if g.hi > top:  # acknowledged part way: the rest waits
                q.split_at(i, bisect_right(g.positions, top))
            if g.waiting & bit:
                self._clear(book, g, released, acked)
            i += 1
        q.cursors[bit] = q.base + i
        q.trim()

    def _clear(self, book: _Backup, g: _Group[T], released: list[T],
               acked: list[tuple[tuple[int, ...], float]]) -> None:
        g.waiting &= ~book.bit
        n = len(g.positions)
        book.count -= n
        book.nbytes -= g.nbytes
        acked.append((tuple(g.positions), g.ts))
        if not g.waiting:
            self._release(g, released)

    def dequeued(self, queue: str, positions: int | Iterable[int], backups: Iterable[str] | None = None) -> list[T]:
        """The primary dequeued ``positions`` of ``queue``: no backup has to acknowledge them any more (``backups``:
        only those named; the others go on waiting for their acknowledgement).

        Positions that are not guarded (the usual case: released before the consumer took them) are ignored.
        """
        q = self._queues.get(queue)
        if q is None or q.head >= len(q.groups):
            return []
        books: Iterable[_Backup] = self._backups.values()
        mask = self._all
        if backups is not None:
            books = [bk for bk in (self._backups.get(n) for n in backups) if bk is not None]
            mask = 0
            for bk in books:
                mask |= bk.bit
            if not mask:
                return []
        got = PositionSet([positions]) if isinstance(positions, int) else (
            positions if isinstance(positions, PositionSet) else PositionSet(sorted(set(positions))))
        released: list[T] = []
        for lo, hi in got.ranges():
            if hi < q.groups[q.head].positions[0] or lo > q.groups[-1].hi:
                continue
            i = q.find(lo, hi).start
            while i < len(q.groups) and q.groups[i].positions[0] <= hi:
                g = q.groups[i]
                ps = g.positions
                a, b = bisect_left(ps, lo), bisect_right(ps, hi)
                if not g.waiting & mask or a == b:
                    i += 1
                    continue
                if b < len(ps):
                    q.split_at(i, b)
                if a > 0:
                    q.split_at(i, a)
                    i += 1
                g = q.groups[i]
                for book in books:
                    if g.waiting & book.bit:
                        book.count -= len(g.positions)
                        book.nbytes -= g.nbytes
                g.waiting &= ~mask
                if not g.waiting:
                    self._release(g, released)
                i += 1
        q.trim()
        return released

    def forget_queue(self, queue: str) -> list[T]:
        """The queue was deleted (or stopped replicating): release every guard on it."""
        q = self._queues.get(queue)
        if q is None:
            return []
        released = self.dequeued(queue, PositionSet.from_ranges([(1, q.last_position())])) if q.groups else []
        del self._queues[queue]  # a recreated queue numbers from 1 again
        return released

    # -- queries ----------------------------------------------------------------------------------------------------

    def backlog(self, backup: str) -> int:
        """Places guarded by ``backup`` and not yet released by it; 0 for an unknown backup."""
        book = self._backups.get(backup)
        return 0 if book is None else book.count

    def in_flight(self, backup: str) -> InFlight:
        """What ``backup`` still holds up (bytes shared pro rata within a pass's group)."""
        book = self._backups.get(backup)
        return InFlight(0, 0) if book is None else InFlight(book.count, book.nbytes)

    def oldest_unacked_ts(self, backup: str) -> float | None:
        """Hold time of the earliest place ``backup`` has not released (None if none): for lag_ms."""
        book = self._backups.get(backup)
        if book is None or not book.count:
            return None
        bit = book.bit
        oldest: float | None = None
        for q in self._queues.values():
            for g in q.groups[q.head:]:
                if g.waiting & bit:
                    if oldest is None or g.ts < oldest:
                        oldest = g.ts
                    break
        return oldest

    def outstanding(self, backup: str, queue: str) -> PositionSet:
        """A copy of the positions of ``queue`` that ``backup`` has not released."""
        book = self._backups.get(backup)
        q = self._queues.get(queue)
        if book is None or q is None:
            return PositionSet()
        out = PositionSet()
        out.add_sequence(p for g in q.groups[q.head:] if g.waiting & book.bit for p in g.positions)  # (ascending)
        return out

    def is_held(self, token: T) -> bool:
        return any(token in g.tokens for q in self._queues.values() for g in q.groups[q.head:] if g.waiting)

    def stats(self) -> GuardStats:
        tokens = {t for q in self._queues.values() for g in q.groups[q.head:] if g.waiting for t in g.tokens}
        return GuardStats(tokens_held=len(tokens), places_held=self._places, ignored_acks=self._ignored_acks)

    # -- internals --------------------------------------------------------------------------------------------------

    def _queue(self, name: str) -> _Queue[T]:
        q = self._queues.get(name)
        if q is None:
            q = self._queues[name] = _Queue()
        return q

    def _release(self, g: _Group[T], released: list[T]) -> None:
        self._places -= len(g.positions)
        released.extend(g.tokens)


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
