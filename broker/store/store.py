"""The durable store: what durable queues, exchanges and bindings and their durable messages become on disk, and
back at start. An `Extension` of the server.

What is journaled: queues with `durable: true`, their messages with the AMQP `durable` header, exchanges with
`durable: true`, bindings between durable ends, the duplicate windows of durable queues (broker.dedup: the ids a
pass added, after its messages; the whole window in each checkpoint), and the broker's HA standing (epoch, role,
state). Everything else never touches the disk.

Per pass (group commit): the observers append records as queues and wiring change; at the end of the pass
`end_of_pass` writes them with one `write`, and the syncer process makes them durable with one `fdatasync`. A client's
durable delivery is held until the sync of the pass that journaled it (and, in a cluster, until every ready backup
acknowledged it, which a backup does only once its own journal holds it: `when_synced`).

Segments: a new segment starts with a checkpoint of the wiring (queues with their next positions, exchanges,
bindings, the HA standing), so a segment can be dropped once it is the oldest and none of its messages is still on
a queue; the oldest segment with few live messages is compacted (its live messages written again at the end).

Flow to disk (`--max-memory`, broker.memory decides when): a durable queue's highest messages are *paged out* -
dropped from memory, their journal records kept (`Queue.paged`: 12-20 bytes a message) - and read back in order
(`page_in`) when there is room or a consumer needs them. A message enqueued on a queue that has paged messages is
journaled even if it is not durable (a *spill*: recovery skips it) so that it can be paged out behind them.
Recovery itself stays under the bound: beyond it, messages are indexed, not read.
"""

from __future__ import annotations

import bisect
import gc
import os
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from operator import attrgetter, itemgetter
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from broker.errors import BrokerError
from broker.extension import Extension
from broker.log import get_logger
from broker.message import last_value_key_of
from broker.paging import LOW_WATER, PAGEABLE_SHARE, PAGED_COST, Paged, PageIndex
from broker.queue import (
    DEAD,
    DURABLE,
    PAGED,
    PARKED,
    REDELIVERED,
    WINDOWED,
    DequeueReason,
    Entry,
    Queue,
    pageable,
    take_back,
)
from broker.store import records as R
from broker.store.journal import Journal, SyncFailed, segment_name, segment_numbers, sync_path
from broker.store.syncproc import SyncProcess
from broker.wiring import WiringEvent

if TYPE_CHECKING:
    from broker.links import Completion
    from broker.server import Server

log = get_logger("broker.store")

COMPACT_LIVE_FRACTION = 0.1  # the oldest segment is compacted when fewer of its messages than this are live
PROBE_INTERVAL = 1.0  # seconds between attempts to write again after a failure
SYNC_STALLED = 5.0  # a write whose fdatasync has not returned after this many seconds is reported (a hung disk)
PROBE_HEADROOM = 1 << 20  # free bytes the disk needs before a failed journal is tried again


class Watchdog(threading.Thread):
    """Calls `fn` every `interval` seconds off the event loop: what notices the loop itself stuck."""

    def __init__(self, fn: Callable[[], None], interval: float) -> None:
        super().__init__(name="journal-watchdog", daemon=True)
        self.fn, self.interval = fn, interval
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(self.interval):
            self.fn()

    def stop(self) -> None:
        self.stopped.set()


HALT_EXIT = 3  # the exit code of a broker that ended itself on a hung disk (--journal-stall-halt)


def _off_thread(fn: Callable[[], None]) -> threading.Thread:
    """Run `fn` (a log line) on a thread of its own: a log file on the hung disk must not hold the watchdog."""
    t = threading.Thread(target=fn, name="journal-watchdog-log", daemon=True)
    t.start()
    return t


def _halt(what: str, waited: float, limit: float) -> NoReturn:
    """End the whole process now (a thread stuck in a system call goes when it returns): under ZooKeeper the session
    expires and a ready backup is elected; under Pacemaker or the manager the member is seen gone."""
    _off_thread(lambda: log.error(
        "journal.stall.halt", seconds=round(waited, 1),
        description=f"{what} (--journal-stall-halt {limit:g}): the broker ends itself so that a ready backup takes "
                    "over")).join(1.0)
    os._exit(HALT_EXIT)


def _size(n: int) -> str:
    """`n` bytes for a person: 40.0 MiB, 1.5 GiB."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.1f} {unit}"
    return f"{n} bytes"


def _free_bytes(directory: Path, unknown: int = PROBE_HEADROOM) -> int:
    """Bytes free for the broker on `directory`'s file system (`unknown` if it cannot tell)."""
    try:
        st = os.statvfs(directory)
    except OSError:
        return unknown  # cannot tell: let the write itself decide
    return st.f_bavail * st.f_frsize


ENTRY_COST = 250  # bytes of memory a queued message costs besides its body (docs/performance.md: 243-258 measured)
# A journaled message costs one int object more: its location (`Entry.seg`, segment << 32 | offset: 32 bytes; a
# message that is not journaled shares the 0). Measured: 285 bytes over the body durable, 258 not, in one run.
JOURNALED_ENTRY_COST = ENTRY_COST + 32
READ_SPAN = 4 * 1024 * 1024  # bytes read back at once for paged messages
READ_RETRY = 1.0  # seconds before paged messages whose segment could not be read (an I/O error) are read again
LOC_OFFSET = R.LOC_OFFSET  # Entry.seg = segment << 32 | offset
_FLAGS = REDELIVERED | DURABLE  # what a record keeps of Entry.flags


@dataclass
class Recovered:
    """What `recover` found, for the log and `ha-admin journal stats`."""

    segments: int = 0
    queues: int = 0
    messages: int = 0
    bytes: int = 0
    exchanges: int = 0
    bindings: int = 0
    cut: int = 0  # bytes of a torn tail cut off the last segment
    cut_reason: str = ""
    paged: int = 0  # messages left on disk (recovery under --max-memory)
    seconds: float = 0.0
    state: dict[str, Any] = field(default_factory=dict)  # the last STATE record (HA standing)


@dataclass
class _Q:
    """A durable queue as the journal knows it."""

    qid: int
    live: dict[int, int] = field(default_factory=dict)  # segment -> messages of this queue still on it
    paged: dict[int, int] = field(default_factory=dict)  # segment -> of them, paged out (on disk only)


def _count(counts: dict[int, int], segment: int, n: int) -> None:
    left = counts.get(segment, 0) + n
    if left:
        counts[segment] = left
    else:
        counts.pop(segment, None)


_ENQ_UNPACK = R.ENQ.unpack_from
_ENQ_HEAD = R.ENQ_HEAD
_POSITION = attrgetter("position")
_TIME = itemgetter(1)


