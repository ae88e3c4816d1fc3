"""A queue: messages numbered by position, consumers that acquire, browsers that copy.

The server feeds it and sends what it hands out (proton only to read a message's id, in `take_back`). Every change
of a message's fate goes through the observers (enqueued, acquired, released, dequeued; reinstated for a dequeue
undone in its pass), which is what replication and the journal listen to.

Layout (lean: about 200 bytes per queued message besides its payload, see docs/performance.md):

- `entries`: position -> Entry, for every message on the queue (available or acquired);
- the *spine*: a list of entries in position order. Live traffic appends at the back; catch-up on a backup, which
  arrives newest first below everything held, is put at the front (the seed's live update); a dequeued entry stays
  in the spine, marked DEAD, until it reaches the front (FIFO consumption trims it at once);
- `_extra`: the rare entries that fit neither end (a backup filling a gap), in a sorted list;
- per priority level, the available entries in position order: a deque fed like the spine, plus a heap for entries
  that came back (released) or arrived out of order. Stale references (acquired or dead entries) are skipped
  lazily when they reach the front;
- `paged` (flow to disk, durable queues only): the messages that are on disk only, 12-20 bytes each
  (`broker.paging.PageIndex`). They are always the highest positions of the queue: while a queue has paged
  messages, a new message is *parked* (in `entries`, not yet available) and paged out at the end of the pass, and
  paged messages come back (`load`) at the top of what is in memory. The durable store decides when (broker.memory).
"""

from __future__ import annotations

import heapq
import itertools
import time
import uuid as uuidlib
from bisect import bisect_left, bisect_right
from collections import deque
from collections.abc import Iterable, Iterator
from enum import Enum
from operator import attrgetter
from typing import Any, Protocol

from sortedcontainers import SortedKeyList

from broker.dedup import DuplicateWindow
from broker.dedup import key as id_key
from broker.errors import QueueFull
from broker.message import current_message_id, decode
from broker.options import QueueOptions
from broker.paging import Paged, PageIndex

__all__ = ["ACQUIRED", "AVAILABLE", "DEAD", "PAGED", "DequeueReason", "Entry", "Queue", "QueueFull", "QueueObserver"]


class DequeueReason(Enum):
    ACCEPTED = "accepted"
    REJECTED = "rejected"
    EXPIRED = "expired"
    RING = "ring"  # pushed out by a newer message on a ring queue
    REPLACED = "replaced"  # last-value queue: a newer message with the same key
    PURGED = "purged"
    REPLICATED = "replicated"  # a backup applying the primary's dequeue
    DELETED = "deleted"  # the queue was deleted
    REFUSED = "refused"  # its journal write failed: its publisher was told it was not taken


AVAILABLE = 0
ACQUIRED = 1
DEAD = 2  # dequeued; a stale reference may still sit in the spine or an availability list
PAGED = 3  # written out (flow to disk): this object is a stale copy; the message is in `Queue.paged`

REDELIVERED = 1  # Entry.flags
DURABLE = 2
EXTRA = 4  # the entry is in the queue's sorted extra list, not the spine
PARKED = 8  # enqueued above paged messages: in `entries`, not available, paged out at the end of the pass
HELD = 16  # on a backup: a consumer of the primary holds it unsettled (count and REDELIVERED already raised for
#            the failover, ha.replica); the same bit on a replication enqueue record (ha.core.batch)
WINDOWED = 32  # its message-id entered the queue's duplicate window when it was taken (broker.dedup)

_EMPTY = b""

# While a transaction's commit is applied (broker.transactions), the messages its enqueues push out of a ring queue
# or replace on a last-value queue, with their data: its undo puts them back (`record_evictions`).
_evictions: list[tuple[Queue, Entry, bytes]] | None = None


def take_back(refused: Iterable[tuple[Queue, Entry]]) -> None:
    """Messages whose publisher is told they were not taken (a journal write that failed, a commit refused or
    undone, a route a later queue refused) are taken off every queue they were put on (a resend must not make them
    twice), unless a consumer took one in this same pass (it is out: it stays with that consumer); and a queue's
    duplicate window forgets the id one put there, or it would drop the resend as a duplicate of what it never
    kept. (Not a dead letter's: it entered no window, and its id may be there for the message's own publish.)"""
    for q, e in refused:
        if q.dedup is not None and e.flags & WINDOWED:
            decode(e.data, trusted=True)
            k = id_key(current_message_id())
            if k is not None:
                q.dedup.forget(k)
        e.flags &= ~WINDOWED  # its id is not in the window: replication must not send it (ha.replicating)
        if e.state == AVAILABLE and q.entries.get(e.position) is e:
            q.dequeue(e, DequeueReason.REFUSED)


def record_evictions(into: list[tuple[Queue, Entry, bytes]] | None) -> None:
    """From now on (until called with None) note in `into` each message a queue's limit or last-value key pushes
    out as another is enqueued (not the hot path: plain queues have neither)."""
    global _evictions
    _evictions = into
_position = attrgetter("position")


