"""The durable store: what durable queues, exchanges and bindings and their durable messages become on disk, and
back at start. An `Extension` of the server.

What is journaled: queues with `durable: true`, their messages with the AMQP `durable` header, exchanges with
`durable: true`, bindings between durable ends, and the broker's HA standing (epoch, role, state). Everything else
never touches the disk.

Per pass (group commit): the observers append records as queues and wiring change; at the end of the pass
`end_of_pass` writes them with one `write`, and the syncer thread makes them durable with one `fdatasync`. A client's
durable delivery is held until the sync of the pass that journaled it (and, in a cluster, until every ready backup
acknowledged it, which a backup does only once its own journal holds it: `when_synced`).

Segments: a new segment starts with a checkpoint of the wiring (queues with their next positions, exchanges,
bindings, the HA standing), so a segment can be dropped once it is the oldest and none of its messages is still on
a queue; the oldest segment with few live messages is compacted (its live messages written again at the end).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from broker.errors import BrokerError
from broker.extension import Extension
from broker.log import get_logger
from broker.queue import DURABLE, DequeueReason, Entry, Queue
from broker.store import records as R
from broker.store.journal import Journal, segment_name, segment_numbers
from broker.wiring import WiringEvent

if TYPE_CHECKING:
    from broker.links import Completion
    from broker.server import Server

log = get_logger("broker.store")

COMPACT_LIVE_FRACTION = 0.1  # the oldest segment is compacted when fewer of its messages than this are live
PROBE_INTERVAL = 1.0  # seconds between attempts to write again after a failure


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
    seconds: float = 0.0
    state: dict[str, Any] = field(default_factory=dict)  # the last STATE record (HA standing)


@dataclass
class _Q:
    """A durable queue as the journal knows it."""

    qid: int
    live: dict[int, int] = field(default_factory=dict)  # segment -> messages of this queue still on it


class Image:
    """The journal replayed: durable wiring and messages, before any of it becomes broker objects (pure)."""

    def __init__(self) -> None:
        self.queues: dict[int, dict[str, Any]] = {}  # qid -> {name, uuid, arguments, next}
        self.messages: dict[int, dict[int, tuple[int, int, int, float | None, bytes, int]]] = {}
        self.exchanges: dict[str, dict[str, Any]] = {}
        self.bindings: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.state: dict[str, Any] = {}

    def apply(self, rec: R.Record, segment: int) -> None:
        kind = rec.kind
        if kind == R.ENQUEUE:
            qid, pos, level, flags, count, expires, data = rec.enqueue()
            msgs = self.messages.get(qid)
            if msgs is not None:
                msgs[pos] = (level, flags, count, expires, data, segment)
        elif kind == R.DEQUEUE:
            qid, lo, hi = rec.dequeue()
            msgs = self.messages.get(qid)
            if msgs:
                if hi - lo < len(msgs):
                    for p in range(lo, hi + 1):
                        msgs.pop(p, None)
                else:
                    for p in [p for p in msgs if lo <= p <= hi]:
                        del msgs[p]
        elif kind == R.QUEUE:
            qid, doc = rec.queue()
            old = self.queues.get(qid)
            if old is not None and old.get("uuid") == doc.get("uuid"):
                doc["next"] = max(int(doc.get("next", 1)), int(old.get("next", 1)))
            else:
                self.messages[qid] = {}
            self.queues[qid] = doc
        elif kind == R.UNQUEUE:
            qid = rec.qid()
            self.queues.pop(qid, None)
            self.messages.pop(qid, None)
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


def read_journal(directory: Path) -> tuple[Image, Recovered, list[int], int]:
    """Replay every segment of `directory`. Returns the image, the report, the segment numbers and the valid size
    of the last one (a torn tail beyond it is reported, not cut: the caller cuts when it writes again).
    Raises JournalError for damage that is not a torn tail, or a newer format."""
    image = Image()
    report = Recovered()
    numbers = segment_numbers(directory)
    last_size = 0
    for i, n in enumerate(numbers):
        path = directory / segment_name(n)
        data = path.read_bytes()
        if len(data) < R.HEADER.size and i == len(numbers) - 1:
            report.cut, report.cut_reason, last_size = len(data), "segment header incomplete", 0
            break
        R.check_header(data, path.name)
        recs, end = R.scan(data, R.HEADER.size)
        if end.damaged or (end.torn and i < len(numbers) - 1):
            raise R.JournalError(
                f"journal damaged in {path.name} at byte {end.good}: {end.reason}. Nothing was changed; to start "
                f"anyway, cut it there (what follows is lost): ha-admin journal cut --data-dir DIR")
        for rec in recs:
            image.apply(rec, n)
        report.segments += 1
        if i == len(numbers) - 1:
            last_size = end.good
            if end.torn:
                report.cut, report.cut_reason = len(data) - end.good, end.reason
    report.state = image.state
    return image, report, numbers, last_size


class Store(Extension):
    def __init__(self, server: Server, directory: Path, segment_bytes: int = 64 * 1024 * 1024) -> None:
        self.server = server
        self.directory = directory
        self.segment_bytes = segment_bytes
        self.journal = Journal(directory, segment_bytes)
        self.queues: dict[Queue, _Q] = {}
        self.next_qid = 1
        self.waiting: list[Completion] = []  # durable deliveries of this pass
        self.after: list[Callable[[], None]] = []  # callbacks for when this pass's records are on disk
        self.tickets: deque[tuple[int, list[Completion], list[Callable[[], None]]]] = deque()
        self.dequeues: dict[int, list[int]] = {}  # qid -> positions dequeued this pass
        self.segments: list[int] = []  # segment numbers on disk, oldest first
        self.failed: str | None = None  # why durable work is refused (disk full, I/O error)
        self.failures = 0
        self.state: dict[str, Any] = {}
        self.recovered = Recovered()
        self._probe: Any = None

    # ----- start ---------------------------------------------------------------------------------------------------
    def recover(self) -> Recovered:
        """Rebuild durable wiring and messages from the journal (before the broker listens). Raises JournalError."""
        t0 = time.monotonic()
        self.directory.mkdir(parents=True, exist_ok=True)
        image, report, numbers, last_size = read_journal(self.directory)
        wiring = self.server.wiring
        for name, doc in image.exchanges.items():
            if name not in wiring.exchanges:
                wiring.declare_exchange(name, doc.get("type", "direct"), doc.get("arguments") or {},
                                        uuid=doc.get("uuid"))
        for qid, doc in sorted(image.queues.items()):
            q, _ = wiring.declare_queue(doc["name"], doc.get("arguments") or {}, uuid=doc.get("uuid"))
            state = self._track(q, qid)
            msgs = image.messages.get(qid, {})
            for pos in sorted(msgs):
                level, flags, count, expires, data, seg = msgs[pos]
                e = q.enqueue_replica(pos, data, level, flags, count, expires)
                e.seg = seg
                state.live[seg] = state.live.get(seg, 0) + 1
                report.messages += 1
                report.bytes += len(data)
            q.next_position = max(q.next_position, int(doc.get("next", 1)))
            self.next_qid = max(self.next_qid, qid + 1)
            report.queues += 1
        for (ex, qn, key), doc in image.bindings.items():
            if ex in wiring.exchanges and qn in wiring.queues:
                wiring.bind(ex, qn, key, doc.get("arguments") or {})
                report.bindings += 1
        report.exchanges = len(image.exchanges)
        self.state = dict(image.state)
        self.segments = numbers
        if numbers and report.cut:
            self.journal.reopen(numbers[-1], last_size)  # cut the torn tail
            self.journal.close()
            self.journal = Journal(self.directory, self.segment_bytes)
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
        self.journal.start(self._synced_thread, self._failed_thread)
        try:
            self._roll()
        except BrokerError as e:  # e.g. the disk is full: serve what needs no disk, refuse durable messages
            self._fail(str(e), [])
            return
        self._commit()

    def stopping(self) -> None:
        self._commit()

    def close(self) -> None:
        self.journal.close()

    # ----- what is durable -----------------------------------------------------------------------------------------
    def _track(self, q: Queue, qid: int | None = None) -> _Q:
        st = self.queues.get(q)
        if st is None:
            if qid is None:
                qid = self.next_qid
                self.next_qid += 1
            st = self.queues[q] = _Q(qid)
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
                        self.journal.append(R.unqueue(st.qid))
                        self.dequeues.pop(st.qid, None)
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

    def record_state(self, epoch: int, role: str, state: str, ready_epoch: int = 0) -> None:
        """The broker's HA standing, for ranking stores after a whole-cluster restart."""
        self.state = {"epoch": epoch, "role": role, "state": state, "ready_epoch": ready_epoch,
                      "time": time.time()}
        self.journal.append(R.document(R.STATE, self.state))

    # ----- queues (observer of durable queues) ---------------------------------------------------------------------
    def enqueued(self, queue: Queue, entry: Entry) -> None:
        if not entry.flags & DURABLE:
            return
        st = self.queues.get(queue)
        if st is None:
            return
        self.journal.append(R.enqueue(st.qid, entry.position, entry.level, entry.flags, entry.count, entry.expires,
                                      entry.data))
        seg = self.journal.segment
        entry.seg = seg
        st.live[seg] = st.live.get(seg, 0) + 1

    def acquired(self, queue: Queue, entry: Entry) -> None:
        pass

    def released(self, queue: Queue, entry: Entry) -> None:
        pass

    def dequeued(self, queue: Queue, entry: Entry, reason: DequeueReason) -> None:
        seg = entry.seg
        if not seg:
            return
        st = self.queues.get(queue)
        if st is None:
            return
        self.dequeues.setdefault(st.qid, []).append(entry.position)
        st.live[seg] -= 1

    # ----- completions ---------------------------------------------------------------------------------------------
    def hold(self, completion: Completion, routed: list[tuple[Queue, Entry]]) -> bool:
        for _, e in routed:
            if e.seg:
                self.waiting.append(completion)
                return True
        return False

    def refusing(self) -> str | None:
        """Why durable messages are refused now (None: they are taken)."""
        return self.failed

    def when_synced(self, fn: Callable[[], None]) -> None:
        """Call `fn` once everything journaled so far is on disk (now, if it is)."""
        if self.journal.pending or self.waiting:
            self.after.append(fn)
        elif self.tickets:
            self.tickets[-1][2].append(fn)
        else:
            fn()

    # ----- once per pass -------------------------------------------------------------------------------------------
    def end_of_pass(self) -> bool:
        if self.dequeues:
            dq, self.dequeues = self.dequeues, {}
            for qid, positions in dq.items():
                positions.sort()
                lo = hi = positions[0]
                for p in positions[1:]:
                    if p == hi + 1:
                        hi = p
                    else:
                        self.journal.append(R.dequeue(qid, lo, hi))
                        lo = hi = p
                self.journal.append(R.dequeue(qid, lo, hi))
        wrote = self._commit()
        if self.journal.full():
            self._roll()
            self._commit()
        return wrote

    def _commit(self) -> bool:
        """Write what the pass journaled; True if anything was written (the server then goes round once more, so
        that whatever the rest of the pass journals is written in it too)."""
        waiting, after = self.waiting, self.after
        if not waiting and not after and not self.journal.pending:
            return False
        self.waiting, self.after = [], []
        try:
            ticket = self.journal.commit()
        except BrokerError as e:  # JournalFull / JournalError: nothing of it is on disk
            self._fail(str(e), waiting)
            for fn in after:
                fn()
            return False
        if ticket is None or self.journal.synced >= ticket:  # nothing written, or written synchronously
            for c in waiting:
                c.release()
            for fn in after:
                fn()
            return False
        self.tickets.append((ticket, waiting, after))
        return True

    def _synced_thread(self, ticket: int) -> None:
        self.server.call_soon_threadsafe(lambda: self._synced(ticket))

    def _failed_thread(self, ticket: int, error: OSError) -> None:
        self.server.call_soon_threadsafe(lambda: self._sync_failed(ticket, error))

    def _synced(self, ticket: int) -> None:
        self.journal.synced = max(self.journal.synced, ticket)
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
            for fn in after:
                fn()
        self._fail(f"journal: fdatasync failed ({error.strerror or error})", failed)

    def _fail(self, reason: str, completions: list[Completion]) -> None:
        """Durable work cannot be journaled: refuse what was waiting, refuse new durable messages until a write
        succeeds again (probed every second)."""
        for c in completions:
            c.fail("amqp:resource-limit-exceeded", reason)
        if self.failed is None:
            log.error("journal.failed", description=reason, refused=len(completions))
        self.failed = reason
        self.failures += 1
        if self._probe is None:
            self._probe = self.server.schedule(PROBE_INTERVAL, self._retry)

    def _retry(self) -> None:
        self._probe = None
        if self.failed is None:
            return
        try:
            if self.journal.fd < 0 or self.journal.full():  # no segment yet (failed at start), or time for one
                self._roll()
            else:
                self.journal.append(R.document(R.STATE, self.state or {"probe": time.time()}))
            self.journal.commit()
        except BrokerError as e:
            self.failed = str(e)
            self._probe = self.server.schedule(PROBE_INTERVAL, self._retry)
            return
        log.warning("journal.writable", description=f"writes succeed again after: {self.failed}")
        self.failed = None

    # ----- segments ------------------------------------------------------------------------------------------------
    def _roll(self) -> None:
        """Start a new segment with a checkpoint of the wiring; drop or compact the oldest segments."""
        number = (max(self.segments) if self.segments else 0) + 1
        self.journal.open_segment(number)
        self.segments.append(number)
        self._checkpoint()
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

    def live(self, segment: int) -> int:
        return sum(st.live.get(segment, 0) for st in self.queues.values())

    def _tidy(self) -> None:
        """Drop the oldest segments once nothing on them is live; compact the oldest when little of it is."""
        current = self.journal.segment
        while len(self.segments) > 1 and self.segments[0] != current and self.live(self.segments[0]) == 0:
            dead = self.segments.pop(0)
            for st in self.queues.values():
                st.live.pop(dead, None)
            self.journal.drop_segment(dead)
            log.info("journal.segment.dropped", segment=dead)
        if len(self.segments) > 2:
            oldest = self.segments[0]
            live = self.live(oldest)
            size = (self.directory / segment_name(oldest)).stat().st_size
            if live and live * 200 < size * COMPACT_LIVE_FRACTION:  # ~200 bytes a record: few still live
                self._compact(oldest)

    def _compact(self, segment: int) -> None:
        """Write the live messages of `segment` again at the end; the segment is then dead (dropped at the next
        roll)."""
        moved = 0
        current = self.journal.segment
        for q, st in self.queues.items():
            if not st.live.get(segment):
                continue
            for e in q.entries.values():
                if e.seg == segment:
                    self.journal.append(R.enqueue(st.qid, e.position, e.level, e.flags, e.count, e.expires, e.data))
                    e.seg = current
                    moved += 1
            st.live[current] = st.live.get(current, 0) + st.live.pop(segment)
        log.info("journal.segment.compacted", segment=segment, moved=moved)

    # ----- status --------------------------------------------------------------------------------------------------
    def attributes(self) -> dict[str, Any]:
        return {"journal": {"directory": str(self.directory), "segments": len(self.segments),
                            "segment": self.journal.segment, "durable-queues": len(self.queues),
                            "written": self.journal.written, "commits": self.journal.ticket,
                            "failed": self.failed}}