class Image:
    """The journal replayed: durable wiring, and messages as the entries their queues will hold, before any of it
    reaches the broker (pure). With a `budget` (bytes), messages beyond it are only indexed (`paged`), not read."""

    def __init__(self, budget: int = 0) -> None:
        self.queues: dict[int, dict[str, Any]] = {}  # qid -> {name, uuid, arguments, next}
        # qid -> position -> the message as the queue will hold it (its level not yet capped to the queue's)
        self.messages: dict[int, dict[int, Entry]] = {}
        self.paged: dict[int, PageIndex] = {}
        self.unpageable: set[int] = set()  # queues whose messages are all kept in memory (priority, limits, LVQ)
        self.exchanges: dict[str, dict[str, Any]] = {}
        self.bindings: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.state: dict[str, Any] = {}
        self.dequeued_top: dict[int, int] = {}  # qid -> the highest position a DEQUEUE record names (never reused)
        # qid -> the DEDUP payloads of its duplicate window since the last whole one (read at the end: every segment
        # starts with a whole window, and all but the last are replaced)
        self.window_parts: dict[int, list[bytes]] = {}
        self.budget = budget
        self.memory = 0  # bytes of the messages read (bodies and JOURNALED_ENTRY_COST each)
        self.segment = 0  # the segment being replayed (`R.scan(..., into=image)`)

    def apply(self, rec: R.Record, segment: int) -> None:
        """One record of `segment`."""
        self.segment = segment
        if rec.kind == R.ENQUEUE:
            self.enqueue(rec.payload, 0, len(rec.payload), rec.offset)
        else:
            self.record(rec)

    def enqueue(self, view: memoryview, at: int, end: int, offset: int) -> None:
        """An ENQUEUE record (payload `view[at:end]`, frame at `offset` of `self.segment`): the hot case, one per
        message, handed over by the scan without a Record, made into the queue's Entry at once (no method calls
        and nothing made twice: recovery of 1M is measured)."""
        qid, pos, level, flags, count, expires = _ENQ_UNPACK(view, at)
        msgs = self.messages.get(qid)
        if msgs is None or not flags & DURABLE:  # a spill of a non-durable message: not kept over a restart
            return
        loc = self.segment << 32 | offset
        size = end - at - _ENQ_HEAD
        if msgs:
            old = msgs.pop(pos, None)  # written again (compaction, a new count): the later record stands
            if old is not None:
                self.memory -= len(old.data) + JOURNALED_ENTRY_COST
        index = self.paged.get(qid)
        if index is not None:
            index.remove_range(pos, pos)
        if self.budget and (index is not None or self.memory > self.budget) and qid not in self.unpageable:
            if index is None:
                index = self.paged[qid] = PageIndex()
            index.add(pos, loc, size)
        else:
            e = msgs[pos] = Entry(pos, bytes(view[at + _ENQ_HEAD:end]), level, expires or None, flags & _FLAGS)
            e.count = count
            e.seg = loc
            self.memory += size + JOURNALED_ENTRY_COST

    def record(self, rec: R.Record) -> None:
        """Any record but ENQUEUE, of `self.segment`."""
        kind = rec.kind
        if kind == R.DEQUEUE:
            qid, lo, hi = rec.dequeue()
            if hi > self.dequeued_top.get(qid, 0):
                self.dequeued_top[qid] = hi
            msgs = self.messages.get(qid)
            if msgs:
                gone = [msgs.pop(p, None) for p in range(lo, hi + 1)] if hi - lo < len(msgs) else \
                    [msgs.pop(p) for p in [p for p in msgs if lo <= p <= hi]]
                self.memory -= sum(len(m.data) + JOURNALED_ENTRY_COST for m in gone if m is not None)
            index = self.paged.get(qid)
            if index is not None:
                index.remove_range(lo, hi)
        elif kind == R.QUEUE:
            qid, doc = rec.queue()
            before = self.queues.get(qid)
            if before is not None and before.get("uuid") == doc.get("uuid"):
                doc["next"] = max(int(doc.get("next", 1)), int(before.get("next", 1)))
            else:
                self._forget(qid)
                self.messages[qid] = {}
            self.queues[qid] = doc
            if pageable(doc.get("arguments") or {}):
                self.unpageable.discard(qid)
            else:
                self.unpageable.add(qid)
        elif kind == R.UNQUEUE:
            qid = rec.qid()
            self.queues.pop(qid, None)
            self._forget(qid)
        elif kind == R.EXCHANGE:
            doc = rec.document()
            self.exchanges[doc["name"]] = doc
        elif kind == R.UNEXCHANGE:
            self.exchanges.pop(rec.document()["name"], None)
        elif kind == R.BIND:
            doc = rec.document()
            self.bindings[(doc["exchange"], doc["queue"], doc.get("key", ""))] = doc
        elif kind == R.UNBIND:
            doc = rec.document()
            self.bindings.pop((doc["exchange"], doc["queue"], doc.get("key", "")), None)
        elif kind == R.STATE:
            self.state = rec.document()
        elif kind == R.DEDUP:
            qid, reset = rec.dedup_head()
            parts = self.window_parts.get(qid)
            if reset or parts is None:
                self.window_parts[qid] = [bytes(rec.payload)]
            else:
                parts.append(bytes(rec.payload))

    def window(self, qid: int) -> list[tuple[bytes, float]] | None:
        """A queue's duplicate window as replayed, oldest id first (None: none journaled)."""
        parts = self.window_parts.get(qid)
        if parts is None:
            return None
        ids = [item for p in parts for item in R.dedup_items(p)]
        # In the order they were taken: the id of a message that was not durable is written when the message left
        # its queue, with the time it was taken (nearly sorted: linear). An id written twice (a write that failed
        # written again, an id taken again after it left) counts once, at its later time, before the cap.
        ids.sort(key=_TIME)
        latest: dict[bytes, float] = {}
        for k, t in ids:
            latest.pop(k, None)
            latest[k] = t
        ids = list(latest.items())
        cap = (self.queues.get(qid) or {}).get("arguments", {}).get("duplicate-window")
        if isinstance(cap, int) and len(ids) > cap:  # the window holds the last `cap` of them
            del ids[: len(ids) - cap]
        return ids

    def _forget(self, qid: int) -> None:
        self.window_parts.pop(qid, None)
        self.dequeued_top.pop(qid, None)
        msgs = self.messages.pop(qid, None)
        if msgs:
            self.memory -= sum(len(m.data) + JOURNALED_ENTRY_COST for m in msgs.values())
        self.paged.pop(qid, None)

    def split(self, qid: int) -> tuple[list[Entry], PageIndex | None]:
        """A queue's messages: those to keep in memory (in order) and the paged ones, every one of them above the
        former (records written out of order - compaction, a backup's catch-up - are sorted out here)."""
        kept = sorted(self.messages.get(qid, {}).values(), key=_POSITION)  # in order already but for a few
        index = self.paged.get(qid)
        if index is None or not index:
            return kept, None
        first = index.first()
        assert first is not None
        cut = bisect.bisect_left(kept, first, key=_POSITION)
        for e in kept[cut:]:
            index.add(e.position, e.seg, len(e.data))
        return kept[:cut], index


def read_journal(directory: Path, budget: int = 0) -> tuple[Image, Recovered, list[int], int]:
    """Replay every segment of `directory` (keeping about `budget` bytes of messages in memory, 0 = all). Returns
    the image, the report, the segment numbers and the valid size of the last one (a torn tail beyond it is
    reported, not cut: the caller cuts when it writes again; 0: its header never reached the disk, the caller
    drops it). Raises JournalError for damage that is not a torn tail, or a newer format."""
    try:
        numbers = segment_numbers(directory)
    except OSError as e:
        raise R.JournalError(f"journal: cannot list {directory}: {e.strerror or e}") from None
    image, report, last_size, replayed = _replay(directory, numbers, budget)
    if replayed > last_size:
        # The last segment's torn write held whole records, replayed as they were read (the replay cannot take
        # them back): once more without them. Only after a crash in the middle of a write.
        cut, reason = report.cut, report.cut_reason
        del image, report  # (not two images at once: each may hold `budget` bytes of messages)
        image, report, last_size, _ = _replay(directory, numbers, budget, last_size)
        report.cut, report.cut_reason = cut, reason
    return image, report, numbers, last_size


def _replay(directory: Path, numbers: list[int], budget: int,
            limit: int | None = None) -> tuple[Image, Recovered, int, int]:
    """`read_journal`'s replay (with `limit`, of the last segment's first `limit` bytes only); also returns how far
    the last segment's records were replayed."""
    image = Image(budget)
    report = Recovered()
    last_size = replayed = 0
    for i, n in enumerate(numbers):
        path = directory / segment_name(n)
        data = path.read_bytes()
        last = i == len(numbers) - 1
        unwritten = R.header_unwritten(data) if last else ""
        if unwritten:
            report.cut, report.cut_reason, last_size = R.nonzero_end(memoryview(data), 0), unwritten, 0
            break
        image.segment = n
        fmt = R.check_header(data, path.name)
        view = memoryview(data)[:limit] if last and limit is not None else data
        _, end = R.scan(view, R.HEADER.size, fmt, into=image)  # replayed as read
        if end.damaged or (end.torn and not last):  # what was replayed of it goes with the image
            raise R.JournalError(
                f"journal damaged in {path.name} at byte {end.good}: {end.reason}. Nothing was changed; to start "
                f"anyway, cut it (from the start of its write; what follows is lost): ha-admin journal cut --data-dir "
                f"DIR")
        report.segments += 1
        if last:
            replayed = end.good
            end = R.last_end(end, R.HEADER.size, fmt)
            last_size = end.good
            if end.torn:
                report.cut, report.cut_reason = end.tail, end.reason
    report.state = image.state
    return image, report, last_size, replayed