class Entry:
    """One message on one queue. `data` is the encoded message, shared by every queue it was routed to."""

    __slots__ = ("count", "data", "expires", "flags", "key", "level", "position", "seg", "state")

    def __init__(self, position: int, data: bytes, level: int, expires: float | None, flags: int,
                 key: Any = None) -> None:
        self.position = position
        self.data = data
        self.level = level
        self.expires = expires  # absolute (seconds since the epoch): the message's own TTL, else the queue's
        self.flags = flags
        self.key = key  # last-value key (LVQ queues only)
        self.state = AVAILABLE
        self.count = 0  # delivery count (failed deliveries)
        self.seg = 0  # where the journal holds it: segment << 32 | offset of its record (0: not journaled)

    @property
    def delivery_count(self) -> int:
        return self.count

    @property
    def redelivered(self) -> bool:
        return bool(self.flags & REDELIVERED)

    @property
    def durable(self) -> bool:
        return bool(self.flags & DURABLE)

    @property
    def size(self) -> int:
        return len(self.data)

    def __repr__(self) -> str:
        return f"Entry({self.position}, state={self.state}, level={self.level})"

    def __lt__(self, other: Entry) -> bool:
        # A heap of (position, entry) may hold a dead entry and a new one at the same position (a backup given a
        # position again): the tie must not raise.
        return self.position < other.position


def _plain(o: QueueOptions) -> bool:
    return (o.max_count is None and o.max_size is None and o.lvq_key is None and o.default_ttl is None
            and o.priority_levels == 1 and not o.deduplicates)


def _window(o: QueueOptions) -> DuplicateWindow | None:
    return DuplicateWindow(o.duplicate_window, o.duplicate_window_seconds) if o.deduplicates else None


BROWSE_AHEAD = 256 * 1024  # bytes of paged messages read back at once for browsers


def _pageable(o: QueueOptions) -> bool:
    """Can its messages be paged out (flow to disk)? Durable FIFO queues without limits or last-value keys."""
    return (o.durable and o.max_count is None and o.max_size is None and o.lvq_key is None
            and o.priority_levels == 1)


def pageable(arguments: dict[str, Any]) -> bool:
    """Can a queue declared with `arguments` page (False for arguments no queue takes)?"""
    try:
        return _pageable(QueueOptions.from_arguments(arguments))
    except (TypeError, ValueError):  # BadArgument among them
        return False


def _merge_ranges(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(ranges):
        if out and lo <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(hi, out[-1][1]))
        else:
            out.append((lo, hi))
    return out


def _runs(ps: list[int]) -> list[tuple[int, int]]:
    """Contiguous runs of a sorted list of distinct ints, as (lo, hi) pairs."""
    out: list[tuple[int, int]] = []
    stack = [(0, len(ps) - 1)] if ps else []
    while stack:
        i, j = stack.pop()
        if ps[j] - ps[i] == j - i:
            if out and out[-1][1] + 1 == ps[i]:
                out[-1] = (out[-1][0], ps[j])
            else:
                out.append((ps[i], ps[j]))
            continue
        mid = (i + j) // 2
        stack.append((mid + 1, j))  # the left half is taken first: the output stays sorted
        stack.append((i, mid))
    return out


class QueueObserver(Protocol):
    """What replication (or anything else) sees of a queue. Called synchronously on the event loop thread."""

    def enqueued(self, queue: Queue, entry: Entry) -> None: ...
    def acquired(self, queue: Queue, entry: Entry) -> None: ...
    def released(self, queue: Queue, entry: Entry) -> None: ...
    def recounted(self, queue: Queue, entry: Entry) -> None: ...  # its delivery count went up (a failed delivery)
    def dequeued(self, queue: Queue, entry: Entry, reason: DequeueReason) -> None: ...
    # its dequeue was undone in the pass that made it, acquired again (`Queue.reinstate`)
    def reinstated(self, queue: Queue, entry: Entry) -> None: ...


class Pager(Protocol):
    """Reads paged messages back from disk (the durable store)."""

    def read(self, queue: Queue, paged: list[Paged], unreadable: list[Paged] | None = None) -> list[Entry]: ...


