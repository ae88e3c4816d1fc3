"""The journal's files: numbered segments, appends gathered per pass, one write and one fdatasync per commit.

Group commit without blocking the event loop: `commit()` writes what the pass appended (one `write` into the page
cache, on the loop thread) and hands a *ticket* to the syncer, which calls `fdatasync` and reports the highest
ticket made durable through `on_synced`, on the loop's thread. Requests that queue up while a sync runs are served
by the next one. The syncer is a process of its own when the journal runs beside an event loop
(broker.store.syncproc: no GIL shared with the loop), else (and if that process is lost) the `Syncer` thread,
whose reports reach the loop through `call_soon_threadsafe`. A small commit with nothing in flight is synced by the
loop itself instead, after it wrote its sockets (`defer_inline`, `sync_deferred`), unless a recent inline sync was
slow (INLINE_SYNC_SLOW, INLINE_OFF).

Segments zero-filled in advance: a write into blocks that already hold (zero) data makes its fdatasync flush the
data alone; appending to a file that grows also commits the file's new size and block map (an ext4 journal commit),
measured here at ~1.7x the latency and ~1.5x the kernel CPU per sync (docs/performance.md). The `Preparer` thread
fills the next segment with zeros (and fdatasyncs it) while the current one is written; a roll-over renames it into
place. Until one is ready (the first megabytes after a start, or a disk without room for a whole spare segment) the
journal writes a segment that grows, as before, and rolls over to a prepared one as soon as there is one. Every
commit ends with a MARK record (broker.store.records) so that recovery can tell a torn commit from damage in a file
that no longer ends where its data does.

A failed write (disk full, I/O error) leaves the file as it was (a partial write is cut back) and raises
`JournalFull`/`JournalError`; the caller refuses durable work until a later write succeeds. A commit that would take
a segment past 4 GiB (message locations hold 32 bits of offset) is not written (`SegmentFull`) and the next one
starts a new segment.
"""

from __future__ import annotations

import errno
import os
import shutil
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from broker.errors import BrokerError
from broker.log import get_logger
from broker.store import records as R
from broker.store import syncproc
from broker.store.syncproc import SyncProcess

log = get_logger("broker.store")

SEGMENT_SIZE = 64 * 1024 * 1024
PREPARED = "prepared.tmp"  # the next segment, being zero-filled (or ready) in the journal directory
PREPARE_AFTER = 4 * 1024 * 1024  # a segment that grows asks for a prepared one after this many bytes (a broker
#                                  writing little never zero-fills a whole segment: tests, idle brokers)
PREPARE_ROOM = 2  # a segment is prepared only while the disk has room for this many segments besides
PREPARE_CHUNK = 1 << 20
PREPARE_PAUSE = 0.002  # seconds between chunks


class JournalFull(BrokerError):
    """The disk is full (or over quota): nothing of the failed write is in the journal."""

    condition = "amqp:resource-limit-exceeded"


class SegmentFull(BrokerError):
    """A commit would take the current segment past the offsets a message's location can hold (R.LOC_OFFSET):
    nothing of it is written, and the next commit starts a new segment."""

    condition = "amqp:resource-limit-exceeded"


class SyncFailed(R.JournalError):
    """An fdatasync of the journal failed: nothing written up to commit `ticket` is known to be on disk, and asking
    again proves nothing (Linux reports a writeback error once per open file, and the pages may be marked clean:
    PostgreSQL's "fsyncgate"). What waited for those commits is refused, never accepted."""

    def __init__(self, ticket: int, error: OSError) -> None:
        super().__init__(f"journal: fdatasync failed ({error.strerror or error})")
        self.ticket, self.error = ticket, error


INLINE_SYNC_BYTES = 4096  # a commit this small, with no sync in flight, is synced on the loop (Journal.commit)
# An inline fdatasync slower than INLINE_SYNC_SLOW seconds (another process's bulk writes on the disk can make one take
# a second) stalls the loop: heartbeats stop and peers time out. Inline syncs then stay off for INLINE_OFF[0] seconds,
# twice as long at each slow one within INLINE_OFF[1] seconds of the last, up to INLINE_OFF[1]; the syncer thread
# takes them meanwhile.
INLINE_SYNC_SLOW = 0.02
INLINE_OFF = (30.0, 3600.0)


