"""The backup end of a replicating browser: apply what the primary sends for one queue, then acknowledge.

Batches (ha.core.batch) are checked whole before anything is applied; a bad one is logged, the link closed and
attached again with what the backup holds, so the primary sends what is missing: nothing lost, nothing twice. The
per-message format of older primaries (ha.protocol tags) is applied too. A transaction part (batch format version 3)
and what arrives behind it on its queue wait in the Backup's `TxnParts` until every part of its unit has come: a
backup applies a transaction all or none.
"""

from __future__ import annotations

import itertools
import time
from typing import TYPE_CHECKING, Any, Protocol

from cproton import pn_delivery_tag
from proton import Condition, Endpoint, Message

from broker.dedup import key as id_key
from broker.engine import raw
from broker.errors import BatchError, MalformedMessage
from broker.log import get_logger
from broker.message import current_message_id, decode
from broker.queue import DURABLE, HELD, REDELIVERED, WINDOWED, DequeueReason, Entry, Queue
from ha import protocol as P
from ha.core import batch as B
from ha.core.idset import PositionSet

if TYPE_CHECKING:
    from broker.config import BrokerConfig
    from broker.server import Server
    from ha.core.txnparts import TxnParts

log = get_logger("ha.backup")


class _Standing(Protocol):
    @property
    def epoch(self) -> int: ...

    @property
    def ready_epoch(self) -> int: ...


class BackupSide(Protocol):
    """What a QueueReplicator uses of its backup (ha.backup.Backup), so that this module does not import it (no
    import circle under ha/)."""

    server: Server
    config: BrokerConfig
    ack_link: Any
    dequeue_acks: bool
    replicators: dict[str, QueueReplicator]
    txn_parts: TxnParts[tuple[QueueReplicator, list[B.Record]]]

    @property
    def node(self) -> _Standing: ...

    def receiver(self, address: str | None, name: str, credit: int, dynamic: bool = False,
                 properties: dict[str, Any] | None = None) -> Any: ...

    def _maybe_replicate(self, q: Queue) -> None: ...

    def txn_part(self, r: QueueReplicator, records: list[B.Record]) -> None: ...

    def replicator_ended(self, name: str) -> None: ...

    def acked(self, queue: str, positions: list[int]) -> None: ...

    def acked_range(self, queue: str, first: int, last: int) -> None: ...

    def dequeue_applied(self, queue: str, lo: int, hi: int) -> None: ...


def _held(q: Queue, e: Entry) -> None:
    """A consumer of the primary holds the message: kept as after a failover (one more delivery, redelivered)."""
    if not e.flags & HELD:
        e.flags |= HELD | REDELIVERED
        e.count += 1


def _released(q: Queue, e: Entry, r: B.Released) -> None:
    """The primary's consumer gave it back: its count as the primary has it (journaled here too)."""
    e.count -= 1 if e.flags & HELD else 0  # back to the count journaled: a holder's +1 was a guess
    e.flags = (e.flags & ~(HELD | REDELIVERED)) | (r.flags & REDELIVERED)
    q.recount(e, r.delivery_count)  # a failed delivery on the primary