class QueueStats:
    __slots__ = ("dequeued", "duplicates", "enqueued", "expired", "rejected_full", "ring_evicted")

    def __init__(self) -> None:
        self.duplicates = 0  # transfers dropped because their message-id was in the duplicate window
        self.enqueued = 0
        self.dequeued = 0
        self.expired = 0
        self.rejected_full = 0
        self.ring_evicted = 0


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
        self._spine: list[Any] = []  # Entry objects from _head on (slots before _head are free room)
        self._head = 0
        self._extra: Any = None  # SortedKeyList of entries outside the spine's order, made on first use
        self._levels = options.priority_levels
        self._avail: list[deque[Entry]] = [deque() for _ in range(self._levels)]
        self._back: list[list[tuple[int, Entry]]] = [[] for _ in range(self._levels)]
        self._available = 0  # entries in AVAILABLE state
        self._lvq: dict[Any, Entry] = {}  # last-value key -> entry
        self._expiring = 0  # entries with an expiry (the periodic sweep skips queues without any)
        self.bytes = 0
        self.observers: list[QueueObserver] = []
        self.stats = QueueStats()
        self.consumer_count = 0  # acquiring consumers and plain browsers; not replication links
        self.had_consumer = False
        self.deleted = False
        # Backups lock replicated queues: nothing is dispatched locally until promoted.
        self.locked = False
        self.plain = _plain(options)  # no limits, last-value key, default TTL or priorities: the fast enqueue
        self.pageable = _pageable(options)
        self.paged: PageIndex | None = None  # on disk only (flow to disk): above every message in memory
        self.fed = 0  # the highest position read back for consumers (broker.memory): not paged out while they stay
        self.parked: list[Entry] = []  # enqueued above the paged ones during this pass
        self.pager: Pager | None = None  # reads paged messages back (set by the durable store)
        self._browse_ahead: dict[int, Entry] = {}  # paged messages read back for browsers (copies), by position
        self.paged_marks: dict[int, list[Any]] = {}  # position -> changes to apply when read back (`mark_paged`)
        self.dedup = _window(options)  # duplicate-window: the message-ids taken recently (the router checks it)

    # ----- inspection -------------------------------------------------------------------------------------------
    def __len__(self) -> int:
        return self.depth

    def __bool__(self) -> bool:
        return True  # a queue is a queue even when empty (never `q or ...`)

    @property
    def depth(self) -> int:
        paged = self.paged
        return len(self.entries) + paged.count if paged is not None else len(self.entries)

    @property
    def all_bytes(self) -> int:
        """Bytes of the bodies queued, in memory and paged."""
        return self.bytes + self.paged.bytes if self.paged is not None else self.bytes

    @property
    def paged_count(self) -> int:
        return self.paged.count if self.paged is not None else 0

    @property
    def acquired_count(self) -> int:
        return len(self.entries) - self._available

    def _ordered(self, after: int = 0) -> Iterator[Entry]:
        """Live entries with position > `after`, in position order."""
        spine, head = self._spine, self._head
        i = bisect_right(spine, after, lo=head, key=_position) if after else head
        live = (e for e in map(spine.__getitem__, range(i, len(spine))) if e.state != DEAD)
        if self._extra:
            extra = self._extra.irange_key(after, None, inclusive=(False, True))
            return heapq.merge(live, extra, key=_position)
        return live

    def positions(self) -> Iterator[int]:
        return (e.position for e in self._ordered())

    def position_ranges(self) -> list[tuple[int, int]]:
        """Every position on the queue as sorted, disjoint (lo, hi) ranges, fast for deep queues (a catch-up
        plan of 1M messages must not stall the event loop): one list comprehension, then the runs are found by
        halving (a sorted run of distinct ints is contiguous when last - first == length - 1)."""
        spine = self._spine
        live = [e.position for e in spine[self._head:] if e.state != DEAD]
        ranges = _runs(live)
        if self._extra or self.paged is not None or self.parked:
            more = [(e.position, e.position) for e in self._extra] if self._extra else []
            if self.paged is not None:
                more += self.paged.ranges()
            more += [(e.position, e.position) for e in self.parked if e.state != DEAD]
            ranges = _merge_ranges(ranges + more)
        return ranges

    def positions_after(self, after: int) -> Iterator[int]:
        """Positions greater than `after`, in order (paged ones included: they are above those in memory)."""
        if self.paged is not None:
            return itertools.chain((e.position for e in self._ordered(after)), self.paged.positions_after(after))
        return (e.position for e in self._ordered(after))

    def next_after(self, after: int) -> int | None:
        return next(self.positions_after(after), None)

    def get(self, position: int) -> Entry | None:
        return self.entries.get(position)

    def holds(self, position: int) -> bool:
        """Is this position on the queue (in memory or paged)?"""
        return position in self.entries or (self.paged is not None and position in self.paged)

    def read(self, positions: Iterable[int], unreadable: list[Paged] | None = None) -> dict[int, Entry]:
        """The messages at `positions` that are on the queue, paged ones read back from disk (as copies that are
        not on the queue; those whose segment could not be read are left out, and added to `unreadable`)."""
        out: dict[int, Entry] = {}
        wanted: list[Paged] = []
        entries, paged = self.entries, self.paged
        for pos in positions:
            e = entries.get(pos)
            if e is not None:
                out[pos] = e
            elif paged is not None:
                p = paged.find(pos)
                if p is not None:
                    wanted.append(p)
        if wanted and self.pager is not None:
            for e in self.pager.read(self, wanted, unreadable):
                out[e.position] = e
        return out

    def has_available(self) -> bool:
        return not self.locked and self._available > 0

    def has_room(self, size: int, key: Any = None) -> bool:
        """Would `enqueue` take a message of `size` bytes (with last-value key `key`) without breaking
        max-count/max-size? A ring makes room by pushing out available messages, if that is enough; a last-value
        queue needs none to replace an available message of the same key. Asked before a message goes to any of
        its queues: one refusing it after others took it would leave them changed (what they pushed out is gone)."""
        o = self.options
        if o.max_count is None and o.max_size is None:
            return True
        if key is not None and o.lvq_key is not None:
            old = self._lvq.get(key)
            if old is not None and old.state == AVAILABLE:
                return True
        if o.ring:
            return self._ring_room(size) is not None
        if o.max_count is not None and self.depth + 1 > o.max_count:  # paged ones too (limits set later)
            return False
        return not (o.max_size is not None and self.all_bytes + size > o.max_size)

    def _ring_room(self, size: int) -> list[Entry] | None:
        """The available messages (oldest first) a ring pushes out to take one of `size` bytes, or None if even all
        of them would not make room (then none may go: they would be lost for nothing). Walks only as far as it
        must, unless the answer is None."""
        o = self.options
        count = 0 if o.max_count is None else self.depth + 1 - o.max_count  # how many must go
        nbytes = 0 if o.max_size is None else self.all_bytes + size - o.max_size  # how many bytes must go
        out: list[Entry] = []
        if count <= 0 and nbytes <= 0:
            return out
        for e in self._ordered():
            if e.state == AVAILABLE:
                out.append(e)
                count -= 1
                nbytes -= len(e.data)
                if count <= 0 and nbytes <= 0:
                    return out
        return None

    def level_of(self, priority: int) -> int:
        n = self._levels
        if n == 1:
            return 0
        p = min(max(priority, 0), 9)
        return min(p * n // 10, n - 1)

    # ----- enqueue ----------------------------------------------------------------------------------------------
    def enqueue(self, data: bytes, priority: int = 4, expires: float | None = None, durable: bool = False,
                key: Any = None, position: int | None = None, replicated: bool = False,
                now: float | None = None) -> Entry:
        """Add a message at the back, or at an explicit position. Raises QueueFull.

        `expires` is the message's own absolute expiry; without one the queue's default-ttl applies. `key` is its
        last-value key (LVQ queues). `replicated` is a backup applying its primary's enqueue: limits and
        last-value replacement were already applied on the primary (which also sends the resulting dequeues).
        """
        if self.plain and position is None:  # the usual case, with nothing to check
            position = self.next_position
            self.next_position = position + 1
            entry = Entry(position, data, 0, expires, DURABLE if durable else 0)
            self.entries[position] = entry
            self._spine.append(entry)
            self._avail[0].append(entry)
            self._available += 1
            if expires is not None:
                self._expiring += 1
            self.bytes += len(data)
            self.stats.enqueued += 1
            for o in self.observers:
                o.enqueued(self, entry)
            return entry
        opts = self.options
        lvq_old: Entry | None = None
        if key is not None and not replicated and opts.lvq_key is not None:
            old = self._lvq.get(key)
            if old is not None and old.state == AVAILABLE:
                lvq_old = old
        if lvq_old is None and not replicated and (opts.max_count is not None or opts.max_size is not None) \
                and not self._make_room(len(data)):
            self.stats.rejected_full += 1
            raise QueueFull(f"queue {self.name} is full")
        if position is None:
            position = self.next_position
        elif position in self.entries:
            raise ValueError(f"position {position} already on queue {self.name}")
        if expires is None and opts.default_ttl is not None:
            expires = (time.time() if now is None else now) + opts.default_ttl
        level = 0 if self._levels == 1 else self.level_of(priority)
        entry = Entry(position, data, level, expires, DURABLE if durable else 0, key)
        if self.paged is not None:
            self._park(entry)
        else:
            self._insert(entry)
        if expires is not None:
            self._expiring += 1
        self.bytes += len(data)
        self.stats.enqueued += 1
        if key is not None and opts.lvq_key is not None:
            cur = self._lvq.get(key)
            if cur is None or cur.position < position:
                self._lvq[key] = entry
        for o in self.observers:
            o.enqueued(self, entry)
        if lvq_old is not None:
            if _evictions is not None:
                _evictions.append((self, lvq_old, lvq_old.data))
            self.dequeue(lvq_old, DequeueReason.REPLACED)
        return entry

    def enqueue_replica(self, position: int, data: bytes, level: int, flags: int, count: int,
                        expires: float | None) -> Entry:
        """A backup applying its primary's enqueue as the primary keeps it (level, flags, delivery count and
        absolute expiry included): no limits, no last-value replacement, no default-ttl (all done on the primary).
        The position must not be on the queue."""
        if position in self.entries:
            raise ValueError(f"position {position} already on queue {self.name}")
        entry = Entry(position, data, min(level, self._levels - 1), expires or None, flags & (REDELIVERED | DURABLE))
        entry.count = count
        paged = self.paged
        if paged is not None and position > paged._firsts[0]:
            self._park(entry)
        else:
            self._insert(entry)
        if entry.expires is not None:
            self._expiring += 1
        self.bytes += len(data)
        self.stats.enqueued += 1
        for o in self.observers:
            o.enqueued(self, entry)
        return entry

    def append_replicas(self, records: list[Any]) -> tuple[int, int] | None:
        """A backup's live batch in one go: `records` are enqueues (position, level, flags, count, expires, body)
        in ascending position order above every position on the queue, with no flags but REDELIVERED and DURABLE,
        and nothing is paged; applied as `enqueue_replica` would one by one. Returns (first, last) position, or None
        having applied nothing when the records are not such a run (the caller applies them one by one)."""
        if self.paged is not None or not records:
            return None
        last = self.next_position - 1
        for r in records:
            if type(r) is not tuple or len(r) != 6 or r[0] <= last or r[2] & ~(REDELIVERED | DURABLE):
                return None
            last = r[0]
        top = self._levels - 1
        entries, spine, avails = self.entries, self._spine, self._avail
        out = []
        nbytes = expiring = 0
        for pos, level, flags, count, expires, data in records:
            e = Entry(pos, data, level if level <= top else top, expires or None, flags)
            e.count = count
            entries[pos] = e
            spine.append(e)
            avails[e.level].append(e)
            nbytes += len(data)
            if expires:
                expiring += 1
            out.append(e)
        self._appended(out, nbytes, expiring)
        return records[0][0], last

    def restore(self, recovered: list[Entry]) -> list[Entry]:
        """Recovery: entries the journal held (position, data, level, flags with no bits but REDELIVERED and
        DURABLE, count, expiry and journal location set; available), in ascending position order. Onto an empty
        queue they are taken as they are, in one go (recovering 1M is measured); else added one by one as a
        backup's would be (new entries, returned)."""
        if self.entries or self.paged is not None:
            out = []
            for r in recovered:
                e = self.enqueue_replica(r.position, r.data, r.level, r.flags, r.count, r.expires)
                e.seg = r.seg
                out.append(e)
            return out
        top = self._levels - 1
        entries, avails = self.entries, self._avail
        nbytes = expiring = 0
        for e in recovered:
            if e.level > top:
                e.level = top
            entries[e.position] = e
            avails[e.level].append(e)
            nbytes += len(e.data)
            if e.expires is not None:
                expiring += 1
        self._spine.extend(recovered)
        self._appended(recovered, nbytes, expiring)
        return recovered

    def _appended(self, out: list[Entry], nbytes: int, expiring: int) -> None:
        """The counts and observers of entries `append_replicas` or `restore` put at the back in one go (`nbytes`
        of messages, `expiring` of them with an expiry)."""
        if out:
            self.next_position = max(self.next_position, out[-1].position + 1)
        self._available += len(out)
        self.bytes += nbytes
        self._expiring += expiring
        self.stats.enqueued += len(out)
        for o in self.observers:
            for e in out:
                o.enqueued(self, e)

    def _insert(self, entry: Entry) -> None:
        position = entry.position
        self.entries[position] = entry
        self._available += 1
        spine = self._spine
        if position >= self.next_position:  # the usual case: at the back
            self.next_position = position + 1
            spine.append(entry)
            self._avail[entry.level].append(entry)
            return
        first = self._first_live()
        if first is None or position < first.position:  # below everything held: at the front (catch-up)
            if first is None:
                spine.append(entry)
                self._avail[entry.level].append(entry)
                return
            self._push_front(entry)
            self._avail[entry.level].appendleft(entry)
            return
        if self._extra is None:
            self._extra = SortedKeyList(key=_position)
        entry.flags |= EXTRA
        self._extra.add(entry)
        heapq.heappush(self._back[entry.level], (position, entry))

    def reinstate(self, entry: Entry, data: bytes, acquired: bool = True) -> bool:
        """Undo the dequeue of a message, in the pass that made it (a transaction's commit whose journal write
        failed, broker.transactions): `entry` is back at its place with its `data` as it was, acquired (for the
        caller to release) or available (one a limit or a last-value key pushed out); the observers are told
        `reinstated` (the dequeue they saw is void). False if its position is taken again meanwhile, or the queue
        deleted."""
        position = entry.position
        if entry.state != DEAD or position in self.entries or self.deleted:
            return False
        entry.data, entry.state = data, ACQUIRED if acquired else AVAILABLE
        self.entries[position] = entry
        if entry.flags & EXTRA:  # (the dequeue took it out of the extra list)
            assert self._extra is not None
            self._extra.add(entry)
        else:
            spine, head = self._spine, self._head
            i = bisect_left(spine, position, head, len(spine), key=_position)
            if i < len(spine) and spine[i] is entry:
                pass  # still in its place (dead entries stay in the spine until trimmed off its front)
            elif i > head:  # trimmed off the front, and another put back before it: in order, after that one
                spine.insert(i, entry)
            else:  # trimmed off the front: back there
                self._push_front(entry)
        if not acquired:
            self._available += 1
            heapq.heappush(self._back[entry.level], (position, entry))
        if entry.expires is not None:
            self._expiring += 1
        self.bytes += len(data)
        self.stats.dequeued -= 1
        key = entry.key
        if key is not None and self.options.lvq_key is not None:
            cur = self._lvq.get(key)
            if cur is None or cur.position < position:
                self._lvq[key] = entry
        for o in self.observers:
            o.reinstated(self, entry)
        return True

    def _push_front(self, entry: Entry) -> None:
        """Put `entry` at the front of the spine (below everything in it), making room there if need be."""
        spine, head = self._spine, self._head
        if head == 0:
            room = max(1024, len(spine))
            spine[0:0] = [None] * room
            head = room
        head -= 1
        spine[head] = entry
        self._head = head

    def _park(self, entry: Entry) -> None:
        """Above paged messages: kept aside (not available) until the end of the pass pages it out."""
        self.entries[entry.position] = entry
        if entry.position >= self.next_position:
            self.next_position = entry.position + 1
        entry.flags |= PARKED
        self.parked.append(entry)

    def _append(self, entry: Entry) -> None:
        """At the back of what is in memory (the caller knows it is above every position there)."""
        self.entries[entry.position] = entry
        self._spine.append(entry)
        self._avail[entry.level].append(entry)
        self._available += 1
        self.bytes += len(entry.data)
        if entry.expires is not None:
            self._expiring += 1

    def _first_live(self) -> Entry | None:
        self._trim()
        spine = self._spine
        return spine[self._head] if self._head < len(spine) else None

    def _trim(self) -> None:
        """Drop dead entries from the front of the spine (and compact it now and then)."""
        spine, head = self._spine, self._head
        n = len(spine)
        while head < n and spine[head].state == DEAD:
            spine[head] = None
            head += 1
        if head > 4096 and head > n - head:
            del spine[:head]
            head = 0
        elif head == n and head:
            spine.clear()
            head = 0
        self._head = head

    def _make_room(self, size: int) -> bool:
        opts = self.options

        def over() -> bool:
            return (opts.max_count is not None and self.depth + 1 > opts.max_count) or (
                opts.max_size is not None and self.all_bytes + size > opts.max_size
            )

        if not over():
            return True
        if not opts.ring:
            return False
        free = self._ring_room(size)
        if free is None:
            return False
        for e in free:
            self.stats.ring_evicted += 1
            if _evictions is not None:
                _evictions.append((self, e, e.data))
            self.dequeue(e, DequeueReason.RING)
        return True

    # ----- consumers --------------------------------------------------------------------------------------------
    def acquire_next(self, now: float | None = None, skip: set[int] | None = None) -> Entry | None:
        """Take the next available message (highest priority band, then lowest position) for a consumer,
        passing over positions in `skip` (messages this consumer declared undeliverable)."""
        if self.locked or not self._available:
            return None
        t: float | None = None
        for level in range(self._levels - 1, -1, -1):
            while True:
                entry = self._take(level, skip)
                if entry is None:
                    break
                exp = entry.expires
                if exp is not None:
                    if t is None:
                        t = time.time() if now is None else now
                    if exp <= t:
                        self._expire(entry)
                        continue
                entry.state = ACQUIRED
                self._available -= 1
                for o in self.observers:
                    o.acquired(self, entry)
                return entry
        return None

    def _take(self, level: int, skip: set[int] | None) -> Entry | None:
        """Remove and return the first available entry of `level` (not in `skip`), or None."""
        avail, back = self._avail[level], self._back[level]
        while avail and avail[0].state != AVAILABLE:
            avail.popleft()
        while back and back[0][1].state != AVAILABLE:
            heapq.heappop(back)
        if skip:
            return self._take_skipping(level, skip)
        if back and (not avail or back[0][0] < avail[0].position):
            return heapq.heappop(back)[1]
        if avail:
            return avail.popleft()
        return None

    def _take_skipping(self, level: int, skip: set[int]) -> Entry | None:
        avail, back = self._avail[level], self._back[level]
        first_a = next((i for i, e in enumerate(avail) if e.state == AVAILABLE and e.position not in skip), None)
        cands = [(pos, e) for pos, e in back if e.state == AVAILABLE and pos not in skip]
        first_b = min(cands, key=lambda pe: pe[0]) if cands else None
        if first_b is not None and (first_a is None or first_b[0] < avail[first_a].position):
            back.remove(first_b)
            heapq.heapify(back)
            return first_b[1]
        if first_a is not None:
            e = avail[first_a]
            del avail[first_a]
            return e
        return None

    def browse_after(self, cursor: int, include_acquired: bool = False, now: float | None = None) -> Entry | None:
        """The next message after position `cursor`, for a browser (copy); skips expired messages."""
        if self.locked and not include_acquired:
            return None
        t = time.time() if now is None else now
        for e in self._ordered(cursor):
            if e.state != AVAILABLE and not include_acquired:
                continue
            if e.expires is not None and e.expires <= t and e.state == AVAILABLE:
                continue
            return e
        return self._browse_paged(cursor, t) if self.paged is not None else None

    def _browse_paged(self, cursor: int, t: float) -> Entry | None:
        """The next paged message after `cursor` for a browser: a copy read back from disk (about BROWSE_AHEAD
        bytes of them at once, kept for the browsers' next calls; a copy is given only while its message is still
        paged)."""
        paged, ahead = self.paged, self._browse_ahead
        assert paged is not None
        for pos in paged.positions_after(cursor):
            e = ahead.pop(pos, None)
            if e is None:
                ahead.clear()
                wanted: list[int] = []
                size = 0
                for p in paged.positions_after(pos - 1):
                    found = paged.find(p)
                    if found is None or (wanted and size + found[2] > BROWSE_AHEAD):
                        break
                    wanted.append(p)
                    size += found[2]
                ahead.update(self.read(wanted))
                e = ahead.pop(pos, None)
                if e is None:
                    return None  # not readable now (journal.read_error): the browser waits
            if e.expires is not None and e.expires <= t:
                continue
            return e
        return None

    def release(self, entry: Entry, delivery_failed: bool = False, redelivered: bool = True) -> None:
        """Put an acquired message back at its old place."""
        if entry.state != ACQUIRED or self.entries.get(entry.position) is not entry:
            return
        entry.state = AVAILABLE
        self._available += 1
        if delivery_failed:
            entry.count += 1
        if redelivered:
            entry.flags |= REDELIVERED
        heapq.heappush(self._back[entry.level], (entry.position, entry))
        for o in self.observers:
            o.released(self, entry)
            if delivery_failed:
                o.recounted(self, entry)

    def recount(self, entry: Entry, count: int) -> None:
        """A replica's delivery count as its primary has it now (a failed delivery there), for the observers that
        keep it (the store)."""
        if count == entry.count:
            return
        entry.count = count
        if self.entries.get(entry.position) is entry:
            for o in self.observers:
                o.recounted(self, entry)

    def dequeue(self, entry: Entry, reason: DequeueReason = DequeueReason.ACCEPTED) -> None:
        """Forget a message for good."""
        pos = entry.position
        if self.entries.get(pos) is not entry:
            return
        del self.entries[pos]
        if entry.state == AVAILABLE and not entry.flags & PARKED:
            self._available -= 1
        entry.state = DEAD
        self.bytes -= len(entry.data)
        if entry.expires is not None:
            self._expiring -= 1
        self.stats.dequeued += 1
        if entry.key is not None and self._lvq.get(entry.key) is entry:
            del self._lvq[entry.key]
        if entry.flags & EXTRA:
            self._extra.remove(entry)
        elif entry.flags & PARKED:
            pass  # page_parked skips it
        else:
            spine = self._spine
            if self._head < len(spine) and spine[self._head] is entry:
                self._trim()
        for o in self.observers:
            o.dequeued(self, entry, reason)
        entry.data = _EMPTY  # a dead entry may linger in the spine: keep it small

    def dequeue_positions(self, positions: Iterable[int], reason: DequeueReason) -> int:
        n = 0
        entries, paged = self.entries, self.paged
        for pos in positions:
            e = entries.get(pos)
            if e is not None:
                self.dequeue(e, reason)
                n += 1
            elif paged is not None:
                n += self._dequeue_paged(paged.remove_range(pos, pos), reason)
                paged = self.paged
        return n

    def dequeue_range(self, lo: int, hi: int, reason: DequeueReason) -> int:
        """Dequeue every message with a position in lo..hi (walking the range or the queue, whichever is shorter)."""
        entries = self.entries
        n = 0
        if self.paged is not None:
            n = self._dequeue_paged(self.paged.remove_range(lo, hi), reason)
        if hi - lo + 1 <= len(entries):
            return n + self.dequeue_positions(range(lo, hi + 1), reason)
        return n + self.dequeue_positions([p for p in entries if lo <= p <= hi], reason)

    def _dequeue_paged(self, gone: list[Paged], reason: DequeueReason) -> int:
        """Paged messages dequeued without being read back: the observers see a copy without a body."""
        if self.paged is not None and not self.paged:
            self._unpage()
        marks = self.paged_marks
        for pos, loc, _ in gone:
            if marks:
                marks.pop(pos, None)
            # (on a queue with a window it may be a message whose id is in it: ha.replicating keeps its publisher's
            # guard until the backups have the id, which it reads from its own copy)
            stub = Entry(pos, _EMPTY, 0, None, DURABLE | WINDOWED if self.dedup is not None else DURABLE)
            stub.seg = loc
            stub.state = PAGED
            self.stats.dequeued += 1
            for o in self.observers:
                o.dequeued(self, stub, reason)
        return len(gone)

    def _unpage(self) -> None:
        """Nothing paged any more: parked messages go back to memory (in order), the fast enqueue is back."""
        self.paged = None
        parked, self.parked = sorted(self.parked, key=_position), []
        for e in parked:
            if e.state == AVAILABLE:
                e.flags &= ~PARKED
                del self.entries[e.position]
                self._append_parked(e)
        self.plain = _plain(self.options)

    def _append_parked(self, e: Entry) -> None:
        self.bytes -= len(e.data)  # _append counts it again
        if e.expires is not None:
            self._expiring -= 1
        self._append(e)

    # ----- flow to disk -----------------------------------------------------------------------------------------
    def page_parked(self) -> list[Entry]:
        """Page out what was parked in this pass (journaled: `seg` set); returns them (now stale copies). A
        parked message the journal could not write stays parked until it can."""
        out: list[Entry] = []
        paged = self.paged
        if paged is None:
            self._unpage()
            return out
        keep: list[Entry] = []
        for e in self.parked:
            if e.state != AVAILABLE:
                continue
            if not e.seg:
                keep.append(e)
                continue
            del self.entries[e.position]
            n = len(e.data)
            self.bytes -= n
            if e.expires is not None:
                self._expiring -= 1
            e.flags &= ~PARKED
            e.state = PAGED
            paged.add(e.position, e.seg, n)
            out.append(e)
        self.parked = keep
        return out

    def page_out(self, max_bytes: int, entry_cost: int, floor: int = 0) -> list[Entry]:
        """Move the highest available messages in memory to the paged index (their records are in the journal),
        about `max_bytes` of memory (`entry_cost` bytes a message besides its body), stopping at one that cannot
        go (acquired, redelivered, not journaled, at or below position `floor`: just read back for consumers).
        Returns them (now stale copies)."""
        out: list[Entry] = []
        if not self.pageable:
            return out
        paged = self.paged
        if paged is None:
            paged = self.paged = PageIndex()
            self.plain = False
        spine, avail, extra, entries = self._spine, self._avail[0], self._extra, self.entries
        freed = 0
        while freed < max_bytes:
            while len(spine) > self._head and spine[-1].state == DEAD:
                spine.pop()
            top = spine[-1] if len(spine) > self._head else None
            in_extra = False
            if extra:
                x = extra[-1]
                if top is None or x.position > top.position:
                    top, in_extra = x, True
            if (top is None or top.state != AVAILABLE or not top.seg or top.count or top.flags & REDELIVERED
                    or top.position <= floor):
                break
            if in_extra:
                extra.pop(-1)
                top.flags &= ~EXTRA
            else:
                spine.pop()
                while avail and avail[-1].state != AVAILABLE:
                    avail.pop()
                if avail and avail[-1] is top:
                    avail.pop()
            del entries[top.position]
            n = len(top.data)
            self._available -= 1
            self.bytes -= n
            if top.expires is not None:
                self._expiring -= 1
            top.state = PAGED
            paged.add(top.position, top.seg, n)
            out.append(top)
            freed += n + entry_cost
        if len(spine) <= self._head:
            spine.clear()
            self._head = 0
        if not paged:
            self._unpage()
        return out

    def next_paged(self, n: int, max_bytes: int, whole: bool = False) -> list[Paged]:
        """Take the lowest paged messages off the index, to be read back and `load`ed (see PageIndex.take_front)."""
        return self.paged.take_front(n, max_bytes, whole) if self.paged is not None else []

    def top_in_memory(self) -> int:
        """The highest position held in memory (0: none)."""
        spine, extra = self._spine, self._extra
        top = spine[-1].position if len(spine) > self._head else 0
        return max(top, extra[-1].position) if extra else top

    def load(self, entries: list[Entry]) -> None:
        """Paged messages read back (from `next_paged`, in order): at the top of what is in memory; what a replica
        was told of them meanwhile (`mark_paged`) applied."""
        marks = self.paged_marks
        for e in entries:
            self._append(e)
            if marks:
                for apply in marks.pop(e.position, ()):
                    apply(self, e)
        if self.paged is not None and not self.paged:
            self._unpage()

    def mark_paged(self, position: int, apply: Any) -> bool:
        """A change to the paged message at `position` (a replica's acquired or released state from its primary):
        `apply(queue, entry)` once it is read back. False if no such message is paged."""
        if self.paged is None or position not in self.paged:
            return False
        self.paged_marks.setdefault(position, []).append(apply)
        return True

    def _expire(self, entry: Entry) -> None:
        self.stats.expired += 1
        self.dequeue(entry, DequeueReason.EXPIRED)

    def expire(self, now: float | None = None) -> int:
        """Drop available messages whose TTL has passed. Returns how many."""
        if not self._expiring:
            return 0
        t = time.time() if now is None else now
        expired = [e for e in self.entries.values()
                   if e.state == AVAILABLE and e.expires is not None and e.expires <= t]
        for e in expired:
            self._expire(e)
        return len(expired)

    def purge(self, acquired: bool = True) -> int:
        """Drop every message (paged ones too; acquired ones unless `acquired` is False). Returns how many."""
        gone = [e for e in itertools.chain(self._ordered(), self.parked)
                if e.state == AVAILABLE or (acquired and e.state == ACQUIRED)]
        for e in gone:
            self.dequeue(e, DequeueReason.PURGED)
        n = len(gone)
        if self.paged is not None:
            n += self._dequeue_paged(self.paged.remove_range(0, 1 << 63), DequeueReason.PURGED)
        return n

    def drop_all(self) -> int:
        """Forget every message at once, without per-message observer calls (the queue is being deleted)."""
        n = self.depth
        for e in self.entries.values():
            e.state = DEAD
        self.entries.clear()
        self.paged = None
        self.parked = []
        self._spine = []
        self._head = 0
        self._extra = None
        self._avail = [deque() for _ in range(self._levels)]
        self._back = [[] for _ in range(self._levels)]
        self._available = 0
        self._lvq.clear()
        self._expiring = 0
        self.bytes = 0
        self.stats.dequeued += n
        return n

    def rebuild_last_values(self, key_of: Any) -> None:
        """Recompute the last-value index with `key_of(data, lvq_key)` (a backup's replica never applied
        replacements: done once when it is promoted; and for what a restart recovered)."""
        self._lvq.clear()
        name = self.options.lvq_key
        if name is None:
            return
        for e in self._ordered():
            k = key_of(e.data, name)
            e.key = k
            if k is not None:
                self._lvq[k] = e

    def update_options(self, arguments: dict[str, Any], options: QueueOptions) -> None:
        if options.priority_levels != self.options.priority_levels:
            raise ValueError("priority-levels cannot change")
        self.arguments = arguments
        self.options = options
        self.plain = _plain(options) and self.paged is None
        self.pageable = _pageable(options)
        if (options.duplicate_window, options.duplicate_window_seconds) != (
                self.dedup.count if self.dedup else None, self.dedup.seconds if self.dedup else None):
            old, self.dedup = self.dedup, _window(options)
            if old is not None and self.dedup is not None:
                self.dedup.replace(old.items())
                self.dedup.keep_marks(old)
