"""The primary's links to its backups: one replicating browser per (queue, backup), fed once per pass by the
queue's watch; the backup's acknowledgements (`$ha.acks`); the membership list (`$ha.status`).

A browser sends what a pass gathered as one batch transfer (ha.core.batch): dequeue ranges, live messages in
position order, then catch-up messages newest first, bounded in bytes in flight; a backup that does not speak the
batch format gets one transfer per message, tagged as in ha.protocol.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from dataclasses import dataclass, field
from operator import attrgetter
from typing import TYPE_CHECKING, Any, Protocol

from cproton import pn_delivery_tag
from proton import Message

from broker.connections import ConnectionState
from broker.dedup import key as id_key
from broker.engine import raw
from broker.links import AcceptCompletion, AcceptToken, Completion, LinkHandler
from broker.log import get_logger
from broker.message import current_message_id, decode
from broker.paging import Paged
from broker.queue import ACQUIRED, DEAD, DURABLE, HELD, REDELIVERED, WINDOWED, DequeueReason, Entry, Queue
from ha import protocol as P
from ha.core.accepts import AcceptGroup, DequeueWaits
from ha.core.batch import ENQUEUE, GONE, VERSION_GONE, BatchWriter, is_binary_acks, negotiate, parse_acks
from ha.core.catchup import BackupCatchup
from ha.core.guards import GuardBook
from ha.core.idset import PositionSet
from ha.core.states import HaState

if TYPE_CHECKING:
    from broker.config import BrokerConfig
    from broker.server import Server

log = get_logger("ha.primary")
_position, _data = attrgetter("position"), attrgetter("data")
_tags = itertools.count(1)

# Catch-up in flight per queue: CATCHUP_BATCHES batches of at most CATCHUP_BATCH bytes. Enough to keep the backup
# busy (it acknowledges each pass), little enough that live messages, which hold clients, wait at most a few
# milliseconds behind old ones on the connection.
CATCHUP_BATCHES = 3
CATCHUP_BATCH = 256 * 1024
CATCHUP_CHUNK = 4096  # catch-up positions taken from the plan at a time

# What a pass did to messages already sent, for version-2 batches, in order: ("A", [(lo, hi), ...]) acquired by
# consumers, ("R", position, flags, count) released.
StateOp = tuple[Any, ...]


@dataclass(eq=False)
class RemoteBackup:
    """The primary's record of one connected backup."""

    name: str
    address: str
    epoch: int
    conn: ConnectionState
    connected_at: float
    catchup: BackupCatchup
    state: HaState = HaState.CATCHUP
    senders: dict[str, ReplicatingSender] = field(default_factory=dict)
    wiring_done: bool = False  # the backup attached its status link: wiring mirrored, browsers requested
    view_confirmed: int = 0  # the newest member list (Membership.seq) it settled on `$ha.status`
    # Queue -> the timer of a replication link it detached alone and has not attached again (replication_link_gone)
    reattach: dict[str, Any] = field(default_factory=dict)

    def cancel_reattach(self) -> None:
        """Cancel every re-attach timer: the backup is dropped, or the primary steps down."""
        for timer in self.reattach.values():
            timer.cancel()
        self.reattach.clear()


class PrimarySide(Protocol):
    """What the links of this module use of their primary (ha.primary.Primary), so that this module does not import
    it (no import circle under ha/)."""

    config: BrokerConfig
    server: Server
    guards: GuardBook[Completion]
    watches: dict[str, QueueWatch]
    changed: list[QueueWatch]
    to_run: set[ReplicatingSender]
    status_links: set[StatusLink]

    def acked(self, b: RemoteBackup, queue: str, positions: PositionSet) -> None: ...

    def check_ready(self, b: RemoteBackup) -> None: ...

    def backup_disk(self, b: RemoteBackup, low: str | None) -> None: ...

    def status_link_gone(self, b: RemoteBackup) -> None: ...

    def replication_link_gone(self, b: RemoteBackup, name: str, waited: list[AcceptToken]) -> None: ...