class QueueReplicator:
    """The backup end of a replicating browser for one queue: apply what the primary sends, then acknowledge.

    Its transfers arrive on the event loop's hot path (`on_delivery` with a raw delivery); its attach and detach on
    the rare-event path (`on_link_remote_open`/`close`).
    """

    def __init__(self, backup: BackupSide, queue: Queue) -> None:
        self.backup = backup
        self.queue = queue
        self.closed = False
        self.batch = False  # the primary answered the attach with the batch format
        self.window = backup.config.ha_flow_messages
        self.max_message = backup.config.max_message_size
        self.unflowed = 0
        held = PositionSet.from_ranges(queue.position_ranges())
        # ready_epoch: the epoch of the primary whose messages these are (the primary re-sends positions it may
        # have assigned again since; ha.core.catchup)
        props: dict[str, Any] = {"held": held.to_wire(), "epoch": backup.node.epoch, "uuid": queue.uuid,
                                 "ready_epoch": backup.node.ready_epoch, P.LINK_EXPIRY_TAGS: 1}
        if backup.ack_link is not None:
            props["acks"] = P.ACKS_BATCHED
            if backup.config.ha_batch_bytes > 0:
                props[P.LINK_BATCH] = P.BATCH_VERSION
                props[P.LINK_BATCH_MAX] = B.VERSION_MAX
                if backup.dequeue_acks:
                    props[P.LINK_DEQUEUE_ACKS] = 1
        self.link = backup.receiver(P.QUEUE_PREFIX + queue.name, f"ha-q-{queue.name}", credit=self.window,
                                    properties=props)
        self.l = self.link._impl
        engine = backup.server.engine
        engine.add_fast(self.link, self)
        engine.set_link_handler(self.link, self)

    def close(self) -> None:
        self.closed = True
        self.backup.server.engine.remove_fast(self.link)
        if self.link.state & Endpoint.LOCAL_ACTIVE:
            self.link.close()

    def on_flow(self) -> None:
        pass

    def on_link_remote_open(self, event: Any) -> None:
        props = event.link.remote_properties or {}
        self.batch = props.get(P.LINK_BATCH) == P.BATCH_VERSION

    def on_delivery(self, d: Any) -> None:
        if raw.delivery_partial(d):
            return
        link = self.l
        data = raw.recv(link, raw.delivery_pending(d))
        if self.closed:
            raw.delivery_settle(d)
            return
        try:
            if self.batch:
                records = B.parse(data, self.max_message)
                # A part of a transaction unit (version 3), or a batch that may have to wait behind one
                if self.backup.txn_parts.holding or (records and type(records[0]) is B.TxnPart):
                    self.backup.txn_part(self, records)
                else:
                    self.apply(records)
            else:
                self._apply_message(d, data)
        except BatchError as e:
            # Nothing of this batch was applied. Closing the link makes the primary forget this browser; we
            # attach again with what we hold, and it sends what is missing (nothing lost, nothing twice).
            log.error("ha.replication.error", queue=self.queue.name, description=str(e))
            raw.delivery_settle(d)
            self._fail("amqp:decode-error", str(e))
            return
        # Pre-settled (acknowledged on $ha.acks) or not: settle. For a primary without $ha.acks the settlement is the
        # acknowledgement (an outcome would only cost a disposition update): then only once the journal holds it.
        store = self.backup.server.store
        if store is not None and not raw.delivery_settled(d):
            store.when_synced(lambda: self._settle_late(d))
        else:
            raw.delivery_settle(d)
        self.unflowed += 1
        if self.unflowed >= max(1, self.window // 2):
            raw.link_flow(link, self.unflowed)
            self.unflowed = 0

    def _settle_late(self, d: Any) -> None:
        if not self.closed:  # the pointer is valid while the link is (an unsettled delivery is not recycled)
            raw.delivery_settle(d)

    def apply(self, records: list[B.Record]) -> None:
        """Apply a parsed batch (a transaction part's "X" records say nothing more here)."""
        q = self.queue
        if q.deleted:
            return
        run = q.append_replicas(records)  # the usual live batch: new messages at the back, in one go
        if run is not None:
            first, last = run
            if last - first + 1 == len(records):  # no gaps (the usual case): one range
                self.backup.acked_range(q.name, first, last)
            else:
                self.backup.acked(q.name, [r[0] for r in records])  # type: ignore[misc]
            return
        entries = q.entries
        applied: list[int] = []
        for r in records:
            if type(r) is not tuple:  # version 2: acquired, released, the duplicate window; 3: "X"; 4: "G"
                if type(r) is B.Gone:  # dequeued on the primary before it was sent: its id only, acknowledged
                    if r.key and q.dedup is not None:  # type: ignore[union-attr]
                        q.dedup.add(r.key, time.time())  # type: ignore[union-attr]
                    applied.append(r.position)  # type: ignore[union-attr]
                elif type(r) is not B.TxnPart:
                    self._apply_state(q, r)  # type: ignore[arg-type]
            elif len(r) == 2:
                q.dequeue_range(r[0], r[1], DequeueReason.REPLICATED)  # type: ignore[misc, arg-type]
                self.backup.dequeue_applied(q.name, r[0], r[1])  # type: ignore[misc, arg-type]
            else:
                pos, level, flags, count, expires, body = r  # type: ignore[misc]
                if pos not in entries and (q.paged is None or pos not in q.paged):
                    e = q.enqueue_replica(pos, body, level, flags, count, expires)
                    if flags & (HELD | WINDOWED):
                        self._apply_flags(q, e, flags, body)
                applied.append(pos)
        if applied:
            self.backup.acked(q.name, applied)

    @staticmethod
    def _apply_flags(q: Queue, e: Entry, flags: int, body: bytes) -> None:
        """An enqueue record's version-2 flags: acquired on the primary (kept as after a failover: one more
        delivery, redelivered); its message-id entered the primary's window (so it enters ours, in position order:
        the same window)."""
        if flags & HELD:
            e.flags |= HELD | REDELIVERED
            e.count += 1
        if flags & WINDOWED and q.dedup is not None:
            decode(body, trusted=True)
            k = id_key(current_message_id())
            if k is not None:
                q.dedup.add(k, time.time(), 0 if e.flags & DURABLE or not q.options.durable else e.position)

    @staticmethod
    def _apply_state(q: Queue, r: B.Acquired | B.Released | B.Window) -> None:
        """The primary's consumers took (Acquired) or gave back (Released) messages. One this backup has paged is
        changed when it is read back (`Queue.mark_paged`): its delivery count and redelivered flag were lost."""
        entries = q.entries
        if isinstance(r, B.Acquired):
            lo, hi = r.lo, r.hi
            span = range(lo, hi + 1) if hi - lo < len(entries) else [p for p in entries if lo <= p <= hi]
            for pos in span:
                e = entries.get(pos)
                if e is not None:
                    _held(q, e)
            if q.paged is not None:
                for pos in list(itertools.takewhile(lambda p: p <= hi, q.paged.positions_after(lo - 1))):
                    q.mark_paged(pos, _held)
        elif isinstance(r, B.Released):
            e = entries.get(r.position)
            if e is not None:
                _released(q, e, r)
            else:
                q.mark_paged(r.position, lambda q2, e2, r=r: _released(q2, e2, r))
        elif q.dedup is not None:
            q.dedup.replace(r.items, time.time())

    def _apply_message(self, d: Any, data: bytes) -> None:
        """The per-message format: the tag says what the transfer is (ha.protocol)."""
        tag = pn_delivery_tag(d)
        if isinstance(tag, bytes):
            tag = tag.decode("ascii", "replace")
        kind, rest = tag[:1], tag[1:]
        q = self.queue
        if kind in (P.TAG_LIVE, P.TAG_CATCHUP):
            parsed = P.parse_message_tag(rest)
            if parsed is None:
                raise BatchError(f"bad replication tag {tag!r}")
            pos, expires = parsed
            if not q.holds(pos) and not q.deleted:
                try:
                    meta = decode(data, trusted=True)
                except MalformedMessage as e:
                    log.error("ha.replication.error", queue=q.name, position=pos, description=str(e))
                    return
                # The primary's absolute expiry when it sent one (else the TTL counts from our arrival)
                q.enqueue(data, meta.priority, expires or meta.expires, meta.durable, position=pos, replicated=True)
            if raw.delivery_settled(d):  # pre-settled by the primary: acknowledged in the next batch on $ha.acks
                self.backup.acked(q.name, [pos])
        elif kind == P.TAG_DEQUEUE:
            m = Message()
            try:
                m.decode(data)
                gone = PositionSet.from_wire(m.body or [])
            except (ValueError, Exception) as e:
                log.error("ha.replication.error", queue=q.name, description=f"bad dequeue ranges: {e}")
                return
            for lo, hi in gone.ranges():
                q.dequeue_range(lo, hi, DequeueReason.REPLICATED)

    def _fail(self, condition: str, description: str) -> None:
        self.close_with(condition, description)
        self.backup.replicator_ended(self.queue.name)
        if self.backup.replicators.get(self.queue.name) is self:
            del self.backup.replicators[self.queue.name]
            self.backup.server.schedule(0.5, lambda: self.backup._maybe_replicate(self.queue))

    def close_with(self, condition: str, description: str) -> None:
        self.closed = True
        self.backup.server.engine.remove_fast(self.link)
        if self.link.state & Endpoint.LOCAL_ACTIVE:
            self.link.condition = Condition(condition, description)
            self.link.close()

    def on_link_remote_close(self, event: Any) -> None:
        cond = event.link.remote_condition
        if not self.closed:
            log.warning("ha.replication.closed", queue=self.queue.name, condition=cond.name if cond else None,
                        description=cond.description if cond else None)
        self.closed = True
        self.backup.server.engine.remove_fast(self.link)
        if event.link.state & Endpoint.LOCAL_ACTIVE:
            event.link.close()
        if self.backup.replicators.get(self.queue.name) is self:
            self.backup.replicator_ended(self.queue.name)  # may start the connection again: then it is gone
        if self.backup.replicators.get(self.queue.name) is self:
            del self.backup.replicators[self.queue.name]
            # A recreated queue (uuid changed) is picked up again by the wiring events; retry others shortly.
            if cond is not None and cond.name != "amqp:not-found" and cond.name != "amqp:precondition-failed":
                self.backup.server.schedule(0.5, lambda: self.backup._maybe_replicate(self.queue))

    on_link_remote_detach = on_link_remote_close
