"""The primary's side of replication: remote backups, replicating browsers, guards, membership, recovery.

Delayed completion: a client's delivery to a replicated queue is settled only when every guarding backup has
acknowledged the message (or it was dequeued on the primary first). A backup guards from the moment it connects, so
when its catch-up is done it holds every message a client saw settled: that is when it becomes ready.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from proton import Message

from broker.links import Completion, LinkError, LinkHandler
from broker.log import fast, get_logger
from broker.queue import DequeueReason, Entry, Queue
from broker.server import ConnectionState, Refusal, Server
from broker.wiring import WiringEvent
from ha import protocol as P
from ha.core.catchup import BackupCatchup, plan_catchup
from ha.core.epoch import Decision, check_peer_epoch
from ha.core.guards import GuardBook
from ha.core.idset import PositionSet, as_position_set
from ha.core.lag import LagSampler
from ha.core.membership import Member, Membership
from ha.core.states import HaState, Role

if TYPE_CHECKING:
    from ha.node import HaNode

log = get_logger("ha.primary")
_status_tags = itertools.count(1)


@dataclass(eq=False)
class RemoteBackup:
    name: str
    address: str
    epoch: int
    conn: ConnectionState
    connected_at: float
    catchup: BackupCatchup
    state: HaState = HaState.CATCHUP
    senders: dict[str, ReplicatingSender] = field(default_factory=dict)
    wiring_done: bool = False  # the backup attached its status link: wiring mirrored, browsers requested


class Primary:
    def __init__(self, node: HaNode, expected: Iterable[str], previous_epoch: int) -> None:
        self.node = node
        self.server: Server = node.server
        self.config = node.config
        self.guards: GuardBook[Completion] = GuardBook()
        self.backups: dict[str, RemoteBackup] = {}
        self.status_links: set[StatusLink] = set()
        self.sampler = LagSampler(self.config.ha_lag_sample_max)
        self.expected: set[str] = set(expected)
        self.recovering_since = time.time()
        self.recovery_held: list[Completion] | None = [] if node.state == HaState.RECOVERING else None
        self.previous_epoch = previous_epoch
        # First position of this epoch per queue: a backup from the previous epoch may hold stale positions above.
        self.epoch_start: dict[str, int] = {}
        self.watches: dict[str, QueueWatch] = {}
        self.timed_out: list[str] = []
        self._timer: Any = None

    # ----- install / uninstall ----------------------------------------------------------------------------------
    def install(self) -> None:
        s = self.server
        s.holders.append(self)
        s.address_handlers[P.QUEUE_PREFIX] = self._attach_queue
        s.address_handlers[P.STATUS_ADDRESS] = self._attach_status
        s.address_handlers[P.ACKS_ADDRESS] = self._attach_acks
        s.wiring.queue_observer_factories.append(self._watch)
        s.wiring.observers.append(self)
        s.on_connection_closed.append(self._connection_closed)
        for q in s.wiring.queues.values():
            self.epoch_start[q.name] = q.next_position
            q.observers.append(self._watch(q))
        if self.recovery_held is not None:
            if self.expected:
                self._timer = s.schedule(self.config.ha_backup_timeout, self._recovery_timeout)
            else:
                s.wake_call(self._check_recovered)
        self.broadcast_membership()

    def uninstall(self) -> None:
        s = self.server
        # Stepping down: what recovery still holds is never confirmed (its clients are disconnected).
        self.recovery_held = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self in s.holders:
            s.holders.remove(self)
        s.address_handlers.pop(P.QUEUE_PREFIX, None)
        s.address_handlers.pop(P.STATUS_ADDRESS, None)
        s.address_handlers.pop(P.ACKS_ADDRESS, None)
        if self._watch in s.wiring.queue_observer_factories:
            s.wiring.queue_observer_factories.remove(self._watch)
        if self in s.wiring.observers:
            s.wiring.observers.remove(self)
        if self._connection_closed in s.on_connection_closed:
            s.on_connection_closed.remove(self._connection_closed)
        for name, w in list(self.watches.items()):
            q = s.wiring.queues.get(name)
            if q is not None and w in q.observers:
                q.observers.remove(w)
        self.watches.clear()
        for b in list(self.backups.values()):
            if b.conn.connection.state & 2:  # LOCAL_ACTIVE
                b.conn.connection.close()
        self.backups.clear()

    # ----- backups connecting -----------------------------------------------------------------------------------
    def backup_connecting(self, st: ConnectionState) -> None:
        """Connection policy for `kind=ha` connections: called before the connection opens."""
        props = st.properties
        name = props.get(P.PROP_BROKER)
        if not isinstance(name, str) or not name:
            raise Refusal("amqp:invalid-field", f"HA connection without {P.PROP_BROKER}")
        if name == self.server.id:
            raise Refusal("amqp:connection:forced", "that is me")
        theirs = int(props.get(P.PROP_EPOCH, 0) or 0)
        check = check_peer_epoch(self.node.epoch, theirs, my_role=Role.PRIMARY)
        if check.decision == Decision.DEMOTE:
            log.error("ha.epoch.refused", peer=name, peer_epoch=theirs, epoch=self.node.epoch)
            self.server.wake_call(lambda: self.node.demote(f"backup {name} has newer epoch {theirs}"))
            raise Refusal("amqp:connection:forced", check.reason)
        old = self.backups.get(name)
        if old is not None:
            self._drop_backup(old, "replaced by a new connection")
        address = str(props.get(P.PROP_ADDRESS, st.remote))
        catchup = BackupCatchup(self._replicated_queue_names())
        self.guards.add_backup(name)  # before any catch-up snapshot (see ha.core.catchup)
        b = RemoteBackup(name, address, theirs, st, time.time(), catchup)
        self.backups[name] = b
        log.info("ha.backup.connected", backup=name, address=address)
        self.update_membership()
        self.server.wake_call(lambda: self.check_ready(b))

    def _connection_closed(self, st: ConnectionState) -> None:
        for b in list(self.backups.values()):
            if b.conn is st:
                reason = "heartbeat" if _idle_timeout(st) else "disconnected"
                self._drop_backup(b, reason)

    def _drop_backup(self, b: RemoteBackup, reason: str) -> None:
        if self.backups.get(b.name) is not b:
            return
        del self.backups[b.name]
        released = self.guards.drop_backup(b.name)
        log.warning("ha.backup.lost", backup=b.name, address=b.address, reason=reason, released=len(released))
        coordinated = self.node.coordinated
        if coordinated is not None and b.state == HaState.READY:
            # The dropped backup must leave the coordinator's ready set before we settle without it, or it
            # could win an election while lacking these messages.
            coordinated.ready_set_changed(self.ready_names(), lambda: _release_all(released))
        else:
            _release_all(released)
        self.update_membership()

    def _replicated_queue_names(self) -> list[str]:
        default = self.node.default_level
        return [q.name for q in self.server.wiring.queues.values() if P.queue_level(q, default) == "all"]

    # ----- links ------------------------------------------------------------------------------------------------
    def _backup_of(self, st: ConnectionState) -> RemoteBackup:
        for b in self.backups.values():
            if b.conn is st:
                return b
        raise LinkError("amqp:unauthorized-access", "replication links need an HA connection from a backup")

    def _attach_queue(self, server: Server, link: Any, st: ConnectionState, address: str) -> LinkHandler:
        b = self._backup_of(st)
        if link.is_receiver:
            raise LinkError("amqp:invalid-field", "replicating browsers receive from the primary")
        name = address[len(P.QUEUE_PREFIX):]
        q = server.wiring.queues.get(name)
        if q is None:
            raise LinkError("amqp:not-found", f"no queue named {name!r}")
        props = link.remote_properties or {}
        uuid = props.get("uuid")
        if uuid is not None and uuid != q.uuid:
            raise LinkError("amqp:precondition-failed", f"queue {name!r} was recreated (uuid {q.uuid})")
        try:
            held = PositionSet.from_wire(props.get("held") or [])
        except ValueError as e:
            raise LinkError("amqp:invalid-field", f"bad held positions: {e}") from None
        reused_from: int | None = None
        if b.epoch < self.node.epoch:
            reused_from = self.epoch_start.get(name, 1) if b.epoch >= self.previous_epoch else 1
        plan = plan_catchup(as_position_set(q.positions()), held, reused_from=reused_from)
        link.source.address = address
        sender = ReplicatingSender(self, link, st, q, b, plan)
        old = b.senders.get(name)
        if old is not None:
            old.closed = True
        b.senders[name] = sender
        w = self.watches.get(name)
        if w is not None:
            w.senders[b.name] = sender
        log.info("ha.catchup.start", backup=b.name, queue=name, messages=len(plan.to_send))
        return sender

    def _attach_status(self, server: Server, link: Any, st: ConnectionState, address: str) -> LinkHandler:
        if link.is_receiver:
            raise LinkError("amqp:invalid-field", "the status link is read from the primary")
        h = StatusLink(self, link, st)
        self.status_links.add(h)
        b = self._backup_of(st)
        b.wiring_done = True
        self.server.wake_call(lambda: self.check_ready(b))
        h.send(self.membership_message())
        return h

    def _attach_acks(self, server: Server, link: Any, st: ConnectionState, address: str) -> LinkHandler:
        if not link.is_receiver:
            raise LinkError("amqp:invalid-field", "backups send their acknowledgements to the primary")
        b = self._backup_of(st)
        log.info("ha.backup.acks", backup=b.name, mode=P.ACKS_BATCHED)
        return AckLink(self, link, st, b)

    # ----- queues -----------------------------------------------------------------------------------------------
    def _watch(self, q: Queue) -> QueueWatch:
        w = QueueWatch(self, q.name)
        self.watches[q.name] = w
        return w

    def wiring_changed(self, ev: WiringEvent) -> None:
        if ev.type != "queue":
            return
        if ev.kind == "deleted":
            self.watches.pop(ev.name, None)
            for c in self.guards.forget_queue(ev.name):
                c.release()
            for b in self.backups.values():
                b.catchup.forget(ev.name)
                b.senders.pop(ev.name, None)
            self._check_all_ready()
        elif ev.kind == "declared":
            q = self.server.wiring.queues.get(ev.name)
            if q is None:
                return
            if P.queue_level(q, self.node.default_level) == "all":
                self.epoch_start.setdefault(q.name, 1)
                for b in self.backups.values():
                    if b.catchup.get(q.name) is None:
                        b.catchup.expect(q.name)
            else:
                # No longer replicated with messages (level changed): nobody waits for it any more.
                for c in self.guards.forget_queue(q.name):
                    c.release()
                for b in self.backups.values():
                    b.catchup.forget(q.name)
                self._check_all_ready()

    # ----- delayed completion -----------------------------------------------------------------------------------
    def hold(self, completion: Completion, routed: list[tuple[Queue, Entry]]) -> bool:
        held = False
        if self.recovery_held is not None:
            # A second, independent hold: released when recovery ends.
            completion.pending += 1
            self.recovery_held.append(completion)
        if self.backups:
            default = self.node.default_level
            now = time.time()
            places = [(q.name, e.position) for q, e in routed if P.queue_level(q, default) == "all"]
            if places:
                held = self.guards.hold(completion, places, now, nbytes=routed[0][1].msg.size)
        return held

    def acked(self, b: RemoteBackup, queue: str, positions: PositionSet) -> None:
        result = self.guards.acked(b.name, queue, positions)
        for c in result.released:
            c.release()
        if result.acked:
            now = time.time()
            backlog: int | None = None
            sample = self.sampler.sample
            for pos, enq in result.acked:
                rate = sample(now)
                if rate is not None:
                    if backlog is None:
                        backlog = self.guards.backlog(b.name)
                    fast.info("ha.lag", {"queue": queue, "backup": b.name, "position": pos, "enqueue_ts": enq,
                                         "ack_ts": now, "lag_ms": round((now - enq) * 1000.0, 3),
                                         "backlog": backlog, "sample_rate": rate})

    def dequeued(self, queue: str, position: int) -> None:
        for c in self.guards.dequeued(queue, position):
            c.release()

    # ----- readiness, recovery ----------------------------------------------------------------------------------
    def check_ready(self, b: RemoteBackup) -> None:
        if b.state == HaState.CATCHUP and self.backups.get(b.name) is b and b.wiring_done and b.catchup.ready:
            b.state = HaState.READY
            log.info("ha.backup.ready", backup=b.name, address=b.address,
                     seconds=round(time.time() - b.connected_at, 3))
            self.update_membership()
            self._check_recovered()

    def _check_all_ready(self) -> None:
        for b in list(self.backups.values()):
            self.check_ready(b)

    def _check_recovered(self) -> None:
        if self.recovery_held is None:
            return
        ready = {n for n, b in self.backups.items() if b.state == HaState.READY}
        if self.expected <= ready:
            self._finish_recovery()

    def _recovery_timeout(self) -> None:
        if self.recovery_held is None:
            return
        ready = {n for n, b in self.backups.items() if b.state == HaState.READY}
        self.timed_out = sorted(self.expected - ready)
        for name in self.timed_out:
            log.warning("ha.guard.timeout", backup=name, released=len(self.recovery_held))
        self._finish_recovery()

    def _finish_recovery(self) -> None:
        held, self.recovery_held = self.recovery_held or [], None
        for c in held:
            c.release()
        self.node.recovered(time.time() - self.recovering_since, self.timed_out)

    # ----- membership -------------------------------------------------------------------------------------------
    def membership(self) -> Membership:
        members = [Member.of(self.server.id, self.node.address, self.node.state)]
        for b in self.backups.values():
            members.append(Member.of(b.name, b.address, b.state))
        return Membership(self.node.epoch, tuple(members))

    def ready_names(self) -> list[str]:
        return sorted(n for n, b in self.backups.items() if b.state == HaState.READY)

    def update_membership(self) -> None:
        m = self.membership()
        if m != self.node.membership:
            self.node.set_membership(m)
            self.broadcast_membership()
            if self.node.coordinated is not None and self.node.state == HaState.ACTIVE:
                self.node.coordinated.ready_set_changed(self.ready_names())

    def membership_message(self) -> bytes:
        body = self.node.membership.to_wire()
        body["public_url"] = self.config.ha_public_url
        body["brokers_url"] = self.config.ha_brokers_url
        body["default_level"] = self.node.default_level
        return Message(body=body, subject="membership").encode()

    def broadcast_membership(self) -> None:
        data = self.membership_message()
        for h in list(self.status_links):
            h.send(data)

    # ----- status -----------------------------------------------------------------------------------------------
    def backup_status(self, name: str) -> dict[str, Any]:
        b = self.backups[name]
        oldest = self.guards.oldest_unacked_ts(name)
        prog = b.catchup.progress()
        return {
            "backlog": self.guards.backlog(name),
            "lag_ms": round((time.time() - oldest) * 1000.0, 1) if oldest is not None else 0.0,
            "queues": len(b.senders),
            "catchup": {"total": prog.total, "sent": prog.sent, "acked": prog.acked, "fraction": prog.fraction,
                        "waiting_for": b.catchup.waiting_for()[:10]},
        }


class QueueWatch:
    """One per queue on the primary: feeds queue events to the guards and to each backup's browser."""

    def __init__(self, primary: Primary, queue: str) -> None:
        self.primary = primary
        self.queue = queue
        self.senders: dict[str, ReplicatingSender] = {}

    def enqueued(self, queue: Queue, entry: Entry) -> None:
        for s in self.senders.values():
            s.on_enqueue(entry.position)

    def acquired(self, queue: Queue, entry: Entry) -> None:
        pass

    def released(self, queue: Queue, entry: Entry) -> None:
        pass

    def dequeued(self, queue: Queue, entry: Entry, reason: DequeueReason) -> None:
        self.primary.dequeued(queue.name, entry.position)
        for s in self.senders.values():
            s.on_dequeue(entry.position)