def segment_name(n: int) -> str:
    return f"{n:08d}.jnl"


def segment_numbers(directory: Path) -> list[int]:
    """The segments in `directory` (none if it does not exist; OSError if it cannot be listed: a journal whose
    directory cannot be read is not an empty one)."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    return sorted(int(n[:-4]) for n in names if n.endswith(".jnl") and n[:-4].isdigit())


class Loop(syncproc.Loop, Protocol):
    """What the journal needs of the event loop (broker.engine.Engine has it)."""

    def call_soon_threadsafe(self, fn: Callable[[], None]) -> None: ...


class Syncer(threading.Thread):
    """fdatasync in the background: `request(ticket, fd)`; `on_synced(ticket)` once everything up to it is on
    disk, or `on_failed(ticket, error)`."""

    def __init__(self, on_synced: Callable[[int], None], on_failed: Callable[[int, OSError], None]) -> None:
        super().__init__(name="journal-sync", daemon=True)
        self.on_synced = on_synced
        self.on_failed = on_failed
        self._cond = threading.Condition()
        self._fds: dict[int, int] = {}  # fd -> highest ticket waiting for it
        self._stopping = False

    def request(self, ticket: int, fds: list[int]) -> None:
        with self._cond:
            for fd in fds:
                self._fds[fd] = max(self._fds.get(fd, 0), ticket)
            self._cond.notify()

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify()

    def run(self) -> None:
        while True:
            with self._cond:
                while not self._fds and not self._stopping:
                    self._cond.wait()
                if not self._fds and self._stopping:
                    return
                work, self._fds = self._fds, {}
            ticket = max(work.values())
            try:
                for fd in work:
                    os.fdatasync(fd)
            except OSError as e:
                self.on_failed(ticket, e)
                continue
            self.on_synced(ticket)


class Preparer(threading.Thread):
    """Zero-fills `directory/PREPARED` (`size` bytes, fdatasynced) when asked (`want`); `take(path)` renames a ready
    one into place. Skips (and says why, once) when the disk lacks room for PREPARE_ROOM segments: a spare segment
    must never be what fills the disk."""

    def __init__(self, directory: Path, size: int) -> None:
        super().__init__(name="journal-prepare", daemon=True)
        self.path = directory / PREPARED
        self.size = size
        self.ready = False  # set by this thread once the file is whole and on disk; cleared by `take`
        self.prepared = 0  # files made since start (stats)
        self.skipped = ""  # why the last request was not served ("" if it was)
        self._want = threading.Event()
        self._stopping = False

    def want(self) -> None:
        self._want.set()

    def stop(self) -> None:
        self._stopping = True
        self._want.set()

    def take(self, path: Path) -> bool:
        """Move the prepared file to `path` (the new segment); False if none is ready."""
        if not self.ready:
            return False
        self.ready = False
        try:
            os.rename(self.path, path)
        except OSError as e:
            self._skip(f"rename: {e.strerror or e}")
            return False
        return True

    def run(self) -> None:
        while True:
            self._want.wait()
            self._want.clear()
            if self._stopping:
                return
            if self.ready:
                continue
            try:
                self._prepare()
            except OSError as e:
                self.path.unlink(missing_ok=True)
                self._skip(f"{e.strerror or e}")

    def _prepare(self) -> None:
        free = shutil.disk_usage(self.path.parent).free
        if free < PREPARE_ROOM * self.size:
            self._skip(f"{free} bytes free, fewer than {PREPARE_ROOM} segments of {self.size}")
            return
        zeros = bytes(PREPARE_CHUNK)
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            done = 0
            while done < self.size:
                if self._stopping:
                    return
                done += os.write(fd, zeros[: min(PREPARE_CHUNK, self.size - done)])
                os.fdatasync(fd)  # a chunk at a time: the journal's own flushes never queue behind the whole file
                time.sleep(PREPARE_PAUSE)
        finally:
            os.close(fd)
        self.prepared += 1
        self.skipped = ""
        self.ready = True

    def _skip(self, why: str) -> None:
        if why != self.skipped:
            log.warning("journal.prepare.skipped", description=why)
        self.skipped = why


class Journal:
    """Segment files in `directory` (created if missing), written in order."""

    def __init__(self, directory: Path, segment_size: int = SEGMENT_SIZE) -> None:
        self.directory = directory
        self.segment_size = segment_size
        self.segment = 0  # number of the segment being written
        self.fd = -1
        self.size = 0  # bytes in the current segment
        self.pending: list[bytes] = []  # appended in this pass, not yet written
        self.pending_bytes = 0
        # This pass's transaction units: [index in `pending` of the UNIT record (filled in at commit), index of the
        # first record after the unit (None: still open, to the end)]
        self.units: list[list[int | None]] = []
        self.ticket = 0  # last commit handed to the syncer
        self.synced = 0  # last commit known to be on disk
        self.ends: deque[tuple[int, int, int, float]] = deque()  # (ticket, segment, size after it, monotonic time
        #                                                            of the write) of commits not known synced
        self.durable = (0, 0)  # (segment, bytes of it) known to be on disk: what each commit's MARK says
        self.blocked_since = 0.0  # monotonic time the calling thread (the loop) entered a write or fdatasync of its
        #                           own here, 0 when it is in none (read by the store's watchdog thread)
        self.syncer: Syncer | SyncProcess | None = None
        self._reports: tuple[Callable[[int], None], Callable[[int, OSError], None], Loop | None] | None = None
        self.preparer: Preparer | None = None
        self.prealloc = False  # the current segment was zero-filled in advance
        self.overflowed = False  # a commit did not fit in the current segment (SegmentFull): time for a new one
        self.prepare_at = 0  # size of the current segment at which the next one is asked for
        self.retired: list[tuple[int, int]] = []  # (fd, last ticket that may name it) of earlier segments: closed
        #                                             once that ticket is synced (the syncer may still be using them)
        self.written = 0  # bytes written since start (stats)
        self.sync_error: tuple[int, OSError] | None = None  # an inline fdatasync that failed, for the store to report
        self.defer_inline = False  # an inline sync waits for `sync_deferred` (the loop's writes go out first)
        self.deferred: tuple[int, list[int]] | None = None  # (ticket, fds) of an inline sync not yet made
        self.inline_off_until = 0.0  # monotonic time until which syncs go to the thread (a slow inline one was seen)
        self.inline_off_for = INLINE_OFF[0]
        self.slow_syncs = 0  # inline syncs slower than INLINE_SYNC_SLOW (stats)
        self._last_slow = -INLINE_OFF[1]

    # ----- files ---------------------------------------------------------------------------------------------------
    def open_segment(self, number: int) -> None:
        """Start writing segment `number` (the prepared file if one is ready, else a new file that grows). The
        current segment is synced first, on the calling thread: a later segment exists on disk only once every
        earlier one is whole there, so a crash can tear only the last one."""
        self.blocked_since = time.monotonic()
        try:
            self._open_segment(number)
        finally:
            self.blocked_since = 0.0

    def _open_segment(self, number: int) -> None:
        if self.fd >= 0:
            try:
                os.fdatasync(self.fd)
            except OSError as e:
                raise SyncFailed(self.ticket, e) from None
        path = self.directory / segment_name(number)
        prepared = self.preparer is not None and self.preparer.take(path)
        flags = os.O_WRONLY | os.O_CLOEXEC | (0 if prepared else os.O_CREAT | os.O_TRUNC)
        try:
            fd = os.open(path, flags, 0o600)
        except OSError as e:  # out of descriptors or inodes: as a failed write, the current segment goes on
            raise _io_error("open", e) from None
        head = R.header(number)
        try:
            _write_all(fd, head, 0)
            try:  # the new file's name on disk before anything is written to it: then it becomes the current one
                sync_path(self.directory)
            except OSError as e:
                raise _io_error("fsync of the journal's directory", e) from None
        except BrokerError:
            os.close(fd)
            path.unlink(missing_ok=True)
            raise
        if self.fd >= 0:
            if self.deferred is not None:  # its sync (of the old segment alone) was just made
                self.deferred = (self.deferred[0], [])
            if self.synced >= self.ticket:
                os.close(self.fd)
            else:
                self.retired.append((self.fd, self.ticket))
        self.fd, self.segment, self.size = fd, number, len(head)
        self.prealloc, self.overflowed = prepared, False
        self.prepare_at = len(head) + (self.segment_size // 2 if prepared else
                                       min(PREPARE_AFTER, self.segment_size // 2))

    def reopen(self, number: int, size: int) -> None:
        """Carry on writing an existing segment of `size` valid bytes (anything after is cut)."""
        path = self.directory / segment_name(number)
        fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
        os.ftruncate(fd, size)
        os.lseek(fd, size, os.SEEK_SET)
        self.fd, self.segment, self.size = fd, number, size

    def start(self, on_synced: Callable[[int], None], on_failed: Callable[[int, OSError], None],
              loop: Loop | None = None) -> None:
        """Start the syncer and the preparer. With `loop`, `on_synced(ticket)` and `on_failed(ticket, error)` are
        called on the loop's thread and the syncer is a process (broker.store.syncproc); without, the syncer is a
        thread and calls them from that thread."""
        self._reports = (on_synced, on_failed, loop)
        if loop is None:
            self.syncer = Syncer(on_synced, on_failed)
            self.syncer.start()
        else:
            try:
                self.syncer = SyncProcess(loop, on_synced, on_failed, self._syncer_lost)
                log.info("journal.syncer.started", pid=self.syncer.pid)
            except OSError as e:  # no process to be had (e.g. out of pids): the thread does the same work
                log.error("journal.syncer.lost", description=f"the sync process could not be started: {e}")
                self._thread_syncer()
        (self.directory / PREPARED).unlink(missing_ok=True)  # half made, or made for a run that is over
        self.preparer = Preparer(self.directory, self.segment_size)
        self.preparer.start()

    def _thread_syncer(self) -> None:
        assert self._reports is not None
        on_synced, on_failed, loop = self._reports
        assert loop is not None
        self.syncer = Syncer(lambda t: loop.call_soon_threadsafe(lambda: on_synced(t)),
                             lambda t, e: loop.call_soon_threadsafe(lambda: on_failed(t, e)))
        self.syncer.start()

    def _syncer_lost(self) -> None:
        """The sync process went while the broker runs: the thread takes over, and syncs everything written (what
        was in flight may not have been)."""
        log.error("journal.syncer.lost", description="the sync process exited")
        self._thread_syncer()
        if self.synced < self.ticket and self.syncer is not None:
            self.syncer.request(self.ticket, [fd for fd, _ in self.retired] + ([self.fd] if self.fd >= 0 else []))

    def close(self) -> None:
        self.sync_deferred()
        if self.preparer is not None:
            self.preparer.stop()
        if self.syncer is not None:
            self.syncer.stop()
            self.syncer.join(5)
        if self.fd >= 0:
            try:
                os.fdatasync(self.fd)
            finally:
                os.close(self.fd)
            self.fd = -1
        for fd, _ in self.retired:
            os.close(fd)
        self.retired.clear()

    # ----- appending -----------------------------------------------------------------------------------------------
    def _carry(self, records: list[bytes], units: list[tuple[int, int]]) -> None:
        """A commit failed: what of it the next one writes first (nothing of a unit, `units` (start, end) spans of
        `records`; what came before, between and after them in the pass, and what earlier failed commits carried,
        is kept as from any commit)."""
        kept: list[bytes] = []
        start = 0
        for at, end in units:
            kept += R.carried(records[start:at])
            start = end
        kept += R.carried(records[start:])
        self.pending, self.pending_bytes = kept, sum(len(r) for r in kept)

    def append(self, record: bytes) -> None:
        self.pending.append(record)
        self.pending_bytes += len(record)

    def begin_unit(self) -> None:
        """What this pass appends from now on, until `end_unit` (or the end of the pass), stands or falls together
        at recovery (a transaction's commit): a UNIT record goes here, its length known when the pass is written.
        While a unit is open, a further call changes nothing."""
        if not self.units or self.units[-1][1] is not None:
            self.units.append([len(self.pending), None])
            self.append(b"")  # the place (and the bytes: offsets of what follows stay right) of the UNIT record
            self.pending_bytes += R.UNIT_SIZE

    def end_unit(self) -> bool:
        """The open unit ends here: what the pass appends after it is not part of it. True if it holds records."""
        if self.units and self.units[-1][1] is None:
            at, _ = self.units[-1]
            assert at is not None
            self.units[-1][1] = len(self.pending)
            return len(self.pending) > at + 1
        return False

    def commit(self) -> int | None:
        """Write what this pass appended; returns the ticket to wait for (None: nothing to write). Raises
        JournalFull, SegmentFull or JournalError; the journal then holds nothing of this commit, and what of it
        must not be forgotten (consumptions, wiring: `records.carried`) stays pending for the next one, unless the
        commit was a transaction's unit, which fails whole."""
        if not self.pending:
            return None
        units: list[tuple[int, int]] = []
        if self.units:
            spans, self.units = self.units, []
            for at, end in reversed(spans):  # from the last: a removed placeholder moves none of those still to do
                assert at is not None
                if end is None:
                    end = len(self.pending)
                if end == at + 1:  # nothing in it (a commit of non-durable work): no unit
                    del self.pending[at]
                    self.pending_bytes -= R.UNIT_SIZE
                    units = [(a - 1, e - 1) for a, e in units]
                else:
                    self.pending[at] = R.unit(sum(len(r) for r in self.pending[at + 1:end]))
                    units.insert(0, (at, end))
            if not self.pending:
                return None
        records = self.pending
        if self.fd < 0:
            self._carry(records, units)
            raise R.JournalError("journal: no segment open")
        size = self.pending_bytes + R.MARK_SIZE  # what the write below will be, known before it is joined
        if self.size + size > R.LOC_OFFSET:
            # Only a pass that gathers gigabytes of durable messages (segments of up to 2 GiB, messages of up to
            # 1 GiB) gets here; written, their locations would run into the segment number's bits.
            self._carry(records, units)
            self.overflowed = True
            raise SegmentFull(
                f"journal: a commit of {size} bytes would take {segment_name(self.segment)} ({self.size} bytes) "
                f"past the 4 GiB a segment may hold: its messages are refused, the next commit starts a new segment "
                f"(lower --journal-segment-bytes or --max-message-size if it happens again)")
        seg, durable = self.durable
        data = b"".join((*records, R.mark(self.size + self.pending_bytes, durable if seg == self.segment else 0)))
        self.pending = []
        self.pending_bytes = 0
        now = self.blocked_since = time.monotonic()
        try:
            _write_all(self.fd, data, self.size)
        except BrokerError:
            self._carry(records, units)
            raise
        finally:
            self.blocked_since = 0.0
        self.size += len(data)
        self.written += len(data)
        self.ticket += 1
        self.ends.append((self.ticket, self.segment, self.size, now))
        if self.size >= self.prepare_at and self.preparer is not None:
            self.prepare_at = 1 << 62
            self.preparer.want()
        fds = [self.fd]
        deferred = self.deferred
        quiet = self.synced == self.ticket - 1 or (deferred is not None and deferred[0] == self.ticket - 1)
        if self.syncer is None or (quiet and len(data) <= INLINE_SYNC_BYTES and self._inline_on()):
            # Nothing else in flight and little to flush (one-at-a-time publishing): fdatasync on the loop saves
            # the round trip through the syncer thread (a wake-up each way), which is most of the latency a
            # durable sync message adds beyond the disk's own. Under load commits are bigger and the thread keeps
            # the loop going while the disk flushes. With `defer_inline` the loop makes the sync itself right
            # after writing its sockets (`sync_deferred`): what this pass sends to backups is on its way while
            # this disk flushes, and their own write and sync overlap ours.
            if self.syncer is not None and self.defer_inline:
                self.deferred = (self.ticket, fds)  # covers an earlier deferred one: same segment, or it was synced
                return self.ticket
            self._sync_inline(self.ticket, fds)
        else:
            self.deferred = None  # the thread's sync covers it (the same segment, or a rolled-over one synced then)
            self.syncer.request(self.ticket, fds)
        return self.ticket

    def commit_synced(self) -> int | None:
        """Write what is pending and fdatasync it on the calling thread, whatever its size (a roll-over's checkpoint:
        the older segments go only once it is on disk). Raises as `commit`, or SyncFailed."""
        ticket = self.commit()
        if ticket is None or self.synced >= ticket:
            return ticket
        if self.deferred is not None and self.deferred[0] <= ticket:
            self.deferred = None  # covered here (the same segment)
        self.blocked_since = time.monotonic()
        try:
            os.fdatasync(self.fd)
        except OSError as e:
            raise SyncFailed(ticket, e) from None
        finally:
            self.blocked_since = 0.0
        self.mark_synced(ticket, close_retired=False)  # a syncer thread may still be syncing them (its reply closes them)
        return ticket

    def sync_deferred(self) -> int | None:
        """Make the inline sync `commit` left for after the loop's writes; returns its ticket once it is on disk
        (None: none was due, or it failed and the syncer thread reports it)."""
        if self.deferred is None:
            return None
        (ticket, fds), self.deferred = self.deferred, None
        return ticket if self._sync_inline(ticket, fds) else None

    def _sync_inline(self, ticket: int, fds: list[int]) -> bool:
        """fdatasync on the calling thread; True once on disk. On an error with a syncer, False, and the failure
        waits in `sync_error` for the store (`Store._take_sync_error`): not handed to the syncer, whose fdatasync of the
        same file would return 0 (the error is reported once) and accept what never reached the disk. Without a
        syncer, the error is raised."""
        t0 = self.blocked_since = time.monotonic()
        try:
            for fd in fds:
                os.fdatasync(fd)
        except OSError as e:
            if self.syncer is None:
                raise
            if self.sync_error is None or self.sync_error[0] < ticket:
                self.sync_error = (ticket, e)
            return False
        finally:
            self.blocked_since = 0.0
        self.mark_synced(ticket)
        took = time.monotonic() - t0
        if took > INLINE_SYNC_SLOW and self.syncer is not None:
            self._slow(took, t0 + took)
        return True

    def mark_synced(self, ticket: int, close_retired: bool = True) -> None:
        """Everything up to commit `ticket` is on disk."""
        if ticket <= self.synced:
            return
        self.synced = ticket
        ends = self.ends
        while ends and ends[0][0] <= ticket:
            _, segment, size, _ = ends.popleft()
            self.durable = (segment, size)
        if close_retired and self.retired and self.retired[0][1] <= ticket:
            for fd, _ in [r for r in self.retired if r[1] <= ticket]:
                os.close(fd)
            self.retired = [r for r in self.retired if r[1] > ticket]

    def unsynced_for(self, now: float) -> float:
        """Seconds the oldest write not known to be on disk has waited for its fdatasync (0: none waits)."""
        return now - self.ends[0][3] if self.ends else 0.0

    def _inline_on(self) -> bool:
        return not self.inline_off_until or time.monotonic() >= self.inline_off_until

    def _slow(self, took: float, now: float) -> None:
        """An inline sync held the loop `took` seconds: the thread takes the syncs for a while (INLINE_OFF)."""
        recent = now - self._last_slow <= INLINE_OFF[1]
        self.inline_off_for = min(self.inline_off_for * 2, INLINE_OFF[1]) if recent else INLINE_OFF[0]
        self._last_slow = now
        self.inline_off_until = now + self.inline_off_for
        self.slow_syncs += 1
        log.warning("journal.sync.slow", seconds=round(took, 4), off_seconds=self.inline_off_for)

    def full(self) -> bool:
        """Time to roll over to a new segment: this one is full, or it grows and a prepared one is ready."""
        return self.size >= self.segment_size or self.overflowed or (
            not self.prealloc and self.preparer is not None and self.preparer.ready)

    def drop_segment(self, number: int) -> None:
        """Delete a segment whose records are all superseded (never the current one)."""
        if number == self.segment:
            raise ValueError("the current segment cannot be dropped")
        (self.directory / segment_name(number)).unlink(missing_ok=True)


def _write_all(fd: int, data: bytes, size_before: int) -> None:
    """Write `data` whole, or leave the file at `size_before` and raise."""
    view = memoryview(data)
    done = 0
    try:
        while done < len(view):
            done += os.write(fd, view[done:])
    except OSError as e:
        if done:
            try:
                os.ftruncate(fd, size_before)
                os.lseek(fd, size_before, os.SEEK_SET)
            except OSError:
                log.error("journal.truncate_failed", size=size_before, exc_info=True)
        raise _io_error("write", e) from None


def _io_error(what: str, e: OSError) -> BrokerError:
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return JournalFull(f"journal: disk full ({e.strerror})")
    return R.JournalError(f"journal: {what} failed ({e.strerror or e})")


def sync_path(path: Path) -> None:
    """fsync a segment or the journal's directory by its path, through a descriptor of its own (raises OSError)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
