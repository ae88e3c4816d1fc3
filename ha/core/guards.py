"""``GuardBook``: the primary's bookkeeping of delayed completion.

A client delivery (an opaque hashable *token*, e.g. the proton delivery) that was enqueued on replicated queues at
(queue, position) *places* stays unsettled until every guarding backup has released every place: the backup
acknowledged the position, or the primary dequeued it first, or the backup was dropped. Then the token is returned
once, by whichever call released it last, and the caller settles the delivery.

Peer input never raises: acknowledgements of positions that are not guarded for that backup (unknown, repeated,
already dequeued, from a dropped backup) are ignored and counted (``stats().ignored_acks``) and never release another
token. Misuse by the caller (holding a token or a place twice, an unknown backup in ``hold``) raises ``ValueError``.

Which backups guard is the caller's policy: a backup guards every hold made after ``add_backup`` (qpid does it when
the backup connects, so that "ready" can mean "caught up and nothing guarded outstanding since joining").
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from ha.core.idset import PositionSet, as_position_set

T = TypeVar("T", bound=Hashable)
Place = tuple[str, int]  # (queue name, position)


class _Entry(Generic[T]):
    """One guarded place: the message at (queue, position) and the backups that still have to release it."""

    __slots__ = ("enqueue_ts", "nbytes", "position", "queue", "token", "waiting")

    def __init__(
        self, token: T, queue: str, position: int, enqueue_ts: float, nbytes: int, waiting: set[str]
    ):
        self.token = token
        self.queue = queue
        self.position = position
        self.enqueue_ts = enqueue_ts
        self.nbytes = nbytes
        self.waiting = waiting


class _Backup(Generic[T]):
    __slots__ = ("count", "nbytes", "order", "pending")

    def __init__(self) -> None:
        self.pending: dict[str, PositionSet] = {}  # queue -> positions this backup has not released
        self.order: deque[_Entry[T]] = deque()  # entries in hold order; pruned lazily from the front
        self.count = 0
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
        self._backups: dict[str, _Backup[T]] = {}
        self._entries: dict[str, dict[int, _Entry[T]]] = {}  # queue -> position -> entry
        self._remaining: dict[T, int] = {}  # token -> places not yet released
        self._ignored_acks = 0

    # -- backups ----------------------------------------------------------------------------------------------------

    def add_backup(self, name: str) -> None:
        """``name`` guards every hold from now on. Adding a present backup is an error."""
        if name in self._backups:
            raise ValueError(f"backup {name!r} is already guarding")
        self._backups[name] = _Backup()

    def drop_backup(self, name: str) -> list[T]:
        """The backup is lost: release everything it guarded. Returns the tokens now fully released.

        Dropping an unknown backup returns [] (it may have been dropped already).
        """
        book = self._backups.pop(name, None)
        if book is None:
            return []
        released: list[T] = []
        for queue, positions in book.pending.items():
            entries = self._entries[queue]
            for position in positions:
                entry = entries[position]
                entry.waiting.discard(name)
                if not entry.waiting:
                    self._remove_entry(entry, released)
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
        """
        if token in self._remaining:
            raise ValueError(f"token {token!r} is already held")
        guards = set(self._backups) if backups is None else set(backups)
        unknown = guards - set(self._backups)
        if unknown:
            raise ValueError(f"unknown backups in hold: {sorted(unknown)}")
        if not guards or not places:
            return False
        if len(set(places)) != len(places):
            raise ValueError(f"duplicate places in hold: {list(places)}")
        for queue, position in places:
            if isinstance(position, bool) or not isinstance(position, int) or position < 1:
                raise ValueError(f"position must be an int >= 1, got {position!r} on queue {queue!r}")
            if position in self._entries.get(queue, {}):
                raise ValueError(f"place ({queue!r}, {position}) is already held")
        for queue, position in places:
            entry = _Entry(token, queue, position, now, nbytes, set(guards))
            self._entries.setdefault(queue, {})[position] = entry
            for name in guards:
                book = self._backups[name]
                book.pending.setdefault(queue, PositionSet()).add(position)
                book.order.append(entry)
                book.count += 1
                book.nbytes += nbytes
        self._remaining[token] = len(places)
        return True

    def acked(self, backup: str, queue: str, positions: Iterable[object]) -> AckResult[T]:
        """``backup`` acknowledged holding ``positions`` of ``queue``.

        ``positions`` is peer input: a PositionSet (cheapest for ranges) or any iterable; items that are not
        guarded for this backup, repeated, or not positions at all are ignored and counted.
        """
        book = self._backups.get(backup)
        pending = book.pending.get(queue) if book is not None else None
        if book is None or pending is None:
            n = len(positions) if isinstance(positions, PositionSet) else sum(1 for _ in positions)
            self._ignored_acks += n
            return AckResult((), (), n)
        if isinstance(positions, PositionSet):
            known_set = positions.intersection(pending)
            pending.difference_update(known_set)
            ignored = len(positions) - len(known_set)
            known: Iterable[int] = known_set
        else:
            found: list[int] = []
            ignored = 0
            for p in positions:
                if isinstance(p, int) and not isinstance(p, bool) and p in pending:
                    pending.discard(p)
                    found.append(p)
                else:
                    ignored += 1
            known = found
        if not pending:
            del book.pending[queue]
        released: list[T] = []
        acked: list[tuple[int, float]] = []
        entries = self._entries[queue]
        for position in known:
            entry = entries[position]
            acked.append((position, entry.enqueue_ts))
            entry.waiting.discard(backup)
            book.count -= 1
            book.nbytes -= entry.nbytes
            if not entry.waiting:
                self._remove_entry(entry, released)
        self._prune(book, backup)
        self._ignored_acks += ignored
        return AckResult(tuple(released), tuple(acked), ignored)

    def dequeued(self, queue: str, positions: int | Iterable[int]) -> list[T]:
        """The primary dequeued ``positions`` of ``queue``: no backup has to acknowledge them any more.

        Positions that are not guarded (the usual case: released before the consumer took them) are ignored.
        """
        entries = self._entries.get(queue)
        if not entries:
            return []
        got = PositionSet([positions]) if isinstance(positions, int) else as_position_set(positions)
        found: list[_Entry[T]] = []
        for lo, hi in got.ranges():
            if hi - lo + 1 <= len(entries):
                found.extend(entries[p] for p in range(lo, hi + 1) if p in entries)
            else:
                found.extend(e for p, e in entries.items() if lo <= p <= hi)
        released: list[T] = []
        for entry in found:
            for name in entry.waiting:
                book = self._backups[name]
                pending = book.pending[queue]
                pending.discard(entry.position)
                if not pending:
                    del book.pending[queue]
                book.count -= 1
                book.nbytes -= entry.nbytes
            entry.waiting.clear()
            self._remove_entry(entry, released)
        for name in self._backups:
            self._prune(self._backups[name], name)
        return released

    def forget_queue(self, queue: str) -> list[T]:
        """The queue was deleted (or stopped replicating): release every guard on it."""
        entries = self._entries.get(queue)
        if not entries:
            return []
        return self.dequeued(queue, PositionSet(sorted(entries)))

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
        if book is None:
            return None
        self._prune(book, backup)
        return book.order[0].enqueue_ts if book.order else None

    def outstanding(self, backup: str, queue: str) -> PositionSet:
        """A copy of the positions of ``queue`` that ``backup`` has not released."""
        book = self._backups.get(backup)
        pending = book.pending.get(queue) if book is not None else None
        return PositionSet() if pending is None else pending.copy()

    def is_held(self, token: T) -> bool:
        return token in self._remaining

    def stats(self) -> GuardStats:
        places = sum(len(e) for e in self._entries.values())
        return GuardStats(
            tokens_held=len(self._remaining), places_held=places, ignored_acks=self._ignored_acks
        )

    # -- internals --------------------------------------------------------------------------------------------------

    def _remove_entry(self, entry: _Entry[T], released: list[T]) -> None:
        entries = self._entries[entry.queue]
        del entries[entry.position]
        if not entries:
            del self._entries[entry.queue]
        left = self._remaining[entry.token] - 1
        if left:
            self._remaining[entry.token] = left
        else:
            del self._remaining[entry.token]
            released.append(entry.token)

    @staticmethod
    def _prune(book: _Backup[T], name: str) -> None:
        order = book.order
        while order and name not in order[0].waiting:
            order.popleft()