class ReplicatingSender(LinkHandler):
    """The primary end of a replicating browser: catch-up (newest first), live enqueues, batched dequeues."""

    def __init__(self, primary: Primary, link: Any, conn: ConnectionState, queue: Queue, backup: RemoteBackup,
                 plan: Any) -> None:
        super().__init__(primary.server, link, conn)
        self.primary = primary
        self.sender = link
        self.queue = queue
        self.backup = backup
        self.qc = backup.catchup.start(queue.name, plan)
        # A backup that acknowledges in batches on $ha.acks gets pre-settled transfers (see ha.protocol).
        self.presettled = (link.remote_properties or {}).get("acks") == P.ACKS_BATCHED
        self.snapshot_max = plan.snapshot_max
        self.live: deque[int] = deque()
        self.dequeues = PositionSet()
        self.dequeues.update(plan.dequeues)
        self.acks = PositionSet()  # acknowledged since the last run(): ranges, so the guards work per range
        self.ctl = 0
        self.started = time.time()
        self.catchup_logged = False
        primary.server.wake(self)

    def on_enqueue(self, position: int) -> None:
        self.live.append(position)
        self.server.wake(self)

    def on_dequeue(self, position: int) -> None:
        if position <= self.snapshot_max:
            self.qc.dequeued([position])
        self.dequeues.add(position)
        self.server.wake(self)

    def on_flow(self) -> None:
        self.server.wake(self)

    def on_delivery(self, delivery: Any) -> None:
        if delivery.settled:
            tag = delivery.tag
            if isinstance(tag, bytes):
                tag = tag.decode()
            if tag[:1] in (P.TAG_LIVE, P.TAG_CATCHUP):
                self.acks.add(int(tag[1:]))
                self.server.wake(self)
            delivery.settle()

    def run(self) -> None:
        if self.acks:
            acks, self.acks = self.acks, PositionSet()
            if not self.qc.done:
                self.qc.acked(acks)  # it tells catch-up positions from live ones itself
            self.primary.acked(self.backup, self.queue.name, acks)
        s = self.sender
        q = self.queue
        if self.dequeues and s.credit > 0:
            self.ctl += 1
            d = s.delivery(f"{P.TAG_DEQUEUE}{self.ctl}")
            s.send(Message(body=self.dequeues.to_wire()).encode())
            s.advance()
            d.settle()
            self.dequeues = PositionSet()
        live = self.live
        if live:
            # Bytes in flight to this backup (guarded, unacknowledged) bound what we send: --ha-flow-bytes.
            room = self.primary.config.ha_flow_bytes - self.primary.guards.in_flight(self.backup.name).bytes
            entries = q.entries
            credit = s.credit
            while live and credit > 0 and room > 0:
                pos = live.popleft()
                e = entries.get(pos)
                if e is None:
                    continue
                data = e.msg.data
                d = s.delivery(f"e{pos}")
                s.send(data)
                s.advance()
                if self.presettled:
                    d.settle()
                credit -= 1
                room -= len(data)
        # Catch-up takes at most half of the window, so live messages (which hold clients) never queue behind
        # a whole window of old ones.
        window = self.primary.config.ha_flow_messages
        room = min(s.credit, max(1, window // 2) - self.qc.in_flight)
        if room > 0 and not self.qc.done:
            for pos in self.qc.next_batch(room):
                e = q.entries.get(pos)
                if e is None:
                    self.qc.dequeued([pos])
                    continue
                d = s.delivery(f"{P.TAG_CATCHUP}{pos}")
                s.send(e.msg.data)
                s.advance()
                if self.presettled:
                    d.settle()
        if self.qc.done and not self.catchup_logged:
            self.catchup_logged = True
            prog = self.qc.progress()
            log.info("ha.catchup.end", backup=self.backup.name, queue=q.name, messages=prog.sent,
                     seconds=round(time.time() - self.started, 3))
            self.primary.check_ready(self.backup)

    def on_detached(self) -> None:
        w = self.primary.watches.get(self.queue.name)
        if w is not None and w.senders.get(self.backup.name) is self:
            del w.senders[self.backup.name]
        if self.backup.senders.get(self.queue.name) is self:
            del self.backup.senders[self.queue.name]


class AckLink(LinkHandler):
    """`$ha.acks`: a backup's batched acknowledgements, {queue: [[lo, hi], ...]} per message (pre-settled)."""

    CREDIT = 100

    def __init__(self, primary: Primary, link: Any, conn: ConnectionState, backup: RemoteBackup) -> None:
        super().__init__(primary.server, link, conn)
        self.backup = backup
        link.flow(self.CREDIT)

    def on_delivery(self, delivery: Any) -> None:
        if delivery.partial:
            return
        link = self.link
        data = link.recv(delivery.pending) or b""
        link.advance()
        delivery.settle()
        link.flow(1)
        m = Message()
        try:
            m.decode(data)
            body = m.body
            if not isinstance(body, dict):
                raise ValueError("body is not a map")
            acks = {str(name): PositionSet.from_wire(ranges) for name, ranges in body.items()}
        except Exception as e:  # a broken peer: log it, never take the primary down
            log.error("ha.replication.error", backup=self.backup.name, description=f"bad acknowledgement: {e}")
            return
        for name, positions in acks.items():
            sender = self.backup.senders.get(name)
            if sender is None:
                continue
            sender.acks.update(positions)
            self.server.wake(sender)


class StatusLink(LinkHandler):
    """`$ha.status`: the membership list, re-sent on every change (pre-settled)."""

    def __init__(self, primary: Primary, link: Any, conn: ConnectionState) -> None:
        super().__init__(primary.server, link, conn)
        self.primary = primary
        self.sender = link
        self.pending: deque[bytes] = deque()

    def send(self, data: bytes) -> None:
        self.pending.clear()  # only the newest membership matters
        self.pending.append(data)
        self.on_flow()

    def on_flow(self) -> None:
        s = self.sender
        while self.pending and s.credit > 0:
            d = s.delivery(f"m{next(_status_tags)}")
            s.send(self.pending.popleft())
            s.advance()
            d.settle()

    def on_detached(self) -> None:
        self.primary.status_links.discard(self)


def _release_all(completions: list[Completion]) -> None:
    for c in completions:
        c.release()


def _idle_timeout(st: ConnectionState) -> bool:
    c = st.connection
    try:
        t = c.transport
        cond = t.condition if t is not None else None
    except Exception:
        cond = None
    return bool(cond is not None and "idle" in (cond.description or "").lower())