class Store(Extension):
    def __init__(self, server: Server, directory: Path, segment_bytes: int = 64 * 1024 * 1024,
                 max_memory: int = 0, stall_halt: float = 0.0, min_disk_free: int = 0) -> None:
        self.server = server
        self.stall_halt = stall_halt  # --journal-stall-halt (0: off)
        self.min_disk_free = min_disk_free  # --min-disk-free (0: off)
        self.low_disk: str | None = None  # why durable messages are refused: the disk is under --min-disk-free
        # A primary's backups whose journal disks are under their --min-disk-free: name -> their reason (ha.primary)
        self.backups_low_disk: dict[str, str] = {}
        self.disk_free = -1  # free bytes on the journal's disk when last looked at (-1: not watched, or unknown)
        self._disk_watch: Any = None  # the timer of the next `_watch_disk`
        self.directory = directory
        self.segment_bytes = segment_bytes
        self.max_memory = max_memory
        self.journal = Journal(directory, segment_bytes)
        self.queues: dict[Queue, _Q] = {}
        self.next_qid = 1
        self.waiting: list[Completion] = []  # durable deliveries of this pass
        # ... and where they were enqueued (`hold`: each delivery's routes; `hold_group`: a queue and its entries),
        # taken off their queues again if the pass's write fails (`take_back`)
        self.held_routes: list[list[tuple[Queue, Entry]]] = []
        self.held_groups: list[tuple[Queue, list[Entry]]] = []
        # Still queued, though the write of their records failed and nobody was refused for them (a backup's
        # replicas, a dead-lettered or moved message): written again with the probe that finds the journal writable
        self.unwritten: list[tuple[Queue, Entry]] = []
        # `when_synced` callbacks while the journal has failed: run once the probe's write is on disk
        self.held_after: list[Callable[[], None]] = []
        self.after: list[Callable[[], None]] = []  # callbacks for when this pass's records are on disk
        self.undos: list[Callable[[str], None]] = []  # this pass's commits (units), undone if its write fails
        self.tickets: deque[tuple[int, list[Completion], list[Callable[[], None]]]] = deque()
        self.dequeues: dict[int, list[int]] = {}  # qid -> positions dequeued this pass (written at its end)
        self.dequeued_top: dict[int, int] = {}  # qid -> the highest of them
        self.segments: list[int] = []  # segment numbers on disk, oldest first
        # segment -> the live count below which compacting it is worth a look again (its live bytes were too many)
        self.declined: dict[int, int] = {}
        self.failed: str | None = None  # why durable work is refused (disk full, I/O error)
        self.stall_reported = False  # journal.sync.stalled was logged and the stall goes on
        self._sync_watch: Any = None  # the timer of the next `_watch_sync`
        self._watchdog: Watchdog | None = None  # notices the loop itself stuck in the journal (`_watch_loop`)
        self.failures = 0
        self.state: dict[str, Any] = {}
        self.recovered = Recovered()
        self._probe: Any = None
        self.journaled: list[Entry] = []  # entries whose records this pass appended (reset if the write fails)
        self.rejournaled: list[tuple[_Q, Entry, int]] = []  # entries written again this pass, and where they were
        self.parking: set[Queue] = set()  # queues that parked messages this pass
        self.paging: set[Queue] = set()  # queues with paged messages
        self.readers: dict[int, int] = {}  # segment -> fd open for reading paged messages back
        self.windowed: dict[Queue, tuple[int, int]] = {}  # durable queues with a duplicate window: (generation,
        #                                                    added) of it as journaled
        # ids of not durable messages (left out of the journal's windows) whose messages went this pass: written now
        self.settled_ids: dict[Queue, list[tuple[bytes, float]]] = {}
        self.settled_at: dict[tuple[Queue, int], tuple[bytes, float]] = {}  # the same by position (a commit undone)
        # What the windows' records of writes not yet made held: restored when the write fails (DEDUP records are
        # not carried), so that the next one writes those ids again: (generation, added) marks, settled ids.
        self.unwritten_marks: dict[Queue, tuple[int, int]] = {}
        self.unwritten_settled: dict[Queue, list[tuple[bytes, float]]] = {}
        self.paged_out = 0  # messages paged out since start (stats)
        self.paged_in = 0
        # queue -> (monotonic) no paged message is read back into it before, after an I/O error reading its own
        self.read_again_at: dict[Queue, float] = {}
        self.read_errors = 0  # reads of paged messages that failed with an I/O error (the messages stayed paged)

    # ----- start ---------------------------------------------------------------------------------------------------
    def recover(self) -> Recovered:
        """Rebuild durable wiring and messages from the journal (before the broker listens). Raises JournalError."""
        t0 = time.monotonic()
        # Millions of objects are made and none is garbage: the cyclic collector would walk them again and again
        # (about a third of the time of a 1M recovery). Off for the replay; `gc.freeze` then keeps them out of
        # later full collections too.
        gc.disable()
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            return self._recover(t0)
        except OSError as e:  # a file that cannot be opened, read or made: name it (not "cannot listen")
            raise R.JournalError(f"journal: {e.filename or self.directory}: {e.strerror or e}") from None
        finally:
            gc.enable()
            gc.freeze()

    def _recover(self, t0: float) -> Recovered:
        budget = int(self.max_memory * PAGEABLE_SHARE * LOW_WATER)  # bodies read; the rest is only indexed
        image, report, numbers, last_size = read_journal(self.directory, budget)
        wiring = self.server.wiring
        for name, doc in image.exchanges.items():
            if name not in wiring.exchanges:
                wiring.declare_exchange(name, doc.get("type", "direct"), doc.get("arguments") or {},
                                        uuid=doc.get("uuid"))
        for qid, doc in sorted(image.queues.items()):
            q, _ = wiring.declare_queue(doc["name"], doc.get("arguments") or {}, uuid=doc.get("uuid"))
            state = self._track(q, qid)
            kept, index = image.split(qid)
            if index is not None and not q.pageable:  # paged before its arguments changed: all back in memory
                unreadable: list[Paged] = []
                kept += self.read(q, list(index.items()), unreadable)
                if unreadable:
                    raise R.JournalError(f"journal: {len(unreadable)} messages of queue {q.name!r} could not be "
                                         "read back (an I/O error): not started without them")
                index = None
            before = q.bytes
            restored = q.restore(kept)
            for seg, n in Counter(e.seg >> 32 for e in restored).items():
                _count(state.live, seg, n)
            report.messages += len(restored)
            report.bytes += q.bytes - before  # restore counted them
            if q.options.lvq_key is not None:
                q.rebuild_last_values(last_value_key_of)  # a message published after the restart replaces its key's recovered one
            if index is not None:
                q.paged = index
                q.plain = False
                self.paging.add(q)
                for _, loc, size in index.items():
                    _count(state.live, loc >> 32, 1)
                    _count(state.paged, loc >> 32, 1)
                    report.bytes += size
                report.messages += index.count
                report.paged += index.count
                q.next_position = max(q.next_position, (index.last() or 0) + 1)  # (restore saw the kept ones)
            # A message enqueued and consumed since the last checkpoint (its QUEUE record's `next`) left only its
            # DEQUEUE record: its position is not taken again either.
            q.next_position = max(q.next_position, int(doc.get("next", 1)), image.dequeued_top.get(qid, 0) + 1)
            window = image.window(qid)
            if window and q.dedup is not None:
                q.dedup.replace(window, time.time())
            self.next_qid = max(self.next_qid, qid + 1)
            report.queues += 1
        for (ex, qn, key), doc in image.bindings.items():
            if ex in wiring.exchanges and qn in wiring.queues:
                wiring.bind(ex, qn, key, doc.get("arguments") or {})
                report.bindings += 1
        report.exchanges = len(image.exchanges)
        self.state = dict(image.state)
        if numbers and last_size == 0:  # the last segment's header never reached the disk: nothing in it counts
            (self.directory / segment_name(numbers.pop())).unlink()
        elif numbers and (report.cut or (self.directory / segment_name(numbers[-1])).stat().st_size > last_size):
            self.journal.reopen(numbers[-1], last_size)  # cut the torn tail, or the zeros it was not written into
            self.journal.close()
            self.journal = Journal(self.directory, self.segment_bytes)
        elif numbers:  # the last run's last writes may be in the page cache only: on disk before a newer segment is
            last = self.directory / segment_name(numbers[-1])  # (only the last segment may ever be torn)
            try:
                sync_path(last)
            except OSError as e:
                raise R.JournalError(f"journal: fsync of {last.name} failed ({e.strerror or e})") from None
        self.segments = numbers
        report.seconds = round(time.monotonic() - t0, 3)
        self.recovered = report
        return report

    def started(self, server: Server) -> None:
        """Recovered: watch the wiring and the durable queues, open a new segment with a checkpoint."""
        w = self.server.wiring
        w.observers.append(self)
        w.queue_observer_factories.append(self._watch)
        for q in w.queues.values():
            if q.options.durable:
                self._track(q, self.queues[q].qid if q in self.queues else None)
                if self not in q.observers:
                    q.observers.append(self)  # type: ignore[arg-type]
        self.journal.start(self._synced, self._sync_failed, self.server.engine)
        self._sync_watch = self.server.schedule(PROBE_INTERVAL, self._watch_sync)
        if self.min_disk_free:
            self._watch_disk()
        self._watchdog = Watchdog(self._watch_loop, PROBE_INTERVAL)
        self._watchdog.start()
        self.journal.defer_inline = True
        self.server.engine.after_flush = self.sync_deferred
        try:
            self._roll()
        except BrokerError as e:  # e.g. the disk is full: serve what needs no disk, refuse durable messages
            self._fail(str(e), [])
            return
        self._commit()

    def stopping(self) -> None:
        self._commit()

    def close(self) -> None:
        for timer in (self._sync_watch, self._probe, self._disk_watch):  # none may run on a closed journal
            if timer is not None:
                timer.cancel()
        self._sync_watch = self._probe = self._disk_watch = None
        if self._watchdog is not None:
            self._watchdog.stop()
            self._watchdog = None
        self.journal.close()
        for fd in self.readers.values():
            os.close(fd)
        self.readers.clear()

    # ----- what is durable -----------------------------------------------------------------------------------------
    def _track(self, q: Queue, qid: int | None = None) -> _Q:
        st = self.queues.get(q)
        if st is None:
            if qid is None:
                qid = self.next_qid
                self.next_qid += 1
            st = self.queues[q] = _Q(qid)
            q.pager = self
            if q.dedup is not None:
                self.windowed[q] = (-1, 0)  # written whole at the end of the pass
        return st

    def _watch(self, q: Queue) -> Store | None:
        return self if q.options.durable else None

    # ----- wiring (observer) ---------------------------------------------------------------------------------------
    def wiring_changed(self, ev: WiringEvent) -> None:
        w = self.server.wiring
        a = ev.attributes
        if ev.type == "queue":
            q = w.queues.get(ev.name)
            if ev.kind == "declared" and q is not None and q.options.durable:
                st = self._track(q)
                self.journal.append(R.queue(st.qid, q.name, q.uuid, q.arguments, q.next_position))
            elif ev.kind == "deleted":
                for dq, st in list(self.queues.items()):
                    if dq.name == ev.name and dq.deleted:
                        del self.queues[dq]
                        self.windowed.pop(dq, None)
                        self.paging.discard(dq)
                        self.parking.discard(dq)
                        self.journal.append(R.unqueue(st.qid))
                        self.dequeues.pop(st.qid, None)
                        self.dequeued_top.pop(st.qid, None)
        elif ev.type == "exchange":
            ex = w.exchanges.get(ev.name)
            if ev.kind == "declared" and ex is not None and ex.arguments.get("durable"):
                self.journal.append(R.document(R.EXCHANGE, {"name": ex.name, "type": ex.type, "uuid": ex.uuid,
                                                            "arguments": ex.arguments}))
            elif ev.kind == "deleted":
                self.journal.append(R.document(R.UNEXCHANGE, {"name": ev.name}))
        elif ev.type == "binding":
            ex_name, q_name, key = a.get("source"), a.get("destination"), a.get("binding-key", "")
            if ev.kind == "bound" and self._durable_ends(ex_name, q_name):
                self.journal.append(R.document(R.BIND, {"exchange": ex_name, "queue": q_name, "key": key,
                                                        "arguments": a.get("arguments") or {}}))
            elif ev.kind == "unbound":
                self.journal.append(R.document(R.UNBIND, {"exchange": ex_name, "queue": q_name, "key": key}))

    def _durable_ends(self, exchange: Any, queue: Any) -> bool:
        w = self.server.wiring
        ex, q = w.exchanges.get(exchange), w.queues.get(queue)
        return ex is not None and q is not None and bool(ex.arguments.get("durable")) and q.options.durable

    def record_state(self, epoch: int, role: str, state: str, ready_epoch: int = 0, **more: Any) -> None:
        """The broker's HA standing, for ranking stores after a whole-cluster restart (`more`: JSON values the HA
        layer adds, e.g. the member list it last knew, ha.core.restart)."""
        self.state = {"epoch": epoch, "role": role, "state": state, "ready_epoch": ready_epoch, **more,
                      "time": time.time()}
        self.journal.append(R.document(R.STATE, self.state))

    # ----- queues (observer of durable queues) ---------------------------------------------------------------------
    def enqueued(self, queue: Queue, entry: Entry) -> None:
        flags = entry.flags
        if not flags & (DURABLE | PARKED):  # a parked message is spilled to disk even if it is not durable
            return
        st = self.queues.get(queue)
        if st is None:
            return
        qid = st.qid
        if entry.position <= self.dequeued_top.get(qid, 0):
            # The position was dequeued earlier in this pass and is taken again (a backup's catch-up replacing a
            # message an older epoch gave the same position): its dequeue must precede this record on disk, or
            # recovery would drop the new message.
            self._write_dequeues(qid, self.dequeues.pop(qid))
            del self.dequeued_top[qid]
        j = self.journal
        entry.seg = j.segment << 32 | (j.size + j.pending_bytes)
        j.append(R.enqueue(qid, entry.position, entry.level, flags & _FLAGS, entry.count, entry.expires,
                            entry.data))
        self.journaled.append(entry)
        seg = j.segment
        st.live[seg] = st.live.get(seg, 0) + 1
        if flags & PARKED:
            self.parking.add(queue)

    def acquired(self, queue: Queue, entry: Entry) -> None:
        pass

    def released(self, queue: Queue, entry: Entry) -> None:
        pass

    def recounted(self, queue: Queue, entry: Entry) -> None:
        """A failed delivery of a journaled message: its record is written again with the new delivery count (and
        flags); recovery keeps the later record of a position, so --delivery-limit and the delivery-count a consumer
        sees survive a restart. Rare (a consumer that failed or vanished), so the message is simply written again."""
        loc = entry.seg
        st = self.queues.get(queue)
        if not loc or st is None or entry.state == PAGED or not entry.flags & DURABLE:
            return
        self._write_again(st.qid, entry)
        self.rejournaled.append((st, entry, loc))
        _count(st.live, loc >> 32, -1)
        seg = self.journal.segment
        st.live[seg] = st.live.get(seg, 0) + 1

    def _write_again(self, qid: int, entry: Entry) -> None:
        """Append a journaled message's record again at the journal's end and point the entry at it (the cold
        paths: a new delivery count, compaction; `enqueued` writes the first record inline, once per message)."""
        j = self.journal
        entry.seg = j.segment << 32 | (j.size + j.pending_bytes)
        j.append(R.enqueue(qid, entry.position, entry.level, entry.flags & _FLAGS, entry.count, entry.expires,
                           entry.data))

    def dequeued(self, queue: Queue, entry: Entry, reason: DequeueReason) -> None:
        w = queue.dedup
        if w is not None and w.volatile:
            # The id of a not durable message, left out of the journal while it was queued (a restart loses the
            # message, so a resend must be taken): kept over a restart from now on (a resend would deliver it
            # twice). By position: a paged message's stand-in has no body to read the id from.
            settled = w.settled(entry.position)
            if settled is not None:
                self.settled_ids.setdefault(queue, []).append(settled)
                self.settled_at[(queue, entry.position)] = settled
        loc = entry.seg
        if not loc:
            return
        st = self.queues.get(queue)
        if st is None:
            return
        qid, pos = st.qid, entry.position
        self.dequeues.setdefault(qid, []).append(pos)
        if pos > self.dequeued_top.get(qid, 0):
            self.dequeued_top[qid] = pos
        seg = loc >> 32
        st.live[seg] -= 1
        if entry.state == PAGED:  # dequeued while on disk only
            _count(st.paged, seg, -1)

    def reinstated(self, queue: Queue, entry: Entry) -> None:
        """Its dequeue, in a unit whose write failed, is void: its record on disk counts as live again. One whose
        record was in that write too is written again once the journal can write (unless taken back meanwhile:
        its publisher was refused). A not durable one's id is left out of the journal again."""
        w = queue.dedup
        settled = self.settled_at.pop((queue, entry.position), None)
        if settled is not None and w is not None:
            w.unsettle(*settled, entry.position)  # (still in `settled_ids`: volatile again, the write leaves it out)
        st = self.queues.get(queue)
        if st is None:
            return
        if entry.seg:  # (as `dequeued` counted it off, and noted it to journal)
            seg = entry.seg >> 32
            st.live[seg] = st.live.get(seg, 0) + 1
            positions = self.dequeues.get(st.qid)
            if positions and entry.position in positions:  # (undone within the commit: not written yet)
                positions.remove(entry.position)
                if not positions:
                    del self.dequeues[st.qid]
                    self.dequeued_top.pop(st.qid, None)
        elif entry.flags & DURABLE:
            self.unwritten.append((queue, entry))

    # ----- completions ---------------------------------------------------------------------------------------------
    def hold(self, completion: Completion, routed: list[tuple[Queue, Entry]]) -> bool:
        for _, e in routed:
            if e.seg and e.flags & DURABLE:
                self.waiting.append(completion)
                self.held_routes.append(routed)
                return True
        return False

    def hold_group(self, queue: Queue, completions: list[Completion], entries: list[Entry]) -> bool:
        if queue not in self.queues and not queue.deleted:  # not journaled (a queue deleted in this pass may be)
            return False
        held = [c for c, e in zip(completions, entries, strict=True) if e.seg and e.flags & DURABLE]
        if len(held) == len(completions):
            self.waiting.extend(held)
            self.held_groups.append((queue, entries))
            return True
        for c in held:  # durable and non-durable messages in one pass: only the durable ones wait for the disk
            c.pending += 1
        self.waiting.extend(held)
        self.held_groups.append((queue, [e for e in entries if e.seg and e.flags & DURABLE]))
        return False

    def refusing(self) -> str | None:
        """Why durable messages are refused now (None: they are taken): this journal cannot write, or its disk or
        a backup's is under --min-disk-free (RabbitMQ's disk alarm blocks publishers cluster-wide)."""
        if self.failed or self.low_disk or not self.backups_low_disk:
            return self.failed or self.low_disk
        name = min(self.backups_low_disk)
        return f"backup {name}: {self.backups_low_disk[name]}"

    def backup_low_disk(self, name: str, why: str | None) -> None:
        """A primary's backup reported its journal disk under (`why`) or back over (None) its --min-disk-free, or
        left (None)."""
        if why is None:
            if self.backups_low_disk.pop(name, None) is not None:
                self.server.refresh_refusing()
        elif self.backups_low_disk.get(name) != why:
            self.backups_low_disk[name] = why
            self.server.refresh_refusing()

    def when_synced(self, fn: Callable[[], None]) -> None:
        """Call `fn` once everything journaled so far is on disk (now, if it is); dequeues gathered in this pass
        count as journaled (they are written at the end of it)."""
        if self.failed is not None:  # what it waits for may be in no write yet (carried, or to be written again)
            self.held_after.append(fn)
        elif self.journal.pending or self.waiting or self.dequeues:
            self.after.append(fn)
        elif not self._hold([], [fn]):
            fn()

    # ----- once per pass -------------------------------------------------------------------------------------------
    def end_of_pass(self) -> bool:
        if self.windowed or self.settled_ids:
            self._journal_windows(False)
        self._flush_dequeues()
        wrote = self._commit()
        if self.journal.full() and self.failed is None:
            try:
                self._roll()
            except BrokerError as e:
                self._fail(str(e), [])
            self._commit()
        if self.parking:
            parking, self.parking = self.parking, set()
            for q in parking:
                self._count_paged(q, q.page_parked())
                if q.parked:
                    self.parking.add(q)  # the journal could not write them: again once it can
        return wrote

    def _flush_dequeues(self) -> None:
        """Journal the dequeues gathered so far in this pass."""
        if self.dequeues:
            dq, self.dequeues = self.dequeues, {}
            self.dequeued_top.clear()
            for qid, positions in dq.items():
                self._write_dequeues(qid, positions)

    def begin_unit(self) -> None:
        """A transaction's commit starts: what it journals until `end_unit` stands or falls together at recovery
        (and on a failed write); what the pass journaled before it (consumers' dequeues too) goes before it."""
        self._flush_dequeues()
        self.journal.begin_unit()

    def end_unit(self, undo: Callable[[str], None]) -> None:
        """The commit is applied: its dequeues into the unit, and what the pass journals after it goes after it
        (carried like any other if the write fails). If the unit holds records and the pass's write fails, `undo`
        is called with the reason, before anything waiting for the write is answered or replicated: the commit
        fails whole in memory as on disk."""
        self._flush_dequeues()
        if self.journal.end_unit():
            self.undos.append(undo)

    def _write_dequeues(self, qid: int, positions: list[int]) -> None:
        """Journal dequeues of one queue as ranges."""
        positions.sort()
        lo = hi = positions[0]
        for p in positions[1:]:
            if p == hi + 1:
                hi = p
            else:
                self.journal.append(R.dequeue(qid, lo, hi))
                lo = hi = p
        self.journal.append(R.dequeue(qid, lo, hi))

    def _journal_windows(self, whole: bool) -> None:
        """The ids the pass added to duplicate windows (in the pass's write, after its messages: recovery keeps a
        write whole or cuts it whole, `R.last_end`); `whole`: every window as it is (a checkpoint)."""
        settled, self.settled_ids = self.settled_ids, {}
        for q, (generation, mark) in self.windowed.items():
            w, st = q.dedup, self.queues.get(q)
            if w is None or st is None:
                continue
            late = settled.get(q)
            reset = whole or w.generation != generation
            if reset:
                items = w.items()  # (with the ids settled this pass)
            elif w.added != mark or late:
                items = w.since(mark)
                if late:
                    have = {k for k, _ in items}
                    items += [(k, t) for k, t in late if k not in have]
            else:
                continue
            if w.volatile:  # ids of not durable messages still queued: not kept over a restart
                items = [(k, t) for k, t in items if k not in w.volatile]
            if items or reset:
                self.journal.append(R.dedup(st.qid, items, reset))
            self.unwritten_marks.setdefault(q, (generation, mark))
            if late:
                self.unwritten_settled.setdefault(q, []).extend(late)
            self.windowed[q] = (w.generation, w.added)

    def _commit(self) -> bool:
        """Write what the pass journaled; True if anything was written (the server then goes round once more, so
        that whatever the rest of the pass journals is written in it too)."""
        try:
            return self._write_pass()
        finally:
            self.settled_at.clear()  # (only a commit undone by this write's failure looks them up)

    def _write_pass(self) -> bool:
        waiting, after = self.waiting, self.after
        journaled, self.journaled = self.journaled, []
        rejournaled, self.rejournaled = self.rejournaled, []
        routes, groups = self.held_routes, self.held_groups
        self.held_routes, self.held_groups = [], []
        undos, self.undos = self.undos, []
        if not waiting and not after and not self.journal.pending:
            return False
        self.waiting, self.after = [], []
        try:
            ticket = self.journal.commit()
        except BrokerError as e:  # JournalFull / SegmentFull / JournalError: nothing of it is on disk
            kept = self._unjournal(journaled)
            self._unmove(rejournaled)
            for undo in reversed(undos):  # the last commit first: it may have taken what an earlier one put there
                undo(str(e))
            self._fail(str(e), waiting)
            self.take_back(routes, groups)
            self.unwritten += [(q, m) for q, m in kept if q.entries.get(m.position) is m and not m.flags & PARKED]
            self.held_after += after  # not on disk: they wait for the write that finds the journal writable
            return False
        self.unwritten_marks.clear()
        self.unwritten_settled.clear()
        if not self._hold(waiting, after):  # nothing written, or written synchronously
            for c in waiting:
                c.release()
            for fn in after:
                fn()
            return False
        self._take_sync_error()
        return ticket is not None

    def _rewrite_windows(self) -> None:
        """A write failed, with the windows' records of every pass since the last write that succeeded: the next
        one writes their ids again (DEDUP records are not carried: a refused message's id must leave the window,
        and `forget` has taken it out already)."""
        for q, mark in self.unwritten_marks.items():
            if q in self.windowed:
                self.windowed[q] = mark
        for q, items in self.unwritten_settled.items():
            if q in self.windowed:
                self.settled_ids[q] = items + self.settled_ids.get(q, [])
        self.unwritten_marks.clear()
        self.unwritten_settled.clear()

    def _hold(self, waiting: list[Completion], after: list[Callable[[], None]]) -> bool:
        """Hold them until every write made so far is on disk (a compaction's or a roll-over's too, which no ticket
        of ours names); False when it is, once what waited for earlier writes has been let go."""
        j, tickets = self.journal, self.tickets
        if j.synced >= j.ticket:
            if tickets:
                self._synced(j.synced)
            return False
        if not tickets or tickets[-1][0] != j.ticket:
            tickets.append((j.ticket, [], []))
        tickets[-1][1].extend(waiting)
        tickets[-1][2].extend(after)
        return True

    def _take_sync_error(self) -> None:
        """An inline fdatasync failed (`Journal.sync_error`): what waited for it is refused as for the syncer's."""
        if self.journal.sync_error is not None:
            (ticket, error), self.journal.sync_error = self.journal.sync_error, None
            self._sync_failed(ticket, error)

    def _unjournal(self, entries: list[Entry]) -> list[tuple[Queue, Entry]]:
        """Their records were not written: they are not journaled (and a parked one waits for the journal).
        Returns those still on a queue, with it."""
        kept = []
        for e in entries:
            loc, e.seg = e.seg, 0
            for q, st in self.queues.items():
                if q.entries.get(e.position) is e:
                    _count(st.live, loc >> 32, -1)
                    kept.append((q, e))
                    break
        return kept

    @staticmethod
    def take_back(routes: list[list[tuple[Queue, Entry]]], groups: list[tuple[Queue, list[Entry]]]) -> None:
        """The write of the refused deliveries failed: their publishers are told they were not taken, so they are
        taken off every queue they were put on (broker.queue `take_back`)."""
        take_back([pair for routed in routes for pair in routed])
        take_back([(q, e) for q, entries in groups for e in entries])

    def _unmove(self, moved: list[tuple[_Q, Entry, int]]) -> None:
        """Records written again were not: each message is where its last record on disk is (its older count), and
        counted live there. One dequeued meanwhile was counted off where it was moved to: its old place stays off."""
        for st, e, loc in reversed(moved):  # a message written again twice in a pass: back to the first place
            if not e.seg:
                continue  # its first record was in the failed write too (`_unjournal`)
            if e.state != DEAD:
                _count(st.live, e.seg >> 32, -1)
                st.live[loc >> 32] = st.live.get(loc >> 32, 0) + 1
            e.seg = loc

    def sync_deferred(self) -> bool:
        """After the loop wrote its sockets: the pass's small commit is synced now (`Journal.sync_deferred`) and what
        waited for it is released; True if anything was."""
        ticket = self.journal.sync_deferred()
        if ticket is None:
            self._take_sync_error()
            return False
        self._synced(ticket)
        return True

    def _synced(self, ticket: int) -> None:
        self.journal.mark_synced(ticket)
        tickets = self.tickets
        while tickets and tickets[0][0] <= ticket:
            _, completions, after = tickets.popleft()
            for c in completions:
                c.release()
            for fn in after:
                fn()

    def _sync_failed(self, ticket: int, error: OSError) -> None:
        tickets = self.tickets
        failed: list[Completion] = []
        while tickets and tickets[0][0] <= ticket:
            _, completions, after = tickets.popleft()
            failed += completions
            self.held_after += after  # not known on disk: they wait for the write that finds the journal writable
        self._fail(f"journal: fdatasync failed ({error.strerror or error})", failed)

    def _fail(self, reason: str, completions: list[Completion]) -> None:
        """Durable work cannot be journaled: refuse what was waiting, refuse new durable messages until a write
        succeeds again (probed every second)."""
        self._rewrite_windows()  # (a roll-over's checkpoint too)
        for c in completions:
            c.fail("amqp:resource-limit-exceeded", reason)
        if self.failed is None:
            log.error("journal.failed", description=reason, refused=len(completions))
        self.failed = reason
        self.server.refresh_refusing()
        self.failures += 1
        if self._probe is None:
            # A commit too big for its segment (SegmentFull) needs only a new segment: the probe makes it in the
            # next turn of the loop. Not in this pass: a backup that applied the refused messages must see the
            # failure at its end of the pass and leave, not acknowledge them.
            delay = 0.0 if self.journal.overflowed else PROBE_INTERVAL
            self._probe = self.server.schedule(delay, self._retry)

    def sync_wait(self) -> float:
        """Seconds the oldest journal write has waited for its fdatasync (0 while the journal has failed: the
        failure is what shows, and the writes it covered are not waited for)."""
        return 0.0 if self.failed is not None else self.journal.unsynced_for(time.monotonic())

    def stalled(self) -> str | None:
        """Why durable messages wait longer than the disk should take (ha-status), or None."""
        waited = self.sync_wait()
        if waited < SYNC_STALLED:
            return None
        syncer = self.journal.syncer
        who = f", or the sync process (pid {syncer.pid}) is stopped" if isinstance(syncer, SyncProcess) else ""
        return f"no fdatasync has returned for {waited:.0f} s: the disk hangs{who}; durable messages wait for it"

    def _watch_sync(self) -> None:
        """Once a second: log a journal sync that hangs (`journal.sync.stalled`) and its end; end the broker if it
        hangs for --journal-stall-halt."""
        waited = self.sync_wait()
        if self.stall_halt and waited >= self.stall_halt:
            _halt(f"no fdatasync has returned for {waited:.0f} s", waited, self.stall_halt)
        if waited >= SYNC_STALLED and not self.stall_reported:
            self.stall_reported = True
            log.warning("journal.sync.stalled", description=self.stalled(), seconds=round(waited, 1))
        elif waited < SYNC_STALLED and self.stall_reported:
            self.stall_reported = False
            log.warning("journal.sync.resumed", description="the journal's fdatasyncs return again")
        self._sync_watch = self.server.schedule(PROBE_INTERVAL, self._watch_sync)

    def _watch_disk(self) -> None:
        """Once a second with --min-disk-free: durable messages are refused while the journal's disk has less free
        space than that, and taken again once it has (RabbitMQ's disk alarm, Artemis' max-disk-usage): the broker
        stops taking what it must write before the disk is full, rather than failing a write. Each broker judges
        its own disk; a backup goes on applying what its primary sends (its acknowledgements are what keeps
        the primary's messages safe) and tells its primary, which refuses durable messages while any backup's disk
        is low (`backups_low_disk`; ha.backup's disk reports)."""
        self._disk_watch = self.server.schedule(PROBE_INTERVAL, self._watch_disk)
        free = _free_bytes(self.directory, -1)
        if free < 0:
            return  # cannot tell: as it was
        self.disk_free, limit = free, self.min_disk_free
        if free < limit and self.low_disk is None:
            self.low_disk = (f"the journal's disk has {_size(free)} free, under --min-disk-free {_size(limit)}: "
                             "durable messages are refused until there is room")
            log.warning("journal.disk.low", free=free, limit=limit, description=self.low_disk)
            self.server.refresh_refusing()
        elif free >= limit and self.low_disk is not None:
            self.low_disk = None
            log.warning("journal.disk.ok", free=free, limit=limit,
                        description=f"the journal's disk has {_size(free)} free again (--min-disk-free "
                                    f"{_size(limit)}): durable messages are taken")
            self.server.refresh_refusing()

    def _watch_loop(self) -> None:
        """On the watchdog thread, once a second: the event loop itself has waited SYNC_STALLED or more in a write or
        fdatasync of the journal (a small commit synced inline, a roll-over, a write into a frozen file system).
        Logged from here because the loop cannot (nor can it answer `ha-status` meanwhile); the loop logs
        `journal.sync.resumed` once it runs again and the sync is done (`_watch_sync`)."""
        since = self.journal.blocked_since
        if not since:
            return
        waited = time.monotonic() - since
        if self.stall_halt and waited >= self.stall_halt:
            _halt(f"the event loop has waited {waited:.0f} s in a journal write or fdatasync", waited, self.stall_halt)
        if waited >= SYNC_STALLED and not self.stall_reported:
            self.stall_reported = True
            _off_thread(lambda: log.warning(
                "journal.sync.stalled", seconds=round(waited, 1),
                description=f"the event loop has waited {waited:.0f} s in a journal write or fdatasync: the disk hangs "
                            "or its file system is frozen; the broker serves nothing until it returns"))

    def _retry(self) -> None:
        self._probe = None
        if self.failed is None:
            return
        if _free_bytes(self.directory) < PROBE_HEADROOM:
            # A probe record of a few hundred bytes may still fit on a disk too full for the next real commit:
            # declaring the journal writable then would flap (failed / writable every second, and each durable
            # publisher refused in between). Wait for room.
            self._probe = self.server.schedule(PROBE_INTERVAL, self._retry)
            return
        try:
            if self.journal.fd < 0 or self.journal.full():  # no segment yet (failed at start), or time for one
                self._roll()
            else:
                self.journal.append(R.document(R.STATE, self.state or {"probe": time.time()}))
        except BrokerError as e:
            self.failed = str(e)
            if self._probe is None:  # (a failed sync has scheduled it: `_fail`)
                self._probe = self.server.schedule(PROBE_INTERVAL, self._retry)
            return
        # What is still queued unwritten goes with the probe: once the journal is declared writable it holds
        # everything this broker keeps (a backup about to rejoin tells its primary what it holds).
        unwritten, self.unwritten = self.unwritten, []
        for q, entry in unwritten:
            if not entry.seg and q.entries.get(entry.position) is entry:
                self.enqueued(q, entry)
        for q in self.parking:  # parked while the journal could not write
            for p in q.parked:
                if not p.seg:
                    self.enqueued(q, p)
        held, self.held_after = self.held_after, []
        self.after += held  # run once this write is on disk
        failures = self.failures
        self._commit()  # a failure undoes it all as in a pass (compaction's moves included) and probes again
        if self.failures != failures:
            return
        log.warning("journal.writable", description=f"writes succeed again after: {self.failed}")
        self.failed = None
        self.server.refresh_refusing()

    # ----- segments ------------------------------------------------------------------------------------------------
    def _roll(self) -> None:
        """Start a new segment with a checkpoint of the wiring; once that is on disk (until then the older segments
        hold the wiring and the duplicate windows), drop or compact the oldest segments. Raises BrokerError."""
        number = (max(self.segments) if self.segments else 0) + 1
        try:
            self.journal.open_segment(number)
            self.segments.append(number)
            self._checkpoint()
            self.journal.commit_synced()  # with what earlier failed commits carried
        except SyncFailed as e:  # what was written since the last good fdatasync is not known on disk
            self._sync_failed(e.ticket, e.error)
            raise
        except BrokerError:
            self._rewrite_windows()  # (a probe's roll-over fails without `_fail`)
            raise
        self.unwritten_marks.clear()  # every window whole in the checkpoint, on disk
        self.unwritten_settled.clear()
        self._synced(self.journal.synced)
        self._tidy()

    def _checkpoint(self) -> None:
        w = self.server.wiring
        j = self.journal
        for ex in w.exchanges.values():
            if ex.arguments.get("durable"):
                j.append(R.document(R.EXCHANGE, {"name": ex.name, "type": ex.type, "uuid": ex.uuid,
                                                 "arguments": ex.arguments}))
        for q, st in self.queues.items():
            j.append(R.queue(st.qid, q.name, q.uuid, q.arguments, q.next_position))
        for b in w.bindings():
            if self._durable_ends(b.exchange, b.queue):
                j.append(R.document(R.BIND, {"exchange": b.exchange, "queue": b.queue, "key": b.key,
                                             "arguments": b.arguments}))
        if self.state:
            j.append(R.document(R.STATE, self.state))
        self._journal_windows(True)

    def live(self, segment: int) -> int:
        return sum(st.live.get(segment, 0) for st in self.queues.values())

    def _tidy(self) -> None:
        """Drop the oldest segments once nothing on them is live; compact the oldest when little of it is."""
        current = self.journal.segment
        while len(self.segments) > 1 and self.segments[0] != current and self.live(self.segments[0]) == 0:
            dead = self.segments.pop(0)
            self.declined.pop(dead, None)
            for st in self.queues.values():
                st.live.pop(dead, None)
            fd = self.readers.pop(dead, None)
            if fd is not None:
                os.close(fd)
            self.journal.drop_segment(dead)
            log.info("journal.segment.dropped", segment=dead)
        if len(self.segments) > 2:
            oldest = self.segments[0]
            live = self.live(oldest)
            size = (self.directory / segment_name(oldest)).stat().st_size
            paged = any(st.paged.get(oldest) for st in self.queues.values())
            limit = size * COMPACT_LIVE_FRACTION
            if live and not paged and live < self.declined.get(oldest, live + 1) and \
                    self._live_bytes(oldest) < limit and not self._compact(oldest, limit):
                self.declined[oldest] = live // 2  # looked at again once half of them are gone

    def _live_bytes(self, segment: int) -> int:
        """About the bytes of `segment` its live messages take: each queue's live count there times the mean size
        of its messages (a queue's messages are mostly alike). A fixed guess per record compacted segments of big
        messages that were all live, and the copy, as big, filled the next segment at once: a compaction every
        pass, forever."""
        total = 0
        for q, st in self.queues.items():
            n = st.live.get(segment)
            if n:
                total += n * ((q.bytes // len(q.entries) if q.entries else 0) + R.ENQUEUE_OVERHEAD)
        return total

    def _compact(self, segment: int, limit: float) -> bool:
        """Write the live messages of `segment` again at the end, unless they take `limit` bytes or more (False:
        the estimate was wrong, a queue's messages of unlike sizes); the segment is then dead (dropped at the next
        roll)."""
        current = self.journal.segment
        found = [(st, [e for e in q.entries.values() if e.seg >> 32 == segment])
                 for q, st in self.queues.items() if st.live.get(segment)]
        if sum(len(e.data) + R.ENQUEUE_OVERHEAD for _, es in found for e in es) >= limit:
            return False
        moved: list[tuple[Entry, int]] = []
        counts: list[tuple[_Q, int]] = []
        for st, es in found:
            for e in es:
                moved.append((e, e.seg))
                self._write_again(st.qid, e)
            n = st.live.pop(segment)
            counts.append((st, n))
            st.live[current] = st.live.get(current, 0) + n
        try:
            self.journal.commit()  # now: if it fails, the messages stay where they were
        except BrokerError:
            for e, loc in moved:
                e.seg = loc
            for st, n in counts:
                _count(st.live, current, -n)
                st.live[segment] = n
            raise
        log.info("journal.segment.compacted", segment=segment, moved=len(moved))
        return True

    # ----- flow to disk --------------------------------------------------------------------------------------------
    def _count_paged(self, q: Queue, out: list[Entry]) -> None:
        if not out:
            return
        st = self.queues[q]
        for e in out:
            _count(st.paged, e.seg >> 32, 1)
        self.paged_out += len(out)
        self.paging.add(q)

    def page_out(self, q: Queue, max_bytes: int, floor: int = 0) -> int:
        """Page out about `max_bytes` of memory from the top of `q`, no message at or below position `floor`;
        returns the bytes freed."""
        out = q.page_out(max_bytes, JOURNALED_ENTRY_COST, floor)
        self._count_paged(q, out)
        return sum(len(e.data) for e in out) + len(out) * (JOURNALED_ENTRY_COST - PAGED_COST)

    def page_in(self, q: Queue, max_bytes: int, max_count: int = 10_000, whole: bool = False) -> int:
        """Read back the lowest paged messages of `q` (about `max_bytes`: at least one, unless `whole`, then none
        that would go beyond it); returns the bytes of memory taken."""
        if self.read_again_at and time.monotonic() < self.read_again_at.get(q, 0.0):
            return 0
        items = q.next_paged(max_count, max_bytes, whole)
        if not items:
            if q.paged is None and not q.parked:
                self.paging.discard(q)
            return 0
        unreadable: list[Paged] = []
        entries = self.read(q, items, unreadable)
        if unreadable:  # an I/O error: from the first it hit on, back on the index (in order), read again later
            cut = unreadable[0][0]
            entries = [e for e in entries if e.position < cut]
            back = [p for p in items if p[0] >= cut]
            assert q.paged is not None
            for p in back:
                q.paged.add(*p)
            items = items[: len(items) - len(back)]
            self.read_again_at[q] = time.monotonic() + READ_RETRY
        elif self.read_again_at:
            self.read_again_at.pop(q, None)
        st = self.queues.get(q)
        if st is not None:
            read = {e.position for e in entries}
            for pos, loc, _ in items:  # each leaves the paged index; one that could not be read leaves the queue
                _count(st.paged, loc >> 32, -1)
                if pos not in read:  # (journal.read_failed): nothing live holds its segment back from being dropped
                    _count(st.live, loc >> 32, -1)
        q.load(entries)
        self.paged_in += len(entries)
        if q.paged is None and not q.parked:
            self.paging.discard(q)
        self.server.wake_queue(q)
        return sum(len(e.data) for e in entries) + len(entries) * (JOURNALED_ENTRY_COST - PAGED_COST)

    def read(self, queue: Queue, paged: list[Paged], unreadable: list[Paged] | None = None) -> list[Entry]:
        """Paged messages of `queue` read back from their records, as new entries (not on any queue), in the order
        given. A record whose segment cannot be read now (an I/O error) is left out and added to `unreadable`: it
        stays on its queue, and is read again later. A damaged record is logged and left out (its message is
        lost). On a queue with a duplicate window they come back marked WINDOWED (a record does not say whether
        the message's id entered the window): consumed, one is replicated as one whose id did (ha.replicating)."""
        windowed = WINDOWED if queue.dedup is not None else 0
        st = self.queues.get(queue)
        if st is None:
            return []
        out: list[Entry] = []
        i, n = 0, len(paged)
        while i < n:
            seg, start = paged[i][1] >> 32, paged[i][1] & LOC_OFFSET
            j = i + 1
            while j < n:  # one read for the records that follow each other in the same segment
                loc = paged[j][1]
                if loc >> 32 != seg or loc <= paged[j - 1][1] or (loc & LOC_OFFSET) - start > READ_SPAN:
                    break
                j += 1
            last = paged[j - 1]
            end = (last[1] & LOC_OFFSET) + R.ENQUEUE_OVERHEAD + last[2]
            try:
                buf = os.pread(self._reader(seg), end - start, start)
            except OSError as err:
                self.read_errors += 1
                log.error("journal.read_error", queue=queue.name, count=j - i, segment=seg,
                          description=f"segment {seg}: {err.strerror or err}")
                fd = self.readers.pop(seg, None)  # opened again for the next try
                if fd is not None:
                    os.close(fd)
                if unreadable is not None:
                    unreadable += paged[i:j]
                i = j
                continue
            for pos, loc, _ in paged[i:j]:
                try:
                    qid, rpos, level, flags, count, expires, data = R.read_enqueue(
                        buf, (loc & LOC_OFFSET) - start, f"{segment_name(seg)} at byte {loc & LOC_OFFSET}")
                    if (qid, rpos) != (st.qid, pos):
                        raise R.JournalError(f"{segment_name(seg)} at byte {loc & LOC_OFFSET}: the record is of "
                                             f"another message ({qid}:{rpos})")
                except R.JournalError as err:
                    self._lost(queue, [(pos, loc, 0)], str(err))
                    continue
                entry = Entry(pos, data, level, expires, flags & _FLAGS | windowed)
                entry.count = count
                entry.seg = loc
                out.append(entry)
            i = j
        return out

    def _reader(self, segment: int) -> int:
        fd = self.readers.get(segment)
        if fd is None:
            fd = self.readers[segment] = os.open(self.directory / segment_name(segment), os.O_RDONLY | os.O_CLOEXEC)
        return fd

    def _lost(self, queue: Queue, paged: list[Paged], why: str) -> None:
        log.error("journal.read_failed", queue=queue.name, count=len(paged),
                  positions=[p for p, _, _ in paged][:20], description=why)

    # ----- status --------------------------------------------------------------------------------------------------
    def attributes(self) -> dict[str, Any]:
        return {"journal": {"directory": str(self.directory), "segments": len(self.segments),
                            "segment": self.journal.segment, "durable-queues": len(self.queues),
                            "written": self.journal.written, "commits": self.journal.ticket,
                            "preallocated": self.journal.prealloc,
                            "prepared": self.journal.preparer.prepared if self.journal.preparer else 0,
                            "failed": self.failed, "sync-wait": round(self.sync_wait(), 3),
                            "low-disk": self.low_disk, "disk-free": self.disk_free,
                            "backups-low-disk": dict(self.backups_low_disk),
                            "min-disk-free": self.min_disk_free,
                            "stalled": self.stalled(),
                            "paged": sum(q.paged_count for q in self.paging),
                            "paged-out": self.paged_out, "paged-in": self.paged_in,
                            "read-errors": self.read_errors}}
