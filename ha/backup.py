"""The backup's side of replication: find the primary, mirror its wiring, replicate its queues.

One outgoing AMQP connection to the primary (tried in turn from `--ha-brokers-url`, skipping ourselves; reconnect
with backoff and jitter), made and driven by the broker's own event loop. On it: subscribe to `$events` first, then
QUERY queues, exchanges and bindings, reconcile, replay the events the queries did not cover, then open one
replicating browser per replicated queue. The control links (events, management replies, membership) carry proton
messages and take the event loop's rare-event path; the browsers take its hot path (raw deliveries).
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import random
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from proton import Endpoint, Message

from broker.engine import Conn, raw
from broker.errors import BatchError, WiringError
from broker.log import get_logger
from broker.options import QUEUE_ARGUMENTS, QueueOptions, normalize
from broker.queue import Queue
from broker.server import Server
from broker.tls import explain, is_tls_failure
from ha import protocol as P
from ha.core import batch as B
from ha.core import controller as C
from ha.core.epoch import Decision, check_peer_epoch
from ha.core.idset import PositionSet
from ha.core.membership import Membership
from ha.core.states import HaState, Role
from ha.core.txnparts import TxnParts, TxnPartsError
from ha.replica import QueueReplicator

if TYPE_CHECKING:
    from ha.ports import NodeSide

log = get_logger("ha.backup")

_corr = itertools.count(1)
_tags = itertools.count(1)

ATTEMPT_DEADLINE = 1.0  # seconds for TCP connect + AMQP open with one address before trying the next
AVOID_LOST_PRIMARY = 5.0  # seconds during which the address of a lost primary is tried last
CONTROL_CREDIT = 100


class Backup:
    """The handler of the connection to the primary (the event loop calls its `on_*` methods)."""

    def __init__(self, node: NodeSide) -> None:
        self.node = node
        self.server: Server = node.server
        self.config = node.config
        self.candidates = list(self.config.brokers)
        self.index = 0
        self.failures = 0
        self.conn: Conn | None = None
        self.session: Any = None
        self.connected = False
        self.stopped = False
        self.primary_name: str | None = None
        self.primary_address: str | None = None
        self.events_link: Any = None
        self.status_link: Any = None
        self.mgmt_sender: Any = None
        self.reply_link: Any = None
        self.reply_to: str | None = None
        self.pending: dict[str, Callable[[Message], None]] = {}
        self.events_buffer: list[Message] | None = None
        self.snapshot: dict[str, tuple[int, list[dict[str, Any]]]] = {}
        self.replicators: dict[str, QueueReplicator] = {}
        self.ack_link: Any = None  # batched acknowledgements to the primary, when it offers them
        self.binary_acks = False  # the primary reads the binary acknowledgement form
        self.pending_acks: dict[str, PositionSet] = {}  # queue -> positions applied, not yet acknowledged
        self.dequeue_acks = False  # the primary reads version-2 acknowledgements: dequeues are acknowledged too
        self.pending_dequeues: dict[str, PositionSet] = {}  # queue -> dequeue ranges applied, not yet acknowledged
        # queue -> the replicator whose positions those are: acknowledgements go by queue name, and a browser of
        # a queue declared again (or attached again) must not be given the ones of the link before it (`_owned`)
        self.ack_owners: dict[str, QueueReplicator | None] = {}
        self.disk_reports = False  # the primary reads disk reports on the acknowledgement link (P.DISK_LOW)
        self.reported_low_disk: str | None = None  # what the last disk report said (None: not low)
        # Version-3 transaction parts held until their unit is whole, and what waits behind them (ha.core.txnparts)
        self.txn_parts: TxnParts[tuple[QueueReplicator, list[B.Record]]] = TxnParts()
        self.wiring_ready = False
        self._reconnect_task: Any = None
        self._attempt_address: str | None = None
        self._failed: dict[str, str] = {}  # address -> last failure logged
        self._lost_address: str | None = None
        self._avoid_until = 0.0

    # ----- connection lifecycle ---------------------------------------------------------------------------------
    def start(self) -> None:
        # A backup's queues take messages only from its primary (broker.connections refuses new publishers): those
        # attached while it was primary, on connections its demotion kept (admin tools), go now.
        self.server.connections.refuse_publishers(
            f"{self.server.id} became a backup: its queues take messages only from its primary's replication")
        if self.server.connections.trust().open_replication:
            log.warning("access.open", description="replication is not authenticated (no --users-file, no "
                        "--ha-username): any connection may act as a backup of this broker; set "
                        "--ha-username/--ha-password on every broker")
        self._connect()

    def stop(self) -> None:
        self.stopped = True
        if self._reconnect_task is not None:
            self._reconnect_task.cancel()
        self._teardown()
        self._close()

    def _close(self) -> None:
        conn, self.conn = self.conn, None
        if conn is not None and not conn.closed:
            if conn.connection.state & Endpoint.LOCAL_ACTIVE:
                conn.connection.close()
            if conn.connecting:
                conn.abort("closed")

    def kick(self) -> None:
        """Try again now (e.g. the coordinator just named a new primary)."""
        if self.connected or self.stopped:
            return
        if self._reconnect_task is not None:
            self._reconnect_task.cancel()
        self.failures = 0
        self._connect()

    def _connect(self) -> None:
        self._reconnect_task = None
        if self.conn is not None and not self.connected:
            return  # an attempt is under way
        if self.stopped:
            return
        store = self.server.store
        if store is not None and store.failed is not None:
            self._schedule_reconnect()  # back once the journal can write again
            return
        me = (self.config.host, self.server.port)
        # The primary we just lost is most likely dead, and a dead host can make an attempt hang until its deadline:
        # for a few seconds try it only when every other address has been tried.
        avoid = self._lost_address if time.monotonic() < self._avoid_until else None
        for attempt in range(2 * len(self.candidates)):
            host, port = self.candidates[self.index % len(self.candidates)]
            self.index += 1
            if port == me[1] and host in (me[0], "localhost", "127.0.0.1") and me[0] in ("127.0.0.1", "localhost"):
                continue  # ourselves (same loopback address); other hosts are recognised by broker id
            if f"{host}:{port}" == avoid and attempt < len(self.candidates):
                continue
            break
        else:
            self._schedule_reconnect()
            return
        props = {
            P.PROP_KIND: "ha",
            P.PROP_BROKER: self.server.id,
            P.PROP_ADDRESS: self.node.address,
            P.PROP_EPOCH: self.node.epoch,
        }
        user = self.config.ha_username
        self.connected = False
        self._attempt_address = f"{host}:{port}"
        self.conn = self.server.engine.connect(
            host, port, self, properties=props, user=user if self.config.ha_password is not None else None,
            password=self.config.ha_password, mechanisms=_mechanism(self.config), heartbeat=self.config.ha_heartbeat,
            ssl_domain=self.server.ssl_client)
        # A dead host (link down, no RST) would leave the TCP connect hanging: give each attempt a deadline.
        conn = self.conn
        self.server.schedule(ATTEMPT_DEADLINE, lambda: self._attempt_timeout(conn))

    def _attempt_timeout(self, attempt: Conn) -> None:
        if self.conn is not attempt or self.connected:
            return
        attempt.abort(f"no answer within {ATTEMPT_DEADLINE}s")

    def _schedule_reconnect(self) -> None:
        if self.stopped or self._reconnect_task is not None:
            return
        self.failures += 1
        base = min(0.05 * (2 ** min(self.failures, 6)), 0.5)
        delay = base * (0.5 + random.random() / 2) if self.failures > len(self.candidates) else 0.05
        self._reconnect_task = self.server.schedule(delay, self._connect)

    def _lost(self, reason: str) -> None:
        was = self.connected
        self.connected = False
        self._teardown()
        self._close()
        if was:
            self._lost_address = self._attempt_address
            self._avoid_until = time.monotonic() + AVOID_LOST_PRIMARY
            log.warning("ha.primary.lost", primary=self.primary_name, address=self.primary_address, reason=reason)
            if self.node.state == HaState.CATCHUP:
                self.node.handle(C.Lost(f"primary lost: {reason}"))
        elif self._attempt_address is not None and self._failed.get(self._attempt_address) != reason:
            # Each distinct failure per address once (not every retry): a wrong password must not go unnoticed.
            self._failed[self._attempt_address] = reason
            log.warning("ha.connect.failed", address=self._attempt_address, reason=reason)
        self._schedule_reconnect()

    def _teardown(self) -> None:
        engine = self.server.engine
        for r in self.replicators.values():
            r.closed = True
            engine.remove_fast(r.link)
        self.replicators.clear()
        self.pending.clear()
        self.pending_acks.clear()
        self.pending_dequeues.clear()
        self.ack_owners.clear()
        units, batches = self.txn_parts.clear()
        if units:
            # Nothing of them was applied or acknowledged: the primary's clients never saw those commits settle.
            log.warning("ha.transaction.discarded", primary=self.primary_name, count=units, batches=batches)
        self.ack_link = None
        self.dequeue_acks = False
        self.disk_reports = False
        self.reported_low_disk = None
        self.events_buffer = None
        self.snapshot.clear()
        self.wiring_ready = False
        self.session = None

    def _current(self, event: Any) -> bool:
        return self.conn is not None and event.connection is not None and event.connection._impl == self.conn.c

    # ----- events of the connection (called by the event loop) -------------------------------------------------
    def on_connection_remote_open(self, event: Any) -> None:
        if not self._current(event):
            return
        c = event.connection
        props: Any = c.remote_properties or {}
        name = props.get(P.PROP_BROKER)
        if name == self.server.id:
            self._lost("connected to myself")
            return
        if props.get(P.PROP_ROLE) != "primary":
            return  # a backup: it closes the connection with a redirect right after this open
        theirs = int(props.get(P.PROP_EPOCH, 0) or 0)
        check = check_peer_epoch(self.node.epoch, theirs, my_role=Role.BACKUP)
        if check.decision == Decision.REFUSE_STALE:
            log.error("ha.epoch.refused", peer=name, peer_epoch=theirs, epoch=self.node.epoch)
            self._lost(f"stale primary: {check.reason}")
            return
        if check.decision == Decision.ADOPT_NEWER:
            self.node.adopt_epoch(theirs)
        self.connected = True
        self.failures = 0
        self._failed.clear()
        self.primary_name = str(name)
        self.primary_address = str(props.get(P.PROP_ADDRESS, ""))
        self.node.primary_public_url = props.get(P.PROP_PUBLIC_URL) or self.primary_address
        level = props.get(P.PROP_REPLICATE)
        if isinstance(level, str):
            self.node.default_level = level
        log.info("ha.primary.connected", primary=self.primary_name, address=self.primary_address, epoch=theirs)
        self.session = c.session()
        self.session.open()
        self.events_buffer = []
        self.events_link = self.receiver("$events", "ha-events", credit=10_000)
        self.mgmt_sender = self.sender("$management", "ha-mgmt")
        if props.get(P.PROP_ACKS) == P.ACKS_BATCHED and self.config.ha_batched_acks:
            self.ack_link = self.sender(P.ACKS_ADDRESS, "ha-acks")
            self.binary_acks = props.get(P.PROP_ACKS_FORMAT) == P.BATCH_VERSION and self.config.ha_batch_bytes > 0
            self.dequeue_acks = self.binary_acks and props.get(P.PROP_DEQUEUE_ACKS) == 1
            self.disk_reports = props.get(P.PROP_DISK_REPORTS) == 1
        self.reply_link = self.receiver(None, "ha-replies", credit=CONTROL_CREDIT, dynamic=True)

    def receiver(self, address: str | None, name: str, credit: int, dynamic: bool = False,
                 properties: dict[str, Any] | None = None) -> Any:
        link = self.session.receiver(name)
        if dynamic:
            link.source.dynamic = True
        else:
            link.source.address = address
        if properties:
            link.properties = properties
        if self.conn is not None:
            # Encode what is already queued first: proton writes a turn's attaches before its transfers, and the
            # primary must not read acknowledgements of a queue's old link after the attach of its new one.
            self.conn.pending_output()
        link.open()
        link.flow(credit)
        return link

    def sender(self, address: str, name: str) -> Any:
        link = self.session.sender(name)
        link.target.address = address
        link.open()
        return link

    def on_connection_remote_close(self, event: Any) -> None:
        if self._current(event):
            cond = event.connection.remote_condition
            self._lost(f"{cond.name}: {cond.description}" if cond else "closed")

    def on_transport_error(self, event: Any) -> None:
        if self._current(event):
            cond = event.transport.condition
            reason = f"{cond.name}: {cond.description}" if cond else "transport error"
            if cond is not None and self.conn is not None and self.conn.tls is not None \
                    and is_tls_failure(cond.name, cond.description):
                reason = f"TLS: {explain(cond.description)} ({cond.description})"
            self._lost(reason)

    def on_transport_closed(self, event: Any) -> None:
        if self._current(event):
            self._lost("disconnected")

    def on_link_remote_open(self, event: Any) -> None:
        if event.link == self.reply_link and self._current(event):
            self.reply_to = event.link.remote_source.address
            self._query_wiring()

    def on_link_remote_close(self, event: Any) -> None:
        link = event.link
        cond = link.remote_condition
        log.warning("ha.link.error", link=link.name, condition=cond.name if cond else None,
                    description=cond.description if cond else None)
        if link.state & Endpoint.LOCAL_ACTIVE:
            link.close()
        if link == self.ack_link and self._current(event):
            # The primary offered batched acknowledgements but refused the link: without it nothing we apply would
            # ever be acknowledged. Start again rather than stall its clients.
            self._lost("acknowledgement link refused")

    on_link_remote_detach = on_link_remote_close

    def on_delivery(self, event: Any) -> None:
        """Messages on the control links (events, membership, management replies)."""
        d = event.delivery
        link = event.link
        if not link.is_receiver:
            if d.remote_state or d.settled:
                d.settle()
            return
        if d.partial:
            return
        data = link.recv(d.pending) or b""
        link.advance()
        d.settle()
        link.flow(1)
        msg = Message()
        try:
            msg.decode(data)
        except Exception as e:
            log.error("ha.replication.error", description=f"undecodable control message on {link.name}: {e}")
            return
        if link == self.events_link:
            if self.events_buffer is not None:
                self.events_buffer.append(msg)
            else:
                self._apply_event(msg)
        elif link == self.status_link:
            self._membership(msg)
        elif link == self.reply_link:
            cb = self.pending.pop(str(msg.correlation_id), None)
            if cb is not None:
                cb(msg)

    def request(self, operation: str, type_: str, cb: Callable[[Message], None], name: str | None = None,
                body: Any = None) -> None:
        corr = str(next(_corr))
        props: dict[str, Any] = {"operation": operation, "type": type_}
        if name is not None:
            props["name"] = name
        self.pending[corr] = cb
        data = Message(properties=props, body=body, reply_to=self.reply_to, correlation_id=corr).encode()
        raw.send_settled(self.mgmt_sender._impl, next(_tags), data)  # the reply is the answer

    def end_of_pass(self) -> None:
        """Once per pass: one message acknowledging every position applied since the last one, once the
        journal holds them (a backup acknowledges only what it would still hold after a crash)."""
        store = self.server.store
        if store is not None and store.failed is not None and self.connected:
            # It cannot journal what it applies: it must not acknowledge, and must not keep the primary waiting.
            self._lost(f"journal cannot write: {store.failed}")
            return
        link = self.ack_link
        if link is None or not self.connected:
            return
        if self.disk_reports and store is not None and store.low_disk != self.reported_low_disk:
            self._report_disk(link, store.low_disk)
        if not (self.pending_acks or self.pending_dequeues):
            return
        acks, self.pending_acks = self.pending_acks, {}
        dequeues, self.pending_dequeues = self.pending_dequeues, {}
        owners, self.ack_owners = self.ack_owners, {}
        if store is None:
            self._send_acks(link, acks, dequeues, owners)
        else:
            store.when_synced(lambda: self._send_acks(link, acks, dequeues, owners))

    def _report_disk(self, link: Any, low: str | None) -> None:
        """Tell the primary this broker's journal disk went under its --min-disk-free (it then refuses durable
        messages: this broker journals them too) or is over it again. Without credit: at a later pass."""
        if link.credit > 0:
            raw.send_settled(link._impl, next(_tags), Message(properties={P.DISK_LOW: low or ""}).encode())
            self.reported_low_disk = low

    def _send_acks(self, link: Any, acks: dict[str, PositionSet], dequeues: dict[str, PositionSet],
                   owners: dict[str, QueueReplicator | None]) -> None:
        if link is not self.ack_link or not self.connected:
            return  # that connection is gone: the next one starts from what this broker holds
        stale = {name for name, r in owners.items() if self.replicators.get(name) is not r}
        if stale:
            # A queue's link was replaced while these waited for the journal (the queue deleted and declared again:
            # the primary numbers from 1 again): not for the new browser. What the backup holds it said at attach.
            acks = {n: ps for n, ps in acks.items() if n not in stale}
            dequeues = {n: ps for n, ps in dequeues.items() if n not in stale}
            if not acks and not dequeues:
                return
        if link.credit <= 0:  # wait for credit: merge back
            for mine, theirs in ((self.pending_acks, acks), (self.pending_dequeues, dequeues)):
                for name, positions in theirs.items():
                    self._owned(name)
                    have = mine.get(name)
                    mine[name] = positions if have is None else positions.union(have)
            return
        if self.binary_acks:
            data = B.encode_acks({name: positions.ranges() for name, positions in acks.items()},
                                 {name: ps.ranges() for name, ps in dequeues.items()} if self.dequeue_acks else None)
        else:
            data = Message(body={name: positions.to_wire() for name, positions in acks.items()}).encode()
        raw.send_settled(link._impl, next(_tags), data)

    def _query_wiring(self) -> None:
        for t in ("queue", "exchange", "binding"):
            self.request("QUERY", t, functools.partial(self._snapshot, t))

    def _snapshot(self, type_: str, msg: Message) -> None:
        props: Any = msg.properties or {}
        if props.get("statusCode") != 200:
            self._lost(f"QUERY {type_} failed: {props.get('statusDescription')}")
            return
        body: Any = msg.body or {}
        names = body.get("attributeNames", [])
        rows = [dict(zip(names, r, strict=False)) for r in body.get("results", [])]
        self.snapshot[type_] = (int(props.get("seq", 0)), rows)
        if len(self.snapshot) == 3:
            self._reconcile()

    # ----- wiring -----------------------------------------------------------------------------------------------
    def _reconcile(self) -> None:
        w = self.server.wiring
        default = self.node.default_level
        qseq, queues = self.snapshot["queue"]
        xseq, exchanges = self.snapshot["exchange"]
        bseq, bindings = self.snapshot["binding"]
        buffered = self.events_buffer or []
        self.events_buffer = None
        # Exchanges and queues as of the snapshot.
        want_x = {}
        for x in exchanges:
            if P.replicate_level(x.get("arguments") or {}, False, default) != "none":
                want_x[x["name"]] = x
        for name, x in want_x.items():
            self._ensure_exchange(name, x.get("exchange-type", "direct"), x.get("arguments") or {}, x.get("uuid"))
        want_q = {}
        for q in queues:
            if P.described_queue_level(q, default) != "none":
                want_q[q["name"]] = q
        for name, q in want_q.items():
            self._ensure_queue(name, q.get("arguments") or {}, q.get("uuid"), bool(q.get("temporary")))
        # Replicated objects the primary no longer has.
        for name, lq in list(w.queues.items()):
            if name not in want_q and P.queue_level(lq, default) != "none":
                w.delete_queue(name)
        for name, lx in list(w.exchanges.items()):
            if name not in want_x and P.replicate_level(lx.arguments, False, default) != "none":
                w.delete_exchange(name)
        # Queue/exchange events after their snapshots.
        for m in buffered:
            p: Any = m.properties or {}
            seq, t = int(p.get("seq", 0)), p.get("type")
            if (t == "queue" and seq > qseq) or (t == "exchange" and seq > xseq):
                self._apply_event(m)
        # Bindings as of their snapshot, then later binding events.
        want_b = set()
        for b in bindings:
            key = (b["source"], b["destination"], b.get("binding-key", ""))
            if self._binding_replicated(b):
                want_b.add(key)
                self._ensure_binding(key, b.get("arguments") or {})
        for lb in w.bindings():
            key = (lb.exchange, lb.queue, lb.key)
            if key not in want_b and self._binding_replicated(
                {"source": lb.exchange, "destination": lb.queue, "arguments": lb.arguments}
            ):
                w.unbind(*key)
        for m in buffered:
            bp: Any = m.properties or {}
            if bp.get("type") == "binding" and int(bp.get("seq", 0)) > bseq:
                self._apply_event(m)
        self.wiring_ready = True
        for lq in list(w.queues.values()):
            self._maybe_replicate(lq)
        if self.node.state in (HaState.JOINING, HaState.READY):
            self.node.handle(C.Connected(f"wiring mirrored from {self.primary_name}"))
        # Attached last: it tells the primary that the wiring is mirrored and every browser requested, so from
        # now on readiness only depends on catch-up. The primary answers with the membership list.
        self.status_link = self.receiver(P.STATUS_ADDRESS, "ha-status", credit=CONTROL_CREDIT)

    def _binding_replicated(self, b: dict[str, Any]) -> bool:
        default = self.node.default_level
        if P.replicate_level(b.get("arguments") or {}, False, default) == "none":
            return False
        w = self.server.wiring
        x = w.exchanges.get(b["source"])
        q = w.queues.get(b["destination"])
        if x is None or q is None:
            return False
        return (P.replicate_level(x.arguments, False, default) != "none"
                and P.queue_level(q, default) != "none")

    def _ensure_exchange(self, name: str, type_: str, args: dict[str, Any], uuid: str | None) -> None:
        w = self.server.wiring
        x = w.exchanges.get(name)
        if x is not None and (x.uuid != uuid or x.type != type_):
            w.delete_exchange(name)
            x = None
        if x is None:
            try:
                w.declare_exchange(name, type_, args, uuid=uuid)
            except WiringError as e:
                log.error("ha.wiring.error", type="exchange", name=name, description=str(e))

    def _ensure_queue(self, name: str, args: dict[str, Any], uuid: str | None, temporary: bool) -> None:
        w = self.server.wiring
        q = w.queues.get(name)
        if q is not None and q.uuid != uuid:
            self._stop_replicator(name)
            w.delete_queue(name)
            q = None
        if q is None:
            try:
                q, _ = w.declare_queue(name, args, uuid=uuid, temporary=temporary)
            except WiringError as e:
                log.error("ha.wiring.error", type="queue", name=name, description=str(e))
                return
        elif q.arguments != args:
            try:
                a = normalize(args, QUEUE_ARGUMENTS)
                q.update_options(a, QueueOptions.from_arguments(a))
            except ValueError as e:
                log.error("ha.wiring.error", type="queue", name=name, description=str(e))
        q.locked = True

    def _ensure_binding(self, key: tuple[str, str, str], args: dict[str, Any]) -> None:
        try:
            self.server.wiring.bind(key[0], key[1], key[2], args)
        except WiringError as e:
            log.error("ha.wiring.error", type="binding", name="|".join(key), description=str(e))

    def _apply_event(self, msg: Message) -> None:
        p: Any = msg.properties or {}
        kind, type_, name = p.get("kind"), p.get("type"), p.get("name")
        a: Any = msg.body or {}
        w = self.server.wiring
        default = self.node.default_level
        if type_ == "queue":
            if kind == "declared":
                level = P.described_queue_level(a, default)
                lq = w.queues.get(name)
                if level == "none":  # new, or an update to none: drop our mirror of it
                    if lq is not None and lq.uuid == a.get("uuid"):
                        self._stop_replicator(name)
                        w.delete_queue(name)
                    return
                self._ensure_queue(name, a.get("arguments") or {}, a.get("uuid"), bool(a.get("temporary")))
                q = w.queues.get(name)
                if q is not None and level != "all":  # an update to configuration: no messages any more
                    self._stop_replicator(name)
                    q.purge()
                elif q is not None and self.wiring_ready:
                    self._maybe_replicate(q)
            elif kind == "deleted" and name in w.queues:
                lq = w.queues[name]
                if P.queue_level(lq, default) != "none" and (a.get("uuid") in (None, lq.uuid)):
                    self._stop_replicator(name)
                    w.delete_queue(name)
        elif type_ == "exchange":
            if kind == "declared":
                if P.replicate_level(a.get("arguments") or {}, False, default) != "none":
                    self._ensure_exchange(name, a.get("type", "direct"), a.get("arguments") or {}, a.get("uuid"))
            elif kind == "deleted" and name in w.exchanges:
                w.delete_exchange(name)
        elif type_ == "binding":
            key = (a.get("source"), a.get("destination"), a.get("binding-key", ""))
            if kind == "bound" and self._binding_replicated(a):
                self._ensure_binding(key, a.get("arguments") or {})  # type: ignore[arg-type]
            elif kind == "unbound":
                with contextlib.suppress(WiringError):
                    w.unbind(*key)  # type: ignore[arg-type]

    # ----- queues -----------------------------------------------------------------------------------------------
    def _maybe_replicate(self, q: Queue) -> None:
        if not self.connected or q.name in self.replicators or q.deleted:
            return
        if P.queue_level(q, self.node.default_level) != "all":
            return
        self.replicators[q.name] = QueueReplicator(self, q)

    def _stop_replicator(self, name: str) -> None:
        r = self.replicators.pop(name, None)
        if r is not None:
            r.close()
            self.replicator_ended(name)

    def txn_part(self, r: QueueReplicator, records: list[B.Record]) -> None:
        """A batch that is a transaction part, or that arrived while parts are held: apply what may be applied now
        (ha.core.txnparts). Raises BatchError for parts that contradict each other (a broken primary)."""
        try:
            ready = self.txn_parts.arrive(r.queue.name, (r, records), B.txn_parts(records))
        except TxnPartsError as e:
            raise BatchError(str(e)) from None
        store = self.server.store
        if ready and store is not None:  # a whole unit applied in this pass: on disk all of it or none
            store.journal.begin_unit()
        for _, (rep, recs) in ready:
            if not rep.closed:
                rep.apply(recs)

    def replicator_ended(self, name: str) -> None:
        """A queue's replication link ended on its own. With a transaction unit incomplete, its missing part may
        never come (and what is held of this queue would be applied after a fresh catch-up): start again, which
        discards the incomplete units whole."""
        if self.txn_parts.holding and self.connected:
            self._lost(f"replication of queue {name} ended with a transaction incomplete")

    def acked(self, queue: str, positions: list[int]) -> None:
        self._pending_acks(queue).add_sequence(positions)

    def acked_range(self, queue: str, first: int, last: int) -> None:
        """`acked` for every position from `first` to `last`."""
        self._pending_acks(queue).add_range(first, last)

    def _pending_acks(self, queue: str) -> PositionSet:
        self._owned(queue)
        ps = self.pending_acks.get(queue)
        if ps is None:
            ps = self.pending_acks[queue] = PositionSet()
        return ps

    def _owned(self, queue: str) -> None:
        """Pending acknowledgements of `queue` are its current replicator's: an older one's are dropped."""
        owner = self.replicators.get(queue)
        if queue not in self.ack_owners:
            self.ack_owners[queue] = owner
        elif self.ack_owners[queue] is not owner:
            self.pending_acks.pop(queue, None)
            self.pending_dequeues.pop(queue, None)
            self.ack_owners[queue] = owner

    def dequeue_applied(self, queue: str, lo: int, hi: int) -> None:
        """A batch's dequeue range lo..hi was applied: acknowledged with the next batch (version-2 primaries)."""
        if self.dequeue_acks:
            self._owned(queue)
            ps = self.pending_dequeues.get(queue)
            if ps is None:
                ps = self.pending_dequeues[queue] = PositionSet()
            ps.add_range(lo, hi)

    # ----- membership -------------------------------------------------------------------------------------------
    def _membership(self, msg: Message) -> None:
        body: Any = msg.body or {}
        try:
            m = Membership.from_wire({"epoch": body.get("epoch"), "members": body.get("members"),
                                      "seq": body.get("seq", 0)})
        except ValueError as e:
            log.error("ha.membership.invalid", description=str(e))
            return
        if body.get("public_url"):
            self.node.primary_public_url = body["public_url"]
        self.node.set_membership(m)
        me = m.get(self.server.id)
        if me is not None and me.state == HaState.READY and self.node.state == HaState.CATCHUP:
            self.node.handle(C.CaughtUp(f"caught up with {self.primary_name}"))


def _mechanism(config: Any) -> str | None:
    """How a backup logs in to its primary: PLAIN as the replication user with its password, or EXTERNAL with its
    certificate (whose CN is the replication user) when there is no password (broker.auth)."""
    if config.ha_username is None:
        return None
    return "PLAIN" if config.ha_password is not None else "EXTERNAL"