class QueueWatch:
    """One per queue on the primary: collects what a pass enqueued and dequeued, and hands it over at the end of
    the pass (`flush`): to the guards (dequeued messages need no acknowledgement any more) and to each backup's
    browser. Per message it only appends to a list or a range set.

    A dequeued message whose id entered the queue's duplicate window is the exception: its publisher is settled only
    once every backup has the id (else a resend after a failover, its settlement lost, would be taken again), so
    its place stays guarded for each backup of batch format version 4 until that backup acknowledges it: a browser
    that had not sent it yet sends its id alone ("G" record), one that attaches later acknowledges it after the
    window its first batch carries (`ReplicatingSender.take_windowed`, `Primary._attach_queue`). Unless a consumer
    accepted it in mode second and waits for its answer, which waits for the backups' acknowledgements of the
    dequeue: a backup whose browser sent the message before the dequeue applies its id before the dequeue, so the
    consumer is told its accept stands only once every such backup has the id (else a resend after a failover may
    reach it again, as a consumer must expect of an accept it never saw confirmed); for those backups the dequeue
    releases the place as before (`_accepted`)."""

    __slots__ = ("accepted", "accepts", "fresh", "gone", "held_bytes", "held_positions", "held_tokens",
                 "last_windowed", "primary", "queue", "returned", "scheduled", "senders", "taken", "windowed")

    def __init__(self, primary: PrimarySide, queue: str) -> None:
        self.primary = primary
        self.queue = queue
        self.senders: dict[str, ReplicatingSender] = {}
        self.fresh: list[Entry] = []
        self.gone = PositionSet()
        self.held_positions: list[int] = []  # client deliveries of this pass waiting for the backups
        self.held_tokens: list[Completion] = []
        self.held_bytes = 0
        self.taken: list[int] = []  # positions acquired by consumers in this pass
        self.returned: list[tuple[int, int, int, int]] = []  # released: (len(taken) then, position, flags, count)
        self.accepts: list[AcceptToken] = []  # consumer accepts of this pass answered once dequeues are replicated
        self.windowed: dict[int, tuple[Entry, bytes]] = {}  # dequeued windowed messages of this pass, by position
        self.last_windowed = 0  # the position of the message dequeued last if it is windowed (`hold_accept`)
        self.accepted: list[int] = []  # of `windowed`, those whose consumer waits for the backups' dequeue
        self.scheduled = False

    def hold(self, position: int, completion: Completion, nbytes: int) -> None:
        self.held_positions.append(position)
        self.held_tokens.append(completion)
        self.held_bytes += nbytes
        if not self.scheduled:
            self.scheduled = True
            self.primary.changed.append(self)

    def hold_group(self, completions: list[Completion], entries: list[Entry]) -> None:
        """`hold` for several deliveries at once (positions ascending, above any held before in this pass)."""
        self.held_positions.extend(map(_position, entries))
        self.held_tokens.extend(completions)
        self.held_bytes += sum(map(len, map(_data, entries)))
        if not self.scheduled:
            self.scheduled = True
            self.primary.changed.append(self)

    def hold_accept(self, token: AcceptToken) -> None:
        """A consumer's accept of a message this pass dequeued (the one dequeued last: broker.links dequeues, then
        asks), or a commit's (whose dequeues here may be followed by others, a ring queue pushing out a message its
        dead letter went to: not `accepted`): answered once the backups have the dequeue."""
        self.accepts.append(token)
        if self.last_windowed and type(token) is AcceptCompletion:
            self.accepted.append(self.last_windowed)
            self.last_windowed = 0
        if not self.scheduled:
            self.scheduled = True
            self.primary.changed.append(self)

    def enqueued(self, queue: Queue, entry: Entry) -> None:
        if self.senders:
            self.fresh.append(entry)
            if not self.scheduled:
                self.scheduled = True
                self.primary.changed.append(self)

    def acquired(self, queue: Queue, entry: Entry) -> None:
        if self.senders:
            self.taken.append(entry.position)
            if not self.scheduled:
                self.scheduled = True
                self.primary.changed.append(self)

    def recounted(self, queue: Queue, entry: Entry) -> None:
        pass  # the release that came with it carries the count to the backups

    def reinstated(self, queue: Queue, entry: Entry) -> None:
        """Its dequeue in this pass is void (a commit whose journal write failed, `Queue.reinstate`): called before
        this pass's `flush`, so the backups are never sent it and its guards stay; they keep the message as they
        have it (acquired until the release that follows, or available: one a commit's message pushed out)."""
        pos = entry.position
        self.gone.discard(pos)
        if self.windowed.pop(pos, None) is not None and self.last_windowed == pos:
            self.last_windowed = 0

    def released(self, queue: Queue, entry: Entry) -> None:
        if self.senders:
            self.returned.append((len(self.taken), entry.position, entry.flags & REDELIVERED, entry.count))
            if not self.scheduled:
                self.scheduled = True
                self.primary.changed.append(self)

    def _let_go(self) -> None:
        """Its queue was deleted in this pass after a delivery to it or an accept of it was held here (the delete
        let go of what was held before, `GuardBook.forget_queue`): nobody waits for backups to hold a queue that
        is gone, and the guards of a queue of that name declared again are not this one's."""
        tokens = [*self.held_tokens, *self.accepts]
        self.held_positions, self.held_tokens, self.held_bytes, self.accepts = [], [], 0, []
        self.fresh, self.gone, self.taken, self.returned, self.windowed = [], PositionSet(), [], [], {}
        self.accepted = []
        for c in tokens:
            c.release()

    def _accepted(self, windowed: dict[int, bytes], fresh: list[Entry]) -> list[Completion]:
        """Release, for each backup whose browser acknowledges dequeues, the accepted windowed messages of this pass
        that it was sent before the dequeue (see the class)."""
        accepted = [pos for pos in self.accepted if pos in windowed]
        self.accepted = []
        released: list[Completion] = []
        if not accepted:
            return released
        unsent = fresh[0].position if fresh else 0  # (this pass's messages: the browsers' `live` next)
        for name, s in self.senders.items():
            if s.closed or s.version < VERSION_GONE or not s.dequeue_acks:
                continue
            first = s.live[0].position if s.live else unsent
            sent = [pos for pos in accepted if pos <= s.snapshot_max or not first or pos < first]
            if sent:
                released += self.primary.guards.dequeued(self.queue, PositionSet(sorted(sent)), [name])
        return released

    def _state_ops(self) -> list[StateOp]:
        """The pass's acquisitions and releases, in order, as ranges and records."""
        taken, released = self.taken, self.returned
        self.taken, self.returned = [], []
        ops: list[StateOp] = []
        start = 0
        for upto, pos, flags, count in released:
            if upto > start:
                ops.append(("A", _ranges(taken[start:upto])))
                start = upto
            ops.append(("R", pos, flags, count))
        if len(taken) > start:
            ops.append(("A", _ranges(taken[start:])))
        return ops

    def dequeued(self, queue: Queue, entry: Entry, reason: DequeueReason) -> None:
        self.gone.add(entry.position)
        if entry.flags & WINDOWED and self.primary.guards.guarding:
            self.windowed[entry.position] = (entry, entry.data)  # (the queue empties the entry's data next)
            self.last_windowed = entry.position
        else:
            self.last_windowed = 0
        if not self.scheduled:
            self.scheduled = True
            self.primary.changed.append(self)

    def flush(self) -> None:
        self.scheduled = False
        p = self.primary
        if p.watches.get(self.queue) is not self:
            self._let_go()
            return
        fresh, self.fresh = self.fresh, []
        if self.held_tokens:
            positions, tokens, nbytes = self.held_positions, self.held_tokens, self.held_bytes
            self.held_positions, self.held_tokens, self.held_bytes = [], [], 0
            if not p.guards.hold(self.queue, positions, tokens, time.time(), nbytes):
                for c in tokens:  # the backups went away within this pass: nobody to wait for
                    c.release()
        gone = self.gone
        windowed: dict[int, bytes] = {}
        if gone:
            self.gone = PositionSet()
            if self.windowed:
                # (not one whose publisher was refused in this pass: its id left the window, broker.store)
                windowed = {pos: data for pos, (e, data) in self.windowed.items() if e.flags & WINDOWED}
                self.windowed = {}
                kept = PositionSet(sorted(windowed))
                released = p.guards.dequeued(self.queue, gone.difference(kept))
                # backups whose browser of the queue cannot send "G" records: as before, the dequeue releases
                older = [name for name, s in self.senders.items() if not s.closed and s.version < VERSION_GONE]
                if older:
                    released += p.guards.dequeued(self.queue, kept, older)
                if self.accepted:
                    released += self._accepted(windowed, fresh)
            else:
                released = p.guards.dequeued(self.queue, gone)
            for c in released:
                c.release()
        ops = self._state_ops() if self.taken or self.returned else None
        group: AcceptGroup[AcceptToken] | None = None
        if self.accepts:
            group = AcceptGroup(self.accepts)
            self.accepts = []
        for s in self.senders.values():
            if s.closed:
                continue
            if fresh:
                s.take_live(fresh)
            if gone:
                s.take_dequeued(gone)
                if windowed and s.version >= VERSION_GONE:
                    s.take_windowed(windowed)
                if group is not None and s.dequeue_acks:
                    s.dq_waits.add(gone, group)
            if ops and s.version >= 2:
                s.state_ops.extend(ops)
            p.to_run.add(s)
        if group is not None:
            store = p.server.store
            if store is not None and gone:  # and our own journal has the dequeues
                group.wait()
                store.when_synced(lambda: _answer(group.release_one()))
            if not group.waiting:
                _answer(group.tokens)


