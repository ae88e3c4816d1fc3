"""Drive a broker's HA role from a `Coordinator` (ZooKeeper): contend when ready, promote when elected, demote
when leadership is lost, and never settle or deliver a client message without a valid lease.

Coordinator callbacks arrive on the backend's thread; they are handed to the reactor with
`server.call_soon_threadsafe`, so every decision below runs on the reactor thread. One decision per view, logged
once when it changes (`ha.coordinator.decision`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from broker.log import get_logger
from ha.coordination.base import Callbacks, ClusterView, Coordinator, MemberRecord
from ha.coordination.election import Action, Decision, decide, restarted_with_newest_store
from ha.core.states import HaState

if TYPE_CHECKING:
    from broker.config import BrokerConfig
    from broker.server import Server

log = get_logger("ha.coordinator")


class _Kickable(Protocol):
    def kick(self) -> None: ...


class _Counting(Protocol):
    def ready_names(self) -> list[str]: ...


class NodeSide(Protocol):
    """What the coordinated role uses of its broker's HA node (ha.node.HaNode), so that this module does not import
    it (no import circle under ha/)."""

    server: Server
    config: BrokerConfig
    address: str

    @property
    def epoch(self) -> int: ...

    @property
    def ready_epoch(self) -> int: ...

    @property
    def state(self) -> HaState: ...

    @property
    def primary(self) -> _Counting | None: ...

    @property
    def backup(self) -> _Kickable | None: ...

    def position(self) -> int: ...

    def adopt_epoch(self, epoch: int) -> None: ...

    def promote(self, forced: bool = False, epoch: int | None = None,
                newest_store: bool = False) -> tuple[bool, str]: ...

    def demote(self, reason: str) -> None: ...


class CoordinatedRole:
    def __init__(self, node: NodeSide, coordinator: Coordinator) -> None:
        self.node = node
        self.coord = coordinator
        self.forced = False
        self.last: Decision | None = None
        self.published_epoch = 0  # the newest epoch of ours whose ready set the coordinator holds
        self.published_names: frozenset[str] = frozenset()  # that ready set (the last one written)
        self._requested_names: frozenset[str] = frozenset()  # the last ready set asked for
        self._requests = 0  # ready-set publications asked for
        self._waiting: list[tuple[int, Callable[[], None]]] = []  # (request, what runs once it, or a later one, is out)

    @classmethod
    def zookeeper(cls, node: NodeSide) -> CoordinatedRole:
        from ha.coordination.zookeeper import ZooKeeperCoordinator  # kazoo: only under ZooKeeper (start time)

        cfg = node.config
        assert cfg.zk_hosts is not None
        coord = ZooKeeperCoordinator(cfg.zk_hosts, cfg.zk_path, node.server.id, node.address,
                                     session_timeout=cfg.zk_session_timeout)
        return cls(node, coord)

    # ----- lifecycle --------------------------------------------------------------------------------------------
    def start(self) -> None:
        s = self.node.server
        self.coord.start(Callbacks(
            on_elected=self.on_elected,
            on_suspended=lambda: log.warning("ha.coordinator.suspended", epoch=self.node.epoch),
            on_resumed=lambda: log.info("ha.coordinator.resumed", epoch=self.node.epoch),
            on_lost=self.on_lost,
            on_view=self.on_view,
            dispatch=s.call_soon_threadsafe,
        ))
        self.publish()

    def stop(self) -> None:
        self.coord.stop()

    def record(self) -> MemberRecord:
        n = self.node
        return MemberRecord(n.server.id, n.address, n.state.role.value, n.state.value, n.epoch, n.position(),
                            ready_epoch=n.ready_epoch)

    def publish(self) -> None:
        self.coord.publish(self.record())

    # ----- the fence --------------------------------------------------------------------------------------------
    def may_settle(self) -> bool:
        """A primary settles client messages only while it holds the lease (checked on every settle batch), and
        only once the coordinator holds a ready set of its epoch: until then the last one names the brokers of an
        older epoch, which would be promoted after an outage though they lack what we confirmed
        (`election.restarted_with_newest_store`). Nor while the ready set the coordinator holds names a backup we
        no longer count as ready: it can still be elected, and it lacks what we would settle without it (a
        publish it never acknowledged, a consumer's accept whose dequeue it never applied). A set without it is
        asked for here if nothing asked yet (`Primary._drop_backup` asks when it drops one)."""
        hold = self._hold()
        if hold is None:
            return True
        if hold[0] == "stale" and self._requested_names != hold[1]:
            self.ready_set_changed(sorted(hold[1]))
        return False

    def held(self) -> str | None:
        """Why `may_settle` holds a primary's settlements now, for `ha-status` (None: it does not)."""
        hold = self._hold()
        if hold is None:
            return None
        what, ready = hold
        if what == "lease":
            return ("no ZooKeeper lease (connection to ZooKeeper lost or too slow): nothing is settled or delivered "
                    "until it is back, or the session expires and another broker takes over")
        if what == "epoch":
            return f"ZooKeeper does not hold the ready set of epoch {self.node.epoch} yet"
        return f"ZooKeeper's ready set still names {', '.join(sorted(self.published_names - ready))}, no longer ready"

    def _hold(self) -> tuple[str, frozenset[str]] | None:
        """What holds a primary's settlements (`may_settle`): "lease", "epoch" (our epoch's ready set not yet
        written), or "stale" with the backups ready now (the written set names one that is not); None: nothing."""
        n = self.node
        if n.primary is None:
            return None
        if not self.coord.holds_lease():
            return "lease", frozenset()
        if self.published_epoch < n.epoch:
            return "epoch", frozenset()
        if self.published_names:
            ready = frozenset(n.primary.ready_names())
            if not self.published_names <= ready:
                return "stale", ready
        return None

    def may_dispatch(self) -> bool:
        """A primary hands messages to its consumers only while it holds the lease. One that woke from SIGSTOP or
        came back from a network cut past its session would otherwise deliver what the new primary delivers
        again: it can confirm none of the consumers' accepts (the fence above), so each such delivery is a
        redelivery later. While the lease lapses and comes back (a ZooKeeper blip within the session) consumers
        wait, as publishers do."""
        return self.node.primary is None or self.coord.holds_lease()

    # ----- callbacks (reactor thread) ---------------------------------------------------------------------------
    def on_view(self, view: ClusterView) -> None:
        if view.epoch > self.node.epoch and self.node.primary is None:
            self.node.adopt_epoch(view.epoch)
        if view.leader is not None and view.leader != self.node.server.id and self.node.backup is not None:
            self.node.backup.kick()
        d = decide(self.record(), view, forced=self.forced)
        if d != self.last:
            log.info("ha.coordinator.decision", action=d.action.value, reason=d.reason.value, epoch=d.epoch,
                     leader=view.leader, waiting=view.reason.value if view.reason else None)
            self.last = d
        if d.action == Action.CONTEND:
            self.coord.contend(force=self.forced)
        elif d.action == Action.WITHDRAW:
            self.coord.withdraw()
        elif d.action == Action.PROMOTE:
            self._promote(view.epoch)
        elif d.action == Action.DEMOTE:
            self.node.demote(f"coordinator: {d.reason.value}")
            self.publish()

    def on_elected(self, epoch: int) -> None:
        self._promote(epoch)

    def on_lost(self) -> None:
        if self.node.primary is not None:
            self.node.demote("coordinator: leadership lost")
            self.publish()

    def _promote(self, epoch: int) -> None:
        if self.node.primary is not None:
            return
        # From the rule, not from the last decision: that may be a withdrawal the election overtook (a deposed
        # primary elected again before it saw its own demotion), and refusing leaves the cluster without a primary.
        newest_store = restarted_with_newest_store(self.record(), self.coord.view())
        ok, text = self.node.promote(forced=self.forced, epoch=epoch, newest_store=newest_store)
        if not ok:
            log.error("ha.coordinator.promote_refused", epoch=epoch, description=text)
            self.coord.withdraw()
        elif self.node.primary is not None:  # settlements wait until the coordinator holds our epoch's ready set
            self.ready_set_changed(self.node.primary.ready_names())
        self.forced = False
        self.publish()

    def state_changed(self, state: HaState) -> None:
        self.publish()

    def ready_set_changed(self, names: list[str], on_published: Callable[[], None] | None = None) -> None:
        """Publish the ready set. A request replaces one the coordinator has not carried out yet, so what waited
        for the replaced one (e.g. settlements a dropped backup no longer guards) runs when a later one is
        published: that set is the newer truth. Each request runs only what was asked up to it."""
        epoch = self.node.epoch
        self._requests += 1
        seq = self._requests
        written = frozenset(names)
        self._requested_names = written
        if on_published is not None:
            self._waiting.append((seq, on_published))

        def published() -> None:
            self.published_epoch = max(self.published_epoch, epoch)
            self.published_names = written
            due = [fn for s, fn in self._waiting if s <= seq]
            self._waiting = [(s, fn) for s, fn in self._waiting if s > seq]
            for fn in due:
                fn()

        self.coord.publish_ready_set(names, published)
