"""The primary's side of replication: remote backups, replicating browsers, guards, membership, recovery.

Delayed completion: a client's delivery to a replicated queue is settled only when every guarding backup has
acknowledged the message (or it was dequeued on the primary first). A backup guards from the moment it connects, so
when its catch-up is done it holds every message a client saw settled: that is when it becomes ready.

Per pass, not per message: a queue's watch collects what the pass enqueued and dequeued; at the end of the pass
(`end_of_pass`) it hands that to each backup's replicating browser, which sends it as one batch transfer
(ha.core.batch) together with catch-up messages; acknowledgements come back as ranges on `$ha.acks` once per pass
of the backup. A backup that does not speak the batch format gets one transfer per message, as before.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, cast

from proton import Message

from broker.connections import ConnectionState
from broker.errors import LinkError, Refusal
from broker.links import AcceptToken, Completion, LinkHandler
from broker.log import fast, get_logger
from broker.queue import Entry, Queue
from broker.server import Server
from broker.wiring import WiringEvent
from ha import protocol as P
from ha.core.batch import VERSION_GONE, VERSION_TXN
from ha.core.catchup import BackupCatchup, plan_catchup
from ha.core.epoch import Decision, check_peer_epoch
from ha.core.guards import GuardBook
from ha.core.idset import PositionSet
from ha.core.lag import LagHistogram, LagSampler
from ha.core.membership import Member, Membership
from ha.core.states import HaState, Role
from ha.replicating import AckLink, QueueWatch, RemoteBackup, ReplicatingSender, StatusLink

if TYPE_CHECKING:
    from ha.ports import NodeSide

log = get_logger("ha.primary")
_tags = itertools.count(1)
# Seconds a backup has to attach a queue's replication link again after detaching it alone (ours does in 0.5 s,
# after refusing a batch); the queue's settlements wait for it meanwhile.
REATTACH_GRACE = 5.0


class Primary:
    def __init__(self, node: NodeSide, expected: Iterable[str], previous_epoch: int) -> None:
        self.node = node
        self.server: Server = node.server
        self.config = node.config
        self.guards: GuardBook[Completion] = GuardBook()
        self.backups: dict[str, RemoteBackup] = {}
        self.status_links: set[StatusLink] = set()
        self.sampler = LagSampler(self.config.ha_lag_sample_max)
        self.expected: set[str] = set(expected)
        self.recovering_since = time.time()
        self.recovery_held: list[Completion | AcceptToken | _Twice] | None = (
            [] if node.state == HaState.RECOVERING else None)
        self.previous_epoch = previous_epoch
        # First position of this epoch per queue: a backup from the previous epoch may hold stale positions above.
        self.epoch_start: dict[str, int] = {}
        self.watches: dict[str, QueueWatch] = {}
        self._replicated: dict[Queue, bool] = {}
        self.changed: list[QueueWatch] = []  # watches with news this pass
        # Queues that transactions committed in this pass touched: one transaction unit (ha.core.batch version 3)
        self.txn_queues: dict[str, None] = {}
        self.txn_units = itertools.count(1)
        self.to_run: set[ReplicatingSender] = set()  # senders with work this pass
        self.timed_out: list[str] = []
        self._timer: Any = None
        self.seq = 0  # the number of the last member list of this epoch (Membership.seq)
        # Without a coordinator: after a ready backup was dropped, the number of the first member list without it.
        # Nothing is settled until every ready backup holds that list (`view_fence_open`), and when it was set.
        self.view_fence = 0
        self.view_fence_since = 0.0
        self.view_fence_dropped: list[str] = []  # the ready backups dropped since it was raised (for ha-status)
        self.lag_histograms: dict[str, LagHistogram] = {}  # per backup, since this broker became primary (metrics)

    # ----- install / uninstall ----------------------------------------------------------------------------------
    def install(self) -> None:
        s = self.server
        s.wiring.queue_observer_factories.append(self._watch)
        s.wiring.observers.append(self)
        for q in s.wiring.queues.values():
            self.epoch_start[q.name] = q.next_position
            q.observers.append(self._watch(q))
        if self.recovery_held is not None:
            if self.expected:
                self._timer = s.schedule(self.config.ha_backup_timeout, self._recovery_timeout)
            else:
                s.wake_call(self._check_recovered)
        self.update_membership()  # the first list of this epoch: this broker primary, nobody ready yet (journaled)
        self.broadcast_membership()

    def uninstall(self) -> None:
        s = self.server
        # Stepping down: what recovery still holds is never confirmed (its clients are disconnected).
        self.recovery_held = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._watch in s.wiring.queue_observer_factories:
            s.wiring.queue_observer_factories.remove(self._watch)
        if self in s.wiring.observers:
            s.wiring.observers.remove(self)
        for name, w in list(self.watches.items()):
            q = s.wiring.queues.get(name)
            if q is not None and w in q.observers:
                q.observers.remove(w)
        self.watches.clear()
        self.changed.clear()
        self.to_run.clear()
        for b in list(self.backups.values()):
            if b.conn.connection.state & 2:  # LOCAL_ACTIVE
                b.conn.connection.close()
            b.cancel_reattach()
        self.backups.clear()
        if s.store is not None:
            for name in list(s.store.backups_low_disk):
                s.store.backup_low_disk(name, None)

    # ----- backups connecting -----------------------------------------------------------------------------------
    def backup_connecting(self, st: ConnectionState) -> None:
        """Admission of `kind=ha` connections: called before the connection opens."""
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

    def connection_closed(self, st: ConnectionState) -> None:
        for b in list(self.backups.values()):
            if b.conn is st:
                reason = "heartbeat" if _idle_timeout(st) else "disconnected"
                self._drop_backup(b, reason)

    def _drop_backup(self, b: RemoteBackup, reason: str, waited: Sequence[AcceptToken] = ()) -> None:
        """`waited`: accepts that waited for a replication link of it that is gone already."""
        if self.backups.get(b.name) is not b:
            _release_all(waited)
            return
        del self.backups[b.name]
        b.cancel_reattach()
        store = self.server.store
        if store is not None:
            store.backup_low_disk(b.name, None)  # its disk no longer holds back this broker's publishers
        accepts: list[AcceptToken] = [*waited]  # consumer accepts that waited for its dequeue acknowledgements
        for s in b.senders.values():
            s.closed = True
            self.to_run.discard(s)
            accepts += s.dq_waits.drop()
        guarded = self.guards.drop_backup(b.name)
        log.warning("ha.backup.lost", backup=b.name, address=b.address, reason=reason, released=len(guarded))
        released: list[AcceptToken] = [*guarded, *accepts]
        self.update_membership()  # journals the list without it (HaNode.set_membership)
        coordinated = self.node.coordinated
        if coordinated is None and b.state == HaState.READY and self.seq > self.view_fence:
            if not self.view_fence:
                self.view_fence_since = time.time()
                self.view_fence_dropped = []
            self.view_fence = self.seq
            self.view_fence_dropped.append(b.name)
        if coordinated is not None and b.state == HaState.READY:
            # The dropped backup must leave the coordinator's ready set before we settle without it, or it
            # could win an election while lacking these messages. (After update_membership: a second request
            # without a callback would replace this one.)
            coordinated.ready_set_changed(self.ready_names(), lambda: _release_all(released))
        elif store is not None and b.state == HaState.READY:
            # Nor may we settle without it before our journal holds the list without it: after a whole-cluster
            # outage that list is what keeps it from being promoted (ha.core.restart).
            store.when_synced(lambda: _release_all(released))
        else:
            _release_all(released)

    def status_link_gone(self, b: RemoteBackup) -> None:
        """A backup holds `$ha.status` as long as its connection. One whose link went alone (a bug on either side,
        a peer of another release) would never confirm another member list, and the first ready backup dropped
        after it would hold every settlement for good (`view_fence_open`): drop it and close its connection, so
        that it connects again and catches up. Nothing to do when the whole connection is going."""
        conns = self.server.connections
        if self.backups.get(b.name) is not b or not conns.is_open(b.conn):
            return
        self._drop_backup(b, "its $ha.status link was detached")
        conns.close(b.conn, "amqp:connection:forced", "the $ha.status link was detached: connect again")

    def replication_link_gone(self, b: RemoteBackup, name: str, waited: Sequence[AcceptToken]) -> None:
        """A backup's replication link for queue `name` detached while its connection stayed (it refused a batch
        and attaches again, or a bug, a peer of another release). A ready backup is dropped at once, and its
        connection closed so that it connects again and catches up: consumer accepts of the queue would otherwise
        be answered without its dequeue acknowledgement (those that waited for the old link (`waited`), and every
        one until the link is back), while it stays ready and promotable without the dequeue; they are answered as
        for any dropped backup (`_drop_backup`). Settlements of publishes wait for its acknowledgements (the
        guards) until a backup still catching up attaches again; one that never does would hold them for as
        long as its connection lives: it is given REATTACH_GRACE seconds, then dropped the same way."""
        conns = self.server.connections
        if self.backups.get(b.name) is not b or not conns.is_open(b.conn):
            _release_all(waited)
            return
        q = self.server.wiring.queues.get(name)
        if b.state == HaState.READY and q is not None and not q.deleted and self.replicated(q):
            self._drop_backup(b, f"its replication link for queue {name!r} was detached while it was ready", waited)
            conns.close(b.conn, "amqp:connection:forced",
                        f"the replication link for queue {name!r} was detached: connect again")
            return
        _release_all(waited)  # (a backup still catching up is not promotable: accepts do not wait for it)
        _cancel(b.reattach.pop(name, None))
        b.reattach[name] = self.server.schedule(REATTACH_GRACE, lambda: self._reattach_due(b, name))

    def _reattach_due(self, b: RemoteBackup, name: str) -> None:
        b.reattach.pop(name, None)
        conns = self.server.connections
        if self.backups.get(b.name) is not b or not conns.is_open(b.conn) or name in b.senders:
            return
        q = self.server.wiring.queues.get(name)
        if q is None or q.deleted or not self.replicated(q):
            return
        self._drop_backup(b, f"its replication link for queue {name!r} was not attached again in {REATTACH_GRACE:g} s")
        conns.close(b.conn, "amqp:connection:forced",
                    f"the replication link for queue {name!r} was detached and not attached again: connect again")

    def _replicated_queue_names(self) -> list[str]:
        default = self.node.default_level
        return [q.name for q in self.server.wiring.queues.values() if P.queue_level(q, default) == "all"]

    # ----- links ------------------------------------------------------------------------------------------------
    def attach(self, link: Any, st: ConnectionState, address: str) -> LinkHandler | None:
        if address.startswith(P.QUEUE_PREFIX):
            return self._attach_queue(link, st, address)
        if address == P.STATUS_ADDRESS:
            return self._attach_status(link, st)
        if address == P.ACKS_ADDRESS:
            return self._attach_acks(link, st)
        return None

    def _backup_of(self, st: ConnectionState) -> RemoteBackup:
        """The backup whose connection this is; anyone else attaching a replication link is refused. A connection
        is a backup's only when its login was the replication user (broker.auth.admit granted it `ha`) and it was
        admitted as one (`backup_connecting`)."""
        if st.kind == "ha":
            for b in self.backups.values():
                if b.conn is st:
                    return b
        raise LinkError("amqp:unauthorized-access",
                        f"replication links are for backups: connection {st.id} (user {st.user!r}, kind {st.kind}) "
                        "is not one (a backup logs in as the replication user, --ha-username)")

    def _attach_queue(self, link: Any, st: ConnectionState, address: str) -> LinkHandler:
        b = self._backup_of(st)
        if link.is_receiver:
            raise LinkError("amqp:invalid-field", "replicating browsers receive from the primary")
        name = address[len(P.QUEUE_PREFIX):]
        q = self.server.wiring.queues.get(name)
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
        # The epoch its messages come from: the newest in which it was ready or primary (a backup announces it; an
        # older one only its current epoch, which it may have adopted from the coordinator before catching up).
        data_epoch = props.get("ready_epoch")
        if not isinstance(data_epoch, int) or isinstance(data_epoch, bool) or data_epoch < 0:
            data_epoch = b.epoch
        reused_from: int | None = None
        if data_epoch < self.node.epoch:  # positions from epoch_start on may name other messages here
            reused_from = self.epoch_start.get(name, 1) if data_epoch >= self.previous_epoch else 1
        plan = plan_catchup(PositionSet.from_ranges(q.position_ranges()), held, reused_from=reused_from)
        batch = props.get(P.LINK_BATCH) == P.BATCH_VERSION and self.config.ha_batch_bytes > 0
        link.source.address = address
        if batch:
            link.properties = {P.LINK_BATCH: P.BATCH_VERSION}
        sender = ReplicatingSender(self, link, st, q, b, plan, batch)
        # From here the backup acknowledges this queue's live messages in order; what it holds of ours is done
        # (plan.skip: held and on this queue, less positions reused since its epoch, whose message differs here).
        _release_all(self.guards.start(b.name, name, plan.snapshot_max, plan.skip))
        # Places it guards that are off the queue already: windowed messages dequeued before this browser could
        # send them (QueueWatch). The window of its first batch has their ids; it acknowledges them after it ("G"
        # records). A backup of an older batch format is not waited for (as before version 4).
        # Those dequeued in this very round are not held yet (the watch's flush holds them after this): theirs too.
        left = self.guards.outstanding(b.name, name) if q.dedup is not None else None
        if left:
            left = left.difference(PositionSet.from_ranges(q.position_ranges()))
        w = self.watches.get(name)
        if w is not None and w.windowed and sender.version >= VERSION_GONE:
            left = (left or PositionSet()).union(PositionSet(sorted(w.windowed)))
        if left:
            if sender.version >= VERSION_GONE:
                sender.acks_only = left
            else:
                _release_all(self.guards.dequeued(name, left, [b.name]))
        _cancel(b.reattach.pop(name, None))
        old = b.senders.get(name)
        if old is not None:
            old.closed = True
            self.to_run.discard(old)
        b.senders[name] = sender
        w = self.watches.get(name)
        if w is not None:
            w.senders[b.name] = sender
        log.info("ha.catchup.start", backup=b.name, queue=name, messages=len(plan.to_send),
                 format="batch" if batch else "message")
        self.to_run.add(sender)
        return sender

    def _attach_status(self, link: Any, st: ConnectionState) -> LinkHandler:
        if link.is_receiver:
            raise LinkError("amqp:invalid-field", "the status link is read from the primary")
        b = self._backup_of(st)
        h = StatusLink(self, link, st, b)
        self.status_links.add(h)
        b.wiring_done = True
        self.server.wake_call(lambda: self.check_ready(b))
        h.send(*self.membership_message())
        return h

    def _attach_acks(self, link: Any, st: ConnectionState) -> LinkHandler:
        if not link.is_receiver:
            raise LinkError("amqp:invalid-field", "backups send their acknowledgements to the primary")
        b = self._backup_of(st)
        log.info("ha.backup.acks", backup=b.name, mode=P.ACKS_BATCHED)
        return AckLink(self, link, st, b)

    def backup_disk(self, b: RemoteBackup, low: str | None) -> None:
        """A backup's disk report: its journal's disk is under its --min-disk-free (`low`: why) or over it again.
        While any backup's is under, durable messages for durable queues are refused here as for this broker's own
        disk (`Store.refusing`): the backup must journal each of them before it acknowledges, and a backup whose
        disk fills must leave the cluster."""
        if self.backups.get(b.name) is not b:
            return
        if low is not None:
            log.warning("ha.backup.disk.low", backup=b.name, description=low)
        else:
            log.warning("ha.backup.disk.ok", backup=b.name)
        store = self.server.store
        if store is not None:  # without a journal here durable messages are taken as any (docs/durability.md)
            store.backup_low_disk(b.name, low)

    # ----- queues -----------------------------------------------------------------------------------------------
    def _watch(self, q: Queue) -> QueueWatch:
        w = QueueWatch(self, q.name)
        self.watches[q.name] = w
        return w

    def wiring_changed(self, ev: WiringEvent) -> None:
        if ev.type != "queue":
            return
        self._replicated.clear()  # levels may have changed (rare: recompute lazily)
        if ev.kind == "deleted":
            w = self.watches.pop(ev.name, None)
            if w is not None:
                w.senders.clear()
            for c in self.guards.forget_queue(ev.name):
                c.release()
            for b in self.backups.values():
                b.catchup.forget(ev.name)
                s = b.senders.pop(ev.name, None)
                if s is not None:
                    self.to_run.discard(s)
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
    def replicated(self, q: Queue) -> bool:
        """Does `q` replicate its messages (level all)? Cached per queue; wiring events refresh it."""
        r = self._replicated.get(q)
        if r is None:
            r = self._replicated[q] = P.queue_level(q, self.node.default_level) == "all"
        return r

    def hold(self, completion: Completion, routed: list[tuple[Queue, Entry]]) -> bool:
        held = False
        if self.recovery_held is not None:
            # A second, independent hold: released when recovery ends.
            completion.pending += 1
            self.recovery_held.append(completion)
        if self.backups:
            # Each replicated place joins its queue's group for this pass (held in the guards at the end of the
            # pass); the completion waits for each of them.
            places = 0
            watches = self.watches
            for q, e in routed:
                if self.replicated(q):
                    w = watches.get(q.name)
                    if w is not None:
                        w.hold(e.position, completion, len(e.data))
                        places += 1
            if places:
                completion.pending += places - 1
                held = True
        return held

    def hold_group(self, q: Queue, completions: list[Completion], entries: list[Entry]) -> bool:
        """`hold` for a pass's deliveries to one plain queue: they join its group for this pass at once."""
        if self.recovery_held is not None:
            for c in completions:
                c.pending += 1
            self.recovery_held.extend(completions)
        if self.backups and not q.deleted and self.replicated(q):
            w = self.watches.get(q.name)
            if w is not None:
                w.hold_group(completions, entries)
                return True
        return False

    def settle_shortfall(self) -> tuple[int, int] | None:
        """(ready, required) while fewer backups are ready than --ha-min-ready-backups, else None."""
        need = self.config.ha_min_ready_backups
        if need:
            ready = len(self.ready_names())
            if ready < need:
                return ready, need
        return None

    def hold_accept(self, token: AcceptToken, q: Queue) -> bool:
        """A consumer's accept on a replicated queue is answered once the backups that receive its dequeues
        acknowledged them and the journal has it (see ha.core.accepts), or, with no backup to wait for, once the
        journal has it; and while this primary recovers, once the backups ready before the failover are back (or
        their wait timed out), as publishes are: one of them may still hold the message, and be promoted next."""
        if not self.replicated(q):
            return False
        w = self.watches.get(q.name)
        backups = self.backups and w is not None and any(s.dequeue_acks for s in w.senders.values())
        store = self.server.store
        if not backups and store is None and self.recovery_held is None:
            return False
        t: AcceptToken | _Twice = token
        if self.recovery_held is not None:
            t = _Twice(token)
            self.recovery_held.append(t)
        if backups:
            assert w is not None
            w.hold_accept(cast(AcceptToken, t))  # (only released; its flush waits for this journal too)
        elif store is not None:
            store.when_synced(t.release)
        else:
            t.release()
        return True

    def acked(self, b: RemoteBackup, queue: str, positions: PositionSet) -> None:
        result = self.guards.acked(b.name, queue, positions)
        for c in result.released:
            c.release()
        if result.acked:
            now = time.time()
            rate, picked = self.sampler.sample_batch(now, result.count)
            if picked:
                backlog = self.guards.backlog(b.name)
                hist = self.lag_histograms.get(b.name)
                if hist is None:
                    hist = self.lag_histograms[b.name] = LagHistogram()
                weight = 1.0 / rate
                for i in picked:
                    pos, enq = result.sample(i)
                    hist.observe(now - enq, weight)
                    fast.info("ha.lag", {"queue": queue, "backup": b.name, "position": pos, "enqueue_ts": enq,
                                         "ack_ts": now, "lag_ms": round((now - enq) * 1000.0, 3),
                                         "backlog": backlog, "sample_rate": rate})

    # ----- once per pass ----------------------------------------------------------------------------------------
    def committed(self, queues: list[Queue]) -> None:
        """A transaction committed in this pass touched `queues`: the replicated ones join this pass's unit."""
        if self.backups:
            for q in queues:
                if self.replicated(q) and q.name in self.watches:
                    self.txn_queues[q.name] = None

    def _mark_unit(self) -> None:
        """The transactions of this pass are one unit: every browser of a touched queue that writes version 3 sends
        its part (ha.core.batch "X"), counted per backup (the browsers it has), with all of the pass's records."""
        names, self.txn_queues = list(self.txn_queues), {}
        unit = next(self.txn_units)
        for b in self.backups.values():
            senders = []
            for name in names:
                w = self.watches.get(name)
                s = w.senders.get(b.name) if w is not None else None
                if s is not None and not s.closed and s.version >= VERSION_TXN:
                    senders.append(s)
            for s in senders:
                s.txn_part(unit, len(senders))
                self.to_run.add(s)

    def end_of_pass(self) -> bool:
        """Hand each queue's news of this pass to its browsers, release guards of dequeued messages, and let every
        browser with work send one batch. True when anything happened (the server settles what was released)."""
        did = False
        if self.changed:
            changed, self.changed = self.changed, []
            for w in changed:
                w.flush()
            did = True
        if self.txn_queues:
            self._mark_unit()
            did = True
        if self.to_run:
            senders, self.to_run = self.to_run, set()
            for s in senders:
                if not s.closed:
                    s.run()
            did = True
        return did

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
        if not m.same_list(self.node.membership):
            self.seq += 1
            m = replace(m, seq=self.seq)
            self.node.set_membership(m)
            self.broadcast_membership()
            if self.node.coordinated is not None and self.node.state == HaState.ACTIVE:
                self.node.coordinated.ready_set_changed(self.ready_names())

    def membership_message(self) -> tuple[int, bytes]:
        """The member list's number and encoded message (`$ha.status`)."""
        m = self.node.membership
        body = m.to_wire()
        body["public_url"] = self.config.ha_public_url
        body["brokers_url"] = self.config.ha_brokers_url
        body["default_level"] = self.node.default_level
        return m.seq, Message(body=body, subject="membership").encode()

    def broadcast_membership(self) -> None:
        seq, data = self.membership_message()
        for h in list(self.status_links):
            h.send(seq, data)

    def view_fence_open(self) -> bool:
        """Without a coordinator, a ready backup that lost us stays a candidate for promotion (docs/states.md), and
        Pacemaker and understudy-cluster rank candidates by the member list they hold before their position
        (ha.core.epoch.Rank). So after we dropped a ready backup nothing is settled -- no publish, no consumer's
        accept -- until every ready backup confirmed (settled on `$ha.status`) the list without it: from then on
        any of them outranks the dropped one, which lacks what we settle next."""
        if not self.view_fence:
            return True
        if self._view_behind():
            return False
        log.info("ha.view.confirmed", seq=self.view_fence, names=self.ready_names(),
                 held_seconds=round(time.time() - self.view_fence_since, 3))
        self.view_fence = 0
        return True

    def _view_behind(self) -> list[str]:
        return [n for n, b in self.backups.items() if b.state == HaState.READY and b.view_confirmed < self.view_fence]

    def view_fence_held(self) -> str | None:
        """What `view_fence_open` waits for, in words for ha-status (None when it does not hold)."""
        behind = self._view_behind()  # none while no fence is raised (view_fence 0)
        if not behind:
            return None
        verb = "has" if len(behind) == 1 else "have"
        return (f"ready {', '.join(sorted(behind))} {verb} not yet confirmed the member list without "
                f"{', '.join(self.view_fence_dropped)} (held {time.time() - self.view_fence_since:.1f} s)")

    # ----- status -----------------------------------------------------------------------------------------------
    def backup_status(self, name: str) -> dict[str, Any]:
        b = self.backups[name]
        oldest = self.guards.oldest_unacked_ts(name)
        prog = b.catchup.progress()
        return {
            "backlog": self.guards.backlog(name),
            "lag_ms": round((time.time() - oldest) * 1000.0, 1) if oldest is not None else 0.0,
            "queues": len(b.senders),
            "lag_histogram": (self.lag_histograms.get(name) or LagHistogram()).to_wire(),
            "catchup": {"total": prog.total, "sent": prog.sent, "acked": prog.acked, "fraction": prog.fraction,
                        "waiting_for": b.catchup.waiting_for()[:10]},
        }


def _cancel(timer: Any) -> None:
    if timer is not None:
        timer.cancel()


class _Twice:
    """An accept two holders release (recovery, and the backups or the journal): answered by the second."""

    __slots__ = ("left", "token")

    def __init__(self, token: AcceptToken) -> None:
        self.token, self.left = token, 2

    def release(self) -> None:
        self.left -= 1
        if self.left == 0:
            self.token.release()


def _release_all(completions: Sequence[AcceptToken]) -> None:
    for c in completions:
        c.release()


def _idle_timeout(st: ConnectionState) -> bool:
    try:
        t = st.conn.transport
        cond = t.condition if t is not None else None
    except Exception:
        cond = None
    return bool(cond is not None and "idle" in (cond.description or "").lower())