class ReplicatingSender(LinkHandler):
    """The primary end of a replicating browser: catch-up (newest first), live enqueues, dequeue ranges; one batch
    transfer per pass (or one transfer per message for a backup without the batch format)."""

    def __init__(self, primary: PrimarySide, link: Any, conn: ConnectionState, queue: Queue, backup: RemoteBackup,
                 plan: Any, batch: bool) -> None:
        super().__init__(primary.server, link, conn)
        self.primary = primary
        self.queue = queue
        self.backup = backup
        self.batch = batch
        self.qc = backup.catchup.start(queue.name, plan)
        # A backup that acknowledges in batches on $ha.acks gets pre-settled transfers (see ha.protocol).
        self.presettled = batch or (link.remote_properties or {}).get("acks") == P.ACKS_BATCHED
        self.expiry_tags = not batch and (link.remote_properties or {}).get(P.LINK_EXPIRY_TAGS) == 1
        self.snapshot_max = plan.snapshot_max
        self.live: deque[Entry] = deque()
        self.dequeues = PositionSet()
        self.dequeues.update(plan.dequeues)
        self.acks = PositionSet()  # acknowledged since the last run(): ranges, so the guards work per range
        # The backup acknowledges the dequeues it applied (batch acknowledgements version 2): consumer accepts of
        # this queue wait for them (ha.core.accepts).
        self.dequeue_acks = batch and (link.remote_properties or {}).get(P.LINK_DEQUEUE_ACKS) == 1
        self.dq_waits: DequeueWaits[AcceptToken] = DequeueWaits()
        # Live messages sent and not acknowledged: (highest position, bytes) per batch (per message in the older
        # format); the backup applies in order, so an acknowledgement of p covers every entry up to p.
        self.inflight: deque[tuple[int, int]] = deque()
        self.inflight_bytes = 0
        # Catch-up batches sent and not acknowledged: [highest position, bytes], in sending order (newest first).
        self.catchup_sent: deque[list[int]] = deque()
        self.catchup_bytes = 0
        self.limit = primary.config.ha_batch_bytes or 0
        self.flow_bytes = primary.config.ha_flow_bytes
        # Catch-up in flight: a few batches (enough to keep the backup busy, little enough that live messages of
        # other queues, which hold clients, do not wait long behind them on the connection); per message
        # transfer, half the window.
        window = primary.config.ha_flow_messages
        self.catchup_limit = min(self.limit, CATCHUP_BATCH) or 1
        self.catchup_max_bytes = CATCHUP_BATCHES * self.catchup_limit
        self.catchup_window = max(1, 16 * window if batch else window // 2)
        self.started = time.time()
        self.catchup_logged = False
        # Version 2 (the backup offered it): acquisitions, releases and the duplicate window travel too. The first
        # batch replaces the backup's window and marks what consumers hold now; the rest follows pass by pass.
        self.version = negotiate(batch, (link.remote_properties or {}).get(P.LINK_BATCH_MAX))
        self.state_ops: list[StateOp] = []
        self.unreadable = ""  # why catch-up could not go on (a paged message not read back): the link closes
        self.window: list[tuple[bytes, float]] | None = None
        # Version 4: windowed messages dequeued before they went out, position -> id key ("G" with the id, from
        # the live loop; None: read it from the entry there, a paged one's); positions the backup is to acknowledge
        # with no message ("G" without an id: the first batch's window has it), to send, and sent (not catch-up:
        # `_acked`).
        self.gone_ids: dict[int, bytes | None] = {}
        self.acks_only = PositionSet()
        self.acks_only_sent = PositionSet()
        self.unsent = _NO_POSITIONS  # catch-up positions this pass's dequeues took off the plan (`take_windowed`)
        # Version 3: transaction units this browser's next batch is a part of, and the highest live position that
        # batch must hold (every live message up to it, whatever the bytes bounds): see Primary._mark_unit.
        self.txn_units: list[tuple[int, int]] = []
        self.txn_top = 0
        if self.version >= 2:
            link.properties = {**(link.properties or {}), P.LINK_BATCH_MAX: self.version}
            held = [e.position for e in queue.entries.values() if e.state == ACQUIRED]
            if held:
                self.state_ops.append(("A", _ranges(sorted(held))))
            if queue.dedup is not None:
                queue.dedup.expire(time.time())
                self.window = queue.dedup.items()

    # ----- fed by the queue's watch and the backup ----------------------------------------------------------------
    def take_live(self, fresh: list[Entry]) -> None:
        if fresh[0].position <= self.snapshot_max:  # attached during this pass: the snapshot has the older ones
            fresh = [e for e in fresh if e.position > self.snapshot_max]
        self.live.extend(fresh)

    def take_dequeued(self, gone: PositionSet) -> None:
        if not self.qc.done and gone.min() <= self.snapshot_max:
            self.unsent = self.qc.dequeued(gone)
        elif self.unsent:
            self.unsent = _NO_POSITIONS
        self.dequeues = self.dequeues.union(gone)

    def take_windowed(self, windowed: dict[int, bytes]) -> None:
        """Windowed messages dequeued in this pass (position -> message; version 4): this backup is to get the id
        of each it has not been sent, and acknowledge it (QueueWatch)."""
        live = self.live
        first = live[0].position if live else 0
        unsent, self.unsent = self.unsent, _NO_POSITIONS
        for pos, data in windowed.items():
            if pos <= self.snapshot_max:
                if pos in unsent:  # a catch-up message never sent: the window of the first batch has its id
                    self.acks_only.add(pos)
                # else sent by catch-up (acknowledged exactly), or held by the backup when it attached
            elif first and pos >= first:  # not sent yet (`live` is ascending): its id goes alone
                self.gone_ids[pos] = self._window_key(data) if data else None  # (None: paged, dequeued unread)
            # else it was sent, with its id: the backup acknowledges it

    def _window_key(self, data: bytes) -> bytes:
        """The id key of a message dequeued before it was sent, if it is in the queue's window (b"": only
        acknowledged: a message read back from the journal may never have had its id taken, broker.store)."""
        k = _id_key(data)
        dedup = self.queue.dedup
        return k if dedup is not None and k in dedup else b""

    def txn_part(self, unit: int, parts: int) -> None:
        """The next batch is part of transaction unit `unit` (of `parts` parts on this backup): it carries every
        dequeue and live message gathered so far."""
        self.txn_units.append((unit, parts))
        if self.live:
            self.txn_top = max(self.txn_top, self.live[-1].position)

    def acknowledged(self, positions: PositionSet) -> None:
        self.acks = self.acks.union(positions) if self.acks else positions
        self.primary.to_run.add(self)

    def dequeues_acknowledged(self, positions: PositionSet) -> None:
        if self.dq_waits:
            _answer(self.dq_waits.acked(positions))

    def on_flow(self) -> None:
        self.primary.to_run.add(self)

    def on_delivery(self, d: Any) -> None:
        """A backup that settles each transfer (no $ha.acks): the settlement is the acknowledgement."""
        if raw.delivery_settled(d):
            tag = pn_delivery_tag(d)
            if isinstance(tag, bytes):
                tag = tag.decode("ascii", "replace")
            parsed = P.parse_message_tag(tag[1:]) if tag[:1] in (P.TAG_LIVE, P.TAG_CATCHUP) else None
            if parsed is not None:
                self.acknowledged(PositionSet([parsed[0]]))
            raw.delivery_settle(d)

    # ----- once per pass ----------------------------------------------------------------------------------------
    def run(self) -> None:
        if self.acks:
            acks, self.acks = self.acks, PositionSet()
            self._acked(acks)
        credit = raw.link_credit(self.l)
        if credit > 0:
            if self.batch:
                self._send_batches(credit)
            else:
                self._send_messages(credit)
        if self.unreadable:
            self.server.connections.close_link(self.link, "amqp:internal-error", self.unreadable)
            return
        if self.qc.done and not self.catchup_logged:
            self.catchup_logged = True
            prog = self.qc.progress()
            log.info("ha.catchup.end", backup=self.backup.name, queue=self.queue.name, messages=prog.sent,
                     seconds=round(time.time() - self.started, 3))
            self.primary.check_ready(self.backup)

    def _acked(self, acks: PositionSet) -> None:
        if not self.qc.done:
            self.qc.acked(acks)  # it tells catch-up positions from live ones itself
        caught = acks
        if self.acks_only_sent:  # "G" acknowledgements say nothing of catch-up batches
            caught = acks.difference(self.acks_only_sent)
            self.acks_only_sent = self.acks_only_sent.difference(acks)
        if self.catchup_sent and caught and caught.min() <= self.snapshot_max:
            # Applied in order, newest first: every catch-up batch down to the lowest acknowledged position is in.
            lowest = caught.min()
            sent = self.catchup_sent
            while sent and sent[0][0] >= lowest:
                self.catchup_bytes -= sent.popleft()[1]
        # The backup applies in order: an acknowledgement of p means every live transfer sent before p arrived.
        top = acks.max()
        inflight = self.inflight
        while inflight and inflight[0][0] <= top:
            self.inflight_bytes -= inflight.popleft()[1]
        self.primary.acked(self.backup, self.queue.name, acks)

    def _unreadable(self, pos: int, rest: list[int], failed: list[Paged]) -> bool:
        """A catch-up message not read: gone from the queue or damaged on disk (False: the backup is told it is
        gone), or its journal segment could not be read (an I/O error, `journal.read_error`: in `failed`). Then
        the backup cannot be made whole by this link: `rest` goes back to the plan, and the link is closed with the
        error at the end of the run (True); the backup attaches again and its catch-up starts over."""
        if all(p[0] != pos for p in failed):
            return False
        self.qc.give_back(rest)
        self.unreadable = (f"catch-up of queue {self.queue.name!r} stopped: its paged message at position {pos} "
                           "could not be read from the journal (an I/O error)")
        return True

    def _live_room(self) -> int:
        """Bytes of live messages that may be sent now (--ha-flow-bytes in flight; one message always may)."""
        return self.flow_bytes - self.inflight_bytes if self.inflight else max(self.flow_bytes, 1)

    def _catchup_room(self) -> int:
        """Catch-up messages that may be taken from the plan now (0 when its bytes in flight are at the bound)."""
        if self.qc.done or self.catchup_bytes >= self.catchup_max_bytes:
            return 0
        return self.catchup_window - self.qc.in_flight

    def _send_batches(self, credit: int) -> None:
        limit = self.limit
        version = self.version
        w = BatchWriter(limit, version)
        txn_top = 0
        part = bool(self.txn_units)
        if part:  # first in the batch; all of the unit's records of this queue go in this one batch
            for unit, unit_parts in self.txn_units:
                w.txn(unit, unit_parts)
            self.txn_units = []
            txn_top, self.txn_top = self.txn_top, 0
        if self.window is not None:
            w.window(self.window)
            self.window = None
        if self.dequeues:
            w.dequeue_ranges(self.dequeues.ranges())
            self.dequeues = PositionSet()
        if self.acks_only:
            # Within --ha-batch-bytes (a transaction's part is never split), as far as the credit goes (one kept for
            # the batch still open); the rest waits for more credit (`on_flow` runs this browser again).
            sent = PositionSet()
            for pos in self.acks_only:
                if w.size >= limit and not part:
                    if credit <= 1:
                        break
                    self._send(w.payload())
                    credit -= 1
                    w = BatchWriter(limit, version)
                w.gone(pos)
                sent.add(pos)
            self.acks_only_sent = self.acks_only_sent.union(sent)
            self.acks_only = self.acks_only.difference(sent)
        live = self.live
        if live:
            # The hot loop: BatchWriter.enqueue inlined, the live part of each batch remembered as (highest position,
            # bytes) for the flow bound (the backup applies batches in order).
            room = self._live_room()
            pack, head_size = ENQUEUE.pack, ENQUEUE.size
            parts, size, count = w.parts, w.size, w.count
            top = nbytes = 0
            gone_ids = self.gone_ids
            while live and (room > 0 or live[0].position <= txn_top):
                e = live.popleft()
                # Dequeued meanwhile (or paged out, read back and consumed): its dequeue range goes instead, and a
                # windowed one's id (its publisher waits for it: QueueWatch).
                dead = e.state >= DEAD and (e.state == DEAD or not self.queue.holds(e.position))
                if dead and not (gone_ids and e.position in gone_ids):
                    continue
                if size >= limit and e.position > txn_top:  # never splits a transaction's part
                    w.size, w.count = size, count
                    self._send_live(w, top, nbytes)
                    top = nbytes = 0
                    credit -= 1
                    w = BatchWriter(limit, version)
                    parts, size, count = w.parts, w.size, w.count
                    if credit <= 0:
                        live.appendleft(e)
                        return
                if dead:
                    k = gone_ids.pop(e.position)
                    if k is None:  # paged and dequeued unread: the copy here has the message
                        k = self._window_key(e.data) if e.data else b""
                    parts.append(GONE.pack(b"G", e.position, len(k)))
                    parts.append(k)
                    size += GONE.size + len(k)
                    count += 1
                    continue
                data = e.data
                n = len(data)
                flags = e.flags
                if e.state == ACQUIRED and version >= 2:
                    flags |= HELD
                parts.append(pack(b"E", e.position, e.level, flags, e.count, e.expires or 0.0, n))
                parts.append(data)
                size += head_size + n
                count += 1
                top = e.position
                nbytes += n
                room -= n
            w.size, w.count = size, count
            if nbytes:
                self.inflight.append((top, nbytes))
                self.inflight_bytes += nbytes
        if self.state_ops:  # after the live messages they may be about (a record for a position not there is moot)
            ops, self.state_ops = self.state_ops, []
            for op in ops:
                if op[0] == "A":
                    for lo, hi in op[1]:
                        w.acquired(lo, hi)
                else:
                    w.released(op[1], op[2], op[3])
        n = self._catchup_room()
        if n > 0:
            w = self._add_catchup(w, min(n, CATCHUP_CHUNK), credit)
        if w:
            self._send(w.payload())

    def _send_live(self, w: BatchWriter, top: int, nbytes: int) -> None:
        self._send(w.payload())
        if nbytes:
            self.inflight.append((top, nbytes))
            self.inflight_bytes += nbytes

    def _add_catchup(self, w: BatchWriter, n: int, credit: int) -> BatchWriter:
        """Pack up to `n` catch-up messages (newest first) into `w` and further batches, within the credit and
        the bytes bound; what does not fit goes back to the plan. Returns the batch still open."""
        batch = self.qc.next_batch(n)
        entries = self.queue.entries
        failed: list[Paged] = []  # paged messages whose segment could not be read (an I/O error)
        if self.queue.paged is not None:  # flow to disk: read what is paged back (a copy, for this batch only)
            entries = self.queue.read(batch, failed)
        sent = self.catchup_sent
        budget = self.catchup_max_bytes - self.catchup_bytes
        gone: list[int] = []
        top = 0  # highest catch-up position in `w`
        in_w = 0  # catch-up bytes in `w`
        limit = self.catchup_limit
        for i, pos in enumerate(batch):
            ce = entries.get(pos)
            if ce is None:
                if failed and self._unreadable(pos, batch[i:], failed):
                    break
                gone.append(pos)
                continue
            if w.size >= limit:
                if in_w:
                    sent.append([top, in_w])
                    self.catchup_bytes += in_w
                    top = in_w = 0
                self._send(w.payload())
                credit -= 1
                w = BatchWriter(self.limit, self.version)
                if credit <= 0 or budget <= 0:
                    self.qc.give_back(batch[i:])  # not sent after all: next pass
                    break
            data = ce.data
            # The duplicate window went whole in the first batch; a message a consumer holds says so (version 2).
            flags = ce.flags & (REDELIVERED | DURABLE)
            if ce.state == ACQUIRED and self.version >= 2:
                flags |= HELD
            w.enqueue(pos, ce.level, flags, ce.count, ce.expires, data)
            if not top:
                top = pos
            in_w += len(data)
            budget -= len(data)
        if in_w:
            sent.append([top, in_w])
            self.catchup_bytes += in_w
        if gone:
            self.qc.dequeued(gone)
        return w

    def _send(self, payload: bytes) -> None:
        raw.send_settled(self.l, next(_tags), payload)

    # ----- the per-message format (backups without batches) -----------------------------------------------------
    def _send_messages(self, credit: int) -> None:
        link = self.l
        if self.dequeues:
            body = Message(body=self.dequeues.to_wire()).encode()
            d = raw.send_tagged(link, f"{P.TAG_DEQUEUE}{next(_tags)}".encode(), body)
            raw.delivery_settle(d)
            credit -= 1
            self.dequeues = PositionSet()
        live = self.live
        if live:
            room = self._live_room()
            while live and credit > 0 and room > 0:
                e = live.popleft()
                if e.state >= DEAD and (e.state == DEAD or not self.queue.holds(e.position)):
                    continue
                d = raw.send_tagged(link, P.message_tag(P.TAG_LIVE, e.position, e.expires, self.expiry_tags), e.data)
                if self.presettled:
                    raw.delivery_settle(d)
                n = len(e.data)
                self.inflight.append((e.position, n))
                self.inflight_bytes += n
                credit -= 1
                room -= n
        n = min(credit, self._catchup_room())
        if n > 0:
            batch = self.qc.next_batch(n)
            failed: list[Paged] = []
            entries = self.queue.read(batch, failed) if self.queue.paged is not None else self.queue.entries
            for i, pos in enumerate(batch):
                ce = entries.get(pos)
                if ce is None:
                    if failed and self._unreadable(pos, batch[i:], failed):
                        break
                    self.qc.dequeued([pos])
                    continue
                d = raw.send_tagged(link, P.message_tag(P.TAG_CATCHUP, pos, ce.expires, self.expiry_tags), ce.data)
                if self.presettled:
                    raw.delivery_settle(d)

    def on_detached(self) -> None:
        p, b = self.primary, self.backup
        p.to_run.discard(self)
        w = p.watches.get(self.queue.name)
        if w is not None and w.senders.get(b.name) is self:
            del w.senders[b.name]
        if not self.closed and not p.server.connections.is_open(b.conn):
            return  # its whole connection is going: `Primary._drop_backup` answers the accepts that wait for it
        waited = self.dq_waits.drop()
        if b.senders.get(self.queue.name) is self:
            del b.senders[self.queue.name]
            p.replication_link_gone(b, self.queue.name, waited)
        else:
            _answer(waited)


_NO_POSITIONS = PositionSet()  # (never changed: shared)


def _id_key(data: bytes) -> bytes:
    """The duplicate-window key of a message the queue took (b"" if it has none: then only acknowledged)."""
    decode(data, trusted=True)
    return id_key(current_message_id()) or b""


def _answer(tokens: list[AcceptToken]) -> None:
    for t in tokens:
        t.release()


def _ranges(positions: list[int]) -> list[tuple[int, int]]:
    """(lo, hi) runs of positions taken in order (consumers take mostly ascending runs)."""
    s = PositionSet()
    s.add_sequence(positions)
    return s.ranges()


class AckLink(LinkHandler):
    """`$ha.acks`: a backup's batched acknowledgements, {queue: [[lo, hi], ...]} per message (pre-settled)."""

    CREDIT = 100

    def __init__(self, primary: PrimarySide, link: Any, conn: ConnectionState, backup: RemoteBackup) -> None:
        super().__init__(primary.server, link, conn)
        self.primary = primary
        self.backup = backup
        link.flow(self.CREDIT)

    def on_delivery(self, d: Any) -> None:
        if raw.delivery_partial(d):
            return
        data = raw.recv(self.l, raw.delivery_pending(d))
        raw.delivery_settle(d)
        raw.top_up(self.l, self.CREDIT, 0)  # in half-window steps: a flow frame per ack would wake the backup
        try:
            dequeued: dict[str, list[tuple[int, int]]] = {}
            if is_binary_acks(data):
                applied, dequeued = parse_acks(data)
                acks = {name: PositionSet.from_ranges(ranges) for name, ranges in applied.items()}
            else:
                m = Message()
                m.decode(data)
                props: Any = m.properties or {}
                report = props.get(P.DISK_LOW)
                if isinstance(report, str):  # a disk report, not an acknowledgement
                    self.primary.backup_disk(self.backup, report or None)
                    return
                body = m.body
                if not isinstance(body, dict):
                    raise ValueError("body is not a map")
                acks = {str(name): PositionSet.from_wire(ranges) for name, ranges in body.items()}
        except Exception as e:  # a broken peer: log it, never take the primary down
            log.error("ha.replication.error", backup=self.backup.name, description=f"bad acknowledgement: {e}")
            return
        for name, positions in acks.items():
            sender = self.backup.senders.get(name)
            if sender is not None and positions:
                sender.acknowledged(positions)
        for name, ranges in dequeued.items():
            sender = self.backup.senders.get(name)
            if sender is not None:
                sender.dequeues_acknowledged(PositionSet.from_ranges(ranges))


class StatusLink(LinkHandler):
    """`$ha.status`: the membership list, re-sent on every change. Unsettled: a backup settles each list once it
    holds it, which is how the primary knows it does (`Primary.view_fence_open`)."""

    def __init__(self, primary: PrimarySide, link: Any, conn: ConnectionState, backup: RemoteBackup) -> None:
        super().__init__(primary.server, link, conn)
        self.primary = primary
        self.backup = backup
        self.pending: tuple[int, bytes] | None = None
        self.unsettled: list[tuple[Any, int]] = []  # (delivery, list number) sent, not settled by the backup

    def send(self, seq: int, data: bytes) -> None:
        self.pending = (seq, data)  # only the newest membership matters
        self.on_flow()

    def on_flow(self) -> None:
        if self.pending is not None and raw.link_credit(self.l) > 0:
            seq, data = self.pending
            self.pending = None
            self.unsettled.append((raw.send(self.l, next(_tags), data), seq))

    def on_delivery(self, d: Any) -> None:
        if not raw.delivery_settled(d):
            return
        for i, (sent, seq) in enumerate(self.unsettled):
            if sent == d:
                del self.unsettled[i]
                raw.delivery_settle(d)
                self.backup.view_confirmed = max(self.backup.view_confirmed, seq)
                return

    def on_detached(self) -> None:
        self.primary.status_links.discard(self)
        self.primary.status_link_gone(self.backup)


