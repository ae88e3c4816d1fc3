"""One broker's HA controller: its state, epoch and membership; it switches the broker between backup and primary.

Installed into a `broker.server.Server` as its extension (`ha-broker --ha-cluster ...`). The broker knows nothing of
it: everything goes through `broker.extension.Extension` (admission, link attach, completion holds, the settle fence,
end-of-pass work) and the management operations it registers; the node hands each call to its current role.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from typing import Any

from proton import Message

from broker.config import BrokerConfig, ConfigError, Coordinator, flag_name, load_config
from broker.connections import ConnectionState
from broker.errors import Refusal
from broker.extension import Extension
from broker.links import AcceptToken, Completion, LinkHandler
from broker.log import get_logger
from broker.management import Request, Response, install_operations
from broker.message import last_value_key_of
from broker.options import REPLICATE_KEY, REPLICATE_VALUES
from broker.queue import Entry, Queue
from broker.server import Server
from ha import protocol as P
from ha.backup import Backup
from ha.coordinated import CoordinatedRole
from ha.coordination.epoch_store import EpochStore
from ha.core import controller as C
from ha.core.controller import Controller
from ha.core.membership import Membership
from ha.core.restart import ReadyView
from ha.core.states import HaState, IllegalTransition
from ha.primary import Primary

log = get_logger("ha")

BROWSE_PAGE = 5000  # entries per BROWSE reply (a reply is one AMQP message: keep it well below proton's limits)


class HaNode(Extension):
    def __init__(self, server: Server) -> None:
        self.server = server
        self.config: BrokerConfig = server.config
        self.store: EpochStore | None = EpochStore(self.config.data_dir) if self.config.data_dir else None
        # The HA rules (pure); this object carries out what it answers (`handle`).
        self.ctl = Controller(server.id, self.store.load() if self.store else 0)
        self.membership = Membership(self.epoch, ())
        self.membership_since: float | None = None  # when the current list was adopted (ha-status: "stale since")
        self.default_level = self.config.ha_replicate.value
        self.primary: Primary | None = None
        self.backup: Backup | None = None
        self.primary_public_url: str | None = None
        self.address = ""
        self.coordinated: CoordinatedRole | None = None
        self.held_since: float | None = None  # clients' settlements held for --ha-min-ready-backups since
        self._actions: dict[type, Callable[[Any], None]] = {
            C.StartBackup: lambda a: self._become_backup(),
            C.StopBackup: lambda a: self._stop_backup(),
            C.StartPrimary: self._become_primary,
            C.StopPrimary: self._stop_primary,
            C.PersistEpoch: self._persist_epoch,
            C.RecordStanding: self._record_standing,
            C.StateChanged: self._state_changed,
            C.Log: lambda a: getattr(log, a.level)(a.event, **dict(a.fields)),
            C.Answer: lambda a: None,
        }

    # ----- what the controller knows (ha.core.controller) -------------------------------------------------------
    @property
    def state(self) -> HaState:
        return self.ctl.state

    @property
    def epoch(self) -> int:
        return self.ctl.epoch

    @property
    def ready_epoch(self) -> int:
        """The newest epoch this broker was primary or ready in (journaled; see _record_standing)."""
        return self.ctl.ready_epoch

    @property
    def ready_view(self) -> ReadyView | None:
        """The newest member list it knows from a primary (journaled)."""
        return self.ctl.view

    def handle(self, event: C.Event) -> list[C.Action]:
        """Hand `event` to the controller and carry out its actions, in order (ha.core.controller)."""
        try:
            actions = self.ctl.handle(event)
        except IllegalTransition as e:
            log.error("ha.state.illegal", **e.log_fields())
            raise
        for a in actions:
            self._actions[type(a)](a)
        return actions

    # ----- plugin -----------------------------------------------------------------------------------------------
    def install(self) -> None:
        s = self.server
        s.add_extension(self)
        m = s.management
        m.register(P.MGMT_TYPE, "STATUS", self.op_status, write=False)
        m.register(P.MGMT_TYPE, "PROMOTE", self.op_promote, write=True)
        m.register(P.MGMT_TYPE, "DEMOTE", self.op_demote, write=True)
        m.register(P.MGMT_TYPE, "REPLICATE", self.op_replicate, write=True)
        m.register(P.MGMT_TYPE, "BROWSE", self.op_browse, write=False)
        m.register(P.MGMT_TYPE, "SET", self.op_set, write=True)

    # ----- the broker's extension points (each handed to the current role) ------------------------------------
    def started(self, server: Server) -> None:
        self.start()

    def role_epoch(self) -> tuple[str, int]:
        return (self.state.role.value, self.epoch)

    def admit(self, conn: ConnectionState) -> None:
        self.policy(conn)

    def connection_closed(self, conn: ConnectionState) -> None:
        if self.primary is not None:
            self.primary.connection_closed(conn)

    def attach(self, server: Server, link: Any, conn: ConnectionState, address: str) -> LinkHandler | None:
        if self.primary is not None:
            return self.primary.attach(link, conn, address)
        return None

    def hold(self, completion: Completion, routed: list[tuple[Queue, Entry]]) -> bool:
        return self.primary is not None and self.primary.hold(completion, routed)

    def hold_group(self, queue: Queue, completions: list[Completion], entries: list[Entry]) -> bool:
        return self.primary is not None and self.primary.hold_group(queue, completions, entries)

    def hold_accept(self, token: AcceptToken, queue: Queue) -> bool:
        return self.primary is not None and self.primary.hold_accept(token, queue)

    def committed(self, queues: list[Queue]) -> None:
        if self.primary is not None:
            self.primary.committed(queues)

    def may_settle(self) -> bool:
        if self.primary is None:  # only a primary answers clients (a backup has nothing of theirs to settle)
            return False
        if self.coordinated is not None and not self.coordinated.may_settle():
            return False
        if not self.primary.view_fence_open():  # raised only without a coordinator (Primary._drop_backup)
            return False
        return self._enough_backups(self.primary)

    def dispatch_fence(self) -> Callable[[Queue], bool] | None:
        """Without its lease a ZooKeeper primary hands out nothing of its replicated queues (`may_dispatch`):
        what the next primary holds too. Replies, temporary queues and the like are its own and still go."""
        if self.coordinated is None or self.primary is None or self.coordinated.may_dispatch():
            return None
        return self.primary.replicated

    def _enough_backups(self, primary: Primary) -> bool:
        """--ha-min-ready-backups: a primary with fewer ready backups holds clients' settlements (logged once per
        hold); a timeout is the client's own (docs/replication.md)."""
        short = primary.settle_shortfall()
        if short is not None:
            if self.held_since is None:
                self.held_since = time.time()
                log.warning("ha.settle.held", ready=short[0], required=short[1])
            return False
        if self.held_since is not None:
            log.info("ha.settle.resumed", ready=len(primary.ready_names()),
                     required=self.config.ha_min_ready_backups, held_seconds=round(time.time() - self.held_since, 3))
            self.held_since = None
        return True

    def end_of_pass(self) -> bool:
        if self.primary is not None:
            return self.primary.end_of_pass()
        if self.backup is not None:
            self.backup.end_of_pass()
        return False

    def start(self) -> None:
        self.address = f"{self.config.host}:{self.server.port}"
        standing = self.recovered_standing() or {}
        self.handle(C.Started(int(standing.get("ready_epoch", 0) or 0), ReadyView.from_json(standing.get("view"))))
        if self.config.ha_coordinator == Coordinator.ZOOKEEPER:
            self.coordinated = CoordinatedRole.zookeeper(self)
            self.coordinated.start()

    # ----- state (each a controller event) ----------------------------------------------------------------------
    def set_membership(self, m: Membership) -> None:
        if m != self.membership:
            self.membership = m
            self.membership_since = time.time()
            log.info("ha.membership", epoch=m.epoch, members=m.event_members())
            view = ReadyView.of(m)
            if view is not None:
                self.handle(C.ViewSeen(view))

    def adopt_epoch(self, epoch: int) -> None:
        self.handle(C.EpochSeen(epoch))

    def _persist_epoch(self, a: C.PersistEpoch) -> None:
        if self.store is not None:
            self.store.raise_to(a.epoch)

    def _record_standing(self, a: C.RecordStanding) -> None:
        """Journal (epoch, role, state, ready_epoch, view): after a whole-cluster restart the most current store is
        the one of a broker that was primary or ready in the newest epoch (`ready_epoch`: the newest epoch in which
        this broker was a primary or a ready backup, kept across restarts until it is one again) and that the newest
        member list of that epoch names (`view`, ha.core.restart: a backup dropped by its primary is not in it)."""
        journal = self.server.store
        if journal is not None:
            view = a.view.to_json() if a.view is not None else None
            journal.record_state(a.epoch, a.state.role.value, a.state.value, a.ready_epoch, view=view)

    def _state_changed(self, a: C.StateChanged) -> None:
        if self.primary is not None:
            self.primary.update_membership()
        if self.coordinated is not None:
            self.coordinated.state_changed(a.new)

    def recovered_standing(self) -> dict[str, Any] | None:
        journal = self.server.store
        return dict(journal.recovered.state) if journal is not None and journal.recovered.state else None

    def position(self) -> int:
        """How current this broker's replicated data is: the sum of the highest positions of replicated queues."""
        total = 0
        for q in self.server.wiring.queues.values():
            if P.queue_level(q, self.default_level) == "all":
                total += q.next_position - 1
        return total

    # ----- roles (the controller's actions) ----------------------------------------------------------------------
    def _become_backup(self) -> None:
        self.server.wiring.mirroring = True  # auto-delete exchanges go when the primary says (broker.wiring)
        for q in self.server.wiring.queues.values():
            if P.queue_level(q, self.default_level) == "all":
                q.locked = True
        self.backup = Backup(self)
        self.backup.start()

    def _stop_backup(self) -> None:
        if self.backup is not None:
            self.backup.stop()
            self.backup = None

    def promote(self, forced: bool = False, epoch: int | None = None,
                newest_store: bool = False) -> tuple[bool, str]:
        """Every promotion asks this (ha-admin, Pacemaker's agent and understudy-cluster through op_promote,
        ZooKeeper's election through CoordinatedRole): the controller's `Promote` (whether it may is
        `ha.core.promotion.decide`). `newest_store`: chosen after a whole-cluster outage because this broker's
        journal holds everything confirmed in the cluster's newest epoch
        (`ha.coordination.election.restarted_with_newest_store` under ZooKeeper, `ha.core.restart.decide_restart`
        for Pacemaker and understudy-cluster)."""
        ready = tuple(m.name for m in self.membership.members if m.state == HaState.READY)
        return C.answer(self.handle(C.Promote(forced, epoch, newest_store, ready)))

    def _become_primary(self, a: C.StartPrimary) -> None:
        self.server.wiring.mirroring = False
        for q in self.server.wiring.queues.values():
            q.locked = False
            if q.options.lvq_key is not None:  # a replica never applied replacements: index its keys now
                q.rebuild_last_values(last_value_key_of)
            if q in self.server.consumers:
                self.server.wake_queue(q)
        self.primary = Primary(self, list(a.expected), a.previous_epoch)
        self.primary.install()

    def recovered(self, waited: float, timed_out: list[str]) -> None:
        self.handle(C.Recovered(waited, tuple(timed_out)))

    def demote(self, reason: str) -> None:
        self.handle(C.Demote(reason))

    def _stop_primary(self, a: C.StopPrimary) -> None:
        assert self.primary is not None
        self.primary.uninstall()
        self.primary = None
        # What it held is never answered (its clients go now): a resend must not wait for it if it is primary again
        self.server.router.unconfirmed.clear()
        # Clients go now, links first: an outcome or a transfer still on its way (a link cut and healed) must not
        # touch what is now a replica (a consumer's accept would dequeue here, and be confirmed, on a backup).
        self.server.connections.close_clients("amqp:connection:forced", f"{self.server.id} stepped down: {a.reason}")

    # ----- connection policy ------------------------------------------------------------------------------------
    def policy(self, st: ConnectionState) -> None:
        if st.kind == "admin":
            return
        if self.primary is not None:
            if st.kind == "ha":
                self.primary.backup_connecting(st)
            return
        url = self.primary_public_url
        if st.kind == "ha":
            raise Refusal(P.NOT_PRIMARY, f"{self.server.id} is a backup, not the primary", P.redirect_info(url))
        if url:
            raise Refusal("amqp:connection:redirect", f"{self.server.id} is a backup; the primary is at {url}",
                          P.redirect_info(url))
        raise Refusal("amqp:connection:forced", f"{self.server.id} is a backup and does not serve clients")

    def connection_properties(self) -> dict[str, Any]:
        props: dict[str, Any] = {
            P.PROP_ADDRESS: self.address,
            P.PROP_EPOCH: self.epoch,
            P.PROP_ROLE: self.state.role.value,
            P.PROP_REPLICATE: self.default_level,
        }
        if self.config.ha_batched_acks:
            props[P.PROP_ACKS] = P.ACKS_BATCHED
            if self.config.ha_batch_bytes > 0:
                props[P.PROP_ACKS_FORMAT] = P.BATCH_VERSION
                props[P.PROP_DEQUEUE_ACKS] = 1
            props[P.PROP_DISK_REPORTS] = 1
        if self.config.ha_public_url:
            props[P.PROP_PUBLIC_URL] = self.config.ha_public_url
        return props

    # ----- management -------------------------------------------------------------------------------------------
    MIRRORED_WRITES = frozenset({"CREATE", "UPDATE", "DELETE", "PURGE", "MOVE"})

    def management_refusal(self, req: Request) -> Response | None:
        """A backup's replicated queues, and its exchanges and bindings, follow its primary: an operator's write to
        them there would make the replica differ from the primary (silently: the primary never hears of it)."""
        if self.primary is not None or req.type not in ("queue", "exchange", "binding"):
            return None
        op = req.operation.upper() if isinstance(req.operation, str) else ""
        if op not in self.MIRRORED_WRITES:
            return None
        if req.type == "queue":
            q = self.server.wiring.queues.get(req.name) if isinstance(req.name, str) else None
            body = req.body if isinstance(req.body, dict) else {}
            level = P.queue_level(q, self.default_level) if q is not None else \
                P.described_queue_level(body, self.default_level)
            if level == "none":  # not replicated: this broker's own
                return None
        where = f" at {self.primary_public_url}" if self.primary_public_url else ""
        return Response(409, f"this broker is a backup: its {req.type}s follow its primary's; do this on the "
                             f"primary{where}")

    def attributes(self) -> dict[str, Any]:
        return {"ha-state": self.state.value, "ha-role": self.state.role.value}

    def status(self) -> dict[str, Any]:
        members = []
        for m in self.membership.members:
            row: dict[str, Any] = {"name": m.name, "address": m.address, "role": m.role.value,
                                   "state": m.state.value}
            if self.primary is not None and m.name in self.primary.backups:
                row.update(self.primary.backup_status(m.name))
            members.append(row)
        return {
            "name": self.server.id,
            "address": self.address,
            "role": self.state.role.value,
            "state": self.state.value,
            "epoch": self.epoch,
            "position": self.position(),
            "brokers_url": self.config.ha_brokers_url,
            "public_url": self.config.ha_public_url if self.primary else self.primary_public_url,
            "primary": self.backup.primary_name if self.backup and self.backup.connected else (
                self.server.id if self.primary else None),
            "default_level": self.default_level,
            "coordinator": self.config.ha_coordinator.value,  # who promotes: external (ha-admin, Pacemaker, ...) or zookeeper
            "recovered": self.recovered_standing(),
            "ready_epoch": self.ready_epoch,
            "ready_view": self.ready_view.to_json() if self.ready_view is not None else None,
            "journal_failed": self.server.store.failed if self.server.store is not None else None,
            "journal_stalled": self.server.store.stalled() if self.server.store is not None else None,
            "journal_low_disk": self.server.store.low_disk if self.server.store is not None else None,
            # (primary) backups whose journal disks are under their --min-disk-free: durable messages refused here
            "backups_low_disk": sorted(self.server.store.backups_low_disk) if self.server.store is not None else [],
            "settle_held": self._settle_held(),
            "members": members,
            "membership_since": self.membership_since,
            "configured_public_url": self.config.ha_public_url,
            "queues": sum(1 for q in self.server.wiring.queues.values()
                          if P.queue_level(q, self.default_level) == "all"),
            "time": time.time(),
        }

    def _settle_held(self) -> str | None:
        held = self.coordinated.held() if self.coordinated is not None else None
        if held is None and self.primary is not None:
            held = self.primary.view_fence_held()
        if held is not None:
            return held
        short = self.primary.settle_shortfall() if self.primary is not None else None
        if short is None:
            return None
        return f"{short[0]} of {short[1]} required backups ready (--ha-min-ready-backups)"

    def op_status(self, req: Request) -> Response:
        return Response(200, "OK", self.status())

    def op_promote(self, req: Request) -> Response:
        body = req.body if isinstance(req.body, dict) else {}
        forced = bool(body.get("force", False))
        newest_store = body.get("newest_store", False)  # chosen by decide_restart after a whole-cluster outage
        if not isinstance(newest_store, bool):
            return Response(400, "newest_store must be true or false")
        epoch = body.get("epoch")
        if epoch is not None and (not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 0):
            return Response(400, "epoch must be a non-negative integer")
        if self.coordinated is not None:
            # The coordinator owns promotion (and the epoch): ask it instead of promoting behind its back.
            if not forced:
                return Response(409, "promotion is decided by ZooKeeper here; use --force to make this broker "
                                     "contend whatever its state")
            self.coordinated.forced = True
            self.coordinated.coord.contend(force=True)
            return Response(202, "contending for leadership in ZooKeeper (forced)", self.status())
        ok, text = self.promote(forced, epoch, newest_store=newest_store)
        return Response(200 if ok else 409, text, self.status())

    def op_demote(self, req: Request) -> Response:
        if self.primary is None:
            return Response(409, f"not a primary (state {self.state.value})")
        self.server.wake_call(lambda: self.demote("operator request"))
        return Response(200, "demoting to backup")

    def op_browse(self, req: Request) -> Response:
        """Positions and bodies on a queue (a backup's replica included), oldest first, without consuming."""
        q = self.server.wiring.queues.get(req.name or "")
        if q is None:
            return Response(404, f"queue {req.name!r} not found")
        body = req.body if isinstance(req.body, dict) else {}
        limit = body.get("limit", BROWSE_PAGE)
        after = body.get("after", 0)
        if not isinstance(limit, int) or not 0 <= limit <= BROWSE_PAGE:
            return Response(400, f"limit must be an integer from 0 to {BROWSE_PAGE}")
        if not isinstance(after, int) or after < 0:
            return Response(400, "after must be a non-negative position")
        positions, bodies = [], []
        wanted = list(itertools.islice(q.positions_after(after), limit))
        found = q.read(wanted)  # paged messages read back from disk
        for pos in wanted:
            if pos not in found:
                continue
            m = Message()
            m.decode(found[pos].data)
            positions.append(pos)
            bodies.append(m.body)
        more = bool(positions) and q.next_after(positions[-1]) is not None
        return Response(200, "OK", {"positions": positions, "bodies": bodies, "depth": q.depth, "more": more})

    def op_replicate(self, req: Request) -> Response:
        """Set the replication level of an existing queue (on the primary)."""
        if self.primary is None:
            return Response(409, "replication levels are changed on the primary")
        body = req.body if isinstance(req.body, dict) else {}
        level = body.get("level", "all")
        if level not in REPLICATE_VALUES:
            return Response(400, f"level must be one of {', '.join(REPLICATE_VALUES)}, got {level!r}")
        if not req.name or req.name not in self.server.wiring.queues:
            return Response(404, f"queue {req.name!r} not found")
        q = self.server.wiring.update_queue(req.name, {REPLICATE_KEY: level})
        return Response(200, f"queue {q.name} now replicates {level}")


    def op_set(self, req: Request) -> Response:
        """Change this broker's --ha-brokers-url and/or --ha-public-url at run time (`ha-admin set`), checked by the
        same rules as the configuration. The brokers URL is used from the next connection attempt to a primary, the
        public URL from the next open frame, membership message and redirect. Not persisted across a restart."""
        body = req.body
        if not isinstance(body, dict) or not body:
            return self._refused_set(req, 400, "body must be a map with brokers_url and/or public_url")
        unknown = sorted(str(k) for k in body if k not in SETTABLE)
        if unknown:
            return self._refused_set(req, 400, f"unknown setting {unknown[0]!r} (expected {', '.join(SETTABLE)})")
        changes = {f"ha_{k}": v for k, v in body.items()}
        bad = [f"{flag_name(k)}: must be a string (got {v!r})" for k, v in changes.items() if not isinstance(v, str)]
        if bad:
            return self._refused_set(req, 400, bad[0])
        try:
            new = load_config({**self.config.model_dump(), **changes})
        except ConfigError as e:
            return self._refused_set(req, 400, "; ".join(e.lines))
        old = self.config
        self.config = self.server.config = new
        if self.backup is not None:
            self.backup.config = new
            self.backup.candidates = list(new.brokers)
            self.backup.index = 0
            self.backup.kick()  # not connected: try the new list now
        if self.primary is not None:
            self.primary.config = new
            self.primary.broadcast_membership()  # backups redirect clients to the public URL it carries
        log.warning("ha.settings.changed", brokers_url=new.ha_brokers_url, public_url=new.ha_public_url,
                    description=f"was brokers_url {old.ha_brokers_url}, public_url {old.ha_public_url}",
                    user=req.user)
        return Response(200, f"{', '.join(sorted(body))} changed (until restart)", self.status())

    def _refused_set(self, req: Request, status: int, text: str) -> Response:
        log.warning("ha.settings.refused", status=status, description=text, user=req.user)
        return Response(status, text)


SETTABLE = ("brokers_url", "public_url")


def install(server: Server) -> None:
    """The `ha-broker` plugin: HA when --ha-cluster is set, a plain broker otherwise."""
    install_operations(server)  # the broker's operator actions (queue PURGE/MOVE, connections) in either mode
    if server.config.ha_cluster:
        HaNode(server).install()
