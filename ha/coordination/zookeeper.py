"""ZooKeeper backend (kazoo): leader election with epoch fencing, membership, and a lease the leader checks.

Usage::

    coordinator = ZooKeeperCoordinator("zk1:2181,zk2:2181", "/understudy/c1", "b1", "10.0.0.1:5672",
                                       session_timeout=2.0)
    coordinator.start(Callbacks(on_elected=..., on_lost=..., dispatch=inject_into_reactor))
    coordinator.publish(MemberRecord("b1", "10.0.0.1:5672", "backup", "ready", epoch=3, position=1200))
    coordinator.contend()
    ...
    if coordinator.holds_lease(): settle(...)

How it works.  One worker thread owns all ZooKeeper I/O and state: kazoo's threads (session listener, watches)
only wake it.  Each turn it (re)creates this member's ephemeral znodes, reads the whole cluster path with watches
set, renews the leader's lease, attempts leadership when `election.should_attempt` says so, writes pending ready
sets, and reports a new `ClusterView` if anything changed.  The winner takes its epoch in the transaction that
makes it leader: ``set_data(epoch, new, version=read_version)`` + ``create(leader, ephemeral)``; if another
broker won or bumped the epoch first, the whole transaction fails.

The lease: a turn that started at monotonic time ``t0`` and found our leader znode proves the server heard from
our session after ``t0``, so the session cannot expire (and nobody else can lead) before ``t0 + session
timeout``.  `holds_lease` is True until ``t0 + LEASE_FRACTION * session timeout``; the margin covers clock-rate
differences.  SUSPENDED or LOST ends the lease at once.  The server must grant the requested session timeout
(its maxSessionTimeout must not be lower), else the lease would outlast the session.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from enum import Enum

import structlog
from kazoo.client import KazooClient
from kazoo.exceptions import KazooException, NodeExistsError, NoNodeError
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.protocol.states import KazooState, WatchedEvent
from kazoo.retry import KazooRetry

from broker.log import silent_logger
from ha.coordination import election
from ha.coordination.backoff import backoff_delays
from ha.coordination.base import (
    Callbacks,
    ClusterView,
    Coordinator,
    CoordinatorError,
    MemberRecord,
    Session,
)
from ha.coordination.znodes import Layout, Snapshot, TimedOps, leader_data, read_snapshot, ready_data

log = structlog.get_logger("ha.coordinator")  # events of the catalogue (broker/events.py)

LEASE_FRACTION = 0.8  # of the session timeout
RENEW_FRACTION = 0.25  # a turn at least this often (of the session timeout)
MIN_SESSION_TIMEOUT = 1.0
RESTART_GRACE = 1.0  # seconds kazoo's connection thread is seen dead before the client is started again
MAX_SESSION_TIMEOUT = 60.0


def validate_timing(session_timeout: float, heartbeat: float) -> list[str]:
    """Check ``--zk-session-timeout`` against ``--ha-heartbeat`` (seconds).  Returns one message per bad value.

    - The session timeout is how long a dead or cut-off primary keeps leadership: ZooKeeper grants 2 to 20 ticks
      (1 s with tickTime=500), and more than a minute leaves the cluster without a primary for that long.
    - The heartbeat must be shorter than the session timeout: backups must notice a dead primary before ZooKeeper
      elects the next one, or the new primary waits (recovering) for backups still attached to the old one.
    """
    errors = []
    if not MIN_SESSION_TIMEOUT <= session_timeout <= MAX_SESSION_TIMEOUT:
        errors.append(
            f"--zk-session-timeout must be between {MIN_SESSION_TIMEOUT:g} and {MAX_SESSION_TIMEOUT:g} seconds, "
            f"got {session_timeout:g}"
        )
    if heartbeat <= 0:
        errors.append(f"--ha-heartbeat must be positive, got {heartbeat:g}")
    elif heartbeat >= session_timeout:
        errors.append(
            f"--ha-heartbeat ({heartbeat:g} s) must be shorter than --zk-session-timeout ({session_timeout:g} s): "
            "backups must notice a dead primary before ZooKeeper elects the next one"
        )
    return errors


def new_client(hosts: str, session_timeout: float) -> KazooClient:
    """A kazoo client that reconnects forever with jittered exponential backoff."""
    retry = KazooRetry(max_tries=-1, delay=0.05, backoff=2, max_jitter=0.3, max_delay=2.0)
    return KazooClient(hosts=hosts, timeout=session_timeout, connection_retry=retry)


def build_view(layout: Layout, snap: Snapshot, *, i_am_leader: bool = False,
               session: Session = Session.CONNECTED) -> ClusterView:
    view = ClusterView(
        cluster=layout.cluster_name,
        path=layout.root,
        leader=snap.leader,
        epoch=snap.epoch,
        members=snap.members,
        candidates=snap.candidates,
        ready_set=snap.ready_set,
        ready_leader=snap.ready_leader,
        ready_epoch=snap.ready_epoch,
        i_am_leader=i_am_leader,
        session=session,
    )
    reason = election.wait_reason(view)
    return view if reason is None else replace(view, reason=reason)


def read_cluster(hosts: str, path: str, timeout: float = 5.0) -> ClusterView:
    """Read-only view of a cluster for ``ha-status --zk-hosts`` (like ``patronictl list``). kazoo's own log lines
    ("Connection dropped: ...") are not printed: a failure is one CoordinatorError saying what could not be done."""
    client = KazooClient(hosts=hosts, timeout=max(timeout, MIN_SESSION_TIMEOUT), logger=silent_logger("kazoo.ha-status"))
    try:
        client.start(timeout=timeout)
    except KazooTimeoutError as exc:
        client.close()
        raise CoordinatorError(f"cannot reach ZooKeeper at {hosts} within {timeout:g} s") from exc
    layout = Layout(path.rstrip("/"))
    try:
        return build_view(layout, read_snapshot(TimedOps(client, timeout), layout))
    except (KazooException, KazooTimeoutError) as exc:
        raise CoordinatorError(f"reading {path} from ZooKeeper failed: {exc!r}") from exc
    finally:
        client.stop()
        client.close()


class _Wake(Enum):
    WAKE = "wake"
    STOP = "stop"


@dataclass(frozen=True, slots=True)
class _StateChange:
    state: str  # a KazooState constant (kazoo's states are plain strings)


@dataclass
class _Wanted:
    """What the broker asked for (written by any thread, under the lock)."""

    record: MemberRecord | None = None
    contend: bool = False
    force: bool = False
    ready: tuple[frozenset[str], Callable[[], None] | None] | None = None


class ZooKeeperCoordinator(Coordinator):
    def __init__(self, hosts: str, path: str, name: str, address: str, session_timeout: float = 2.0,
                 client: KazooClient | None = None) -> None:
        self.layout = Layout(path.rstrip("/"))
        self.name = name
        self.address = address
        self.session_timeout = session_timeout
        self._client = client or new_client(hosts, session_timeout)
        self._ops = TimedOps(self._client, session_timeout)
        self._inbox: queue.Queue[_Wake | _StateChange] = queue.Queue()
        self._lock = threading.Lock()
        self._wanted = _Wanted()
        self._callbacks = Callbacks()
        self._thread: threading.Thread | None = None
        # Owned by the worker thread (holds_lease/view read them from other threads: single assignments).
        self._session = Session.SUSPENDED
        self._session_id: int | None = None
        self._leading = False
        self._lease_until = 0.0
        self._layout_ready = False
        self._snapshot: Snapshot | None = None
        self._view = ClusterView(cluster=self.layout.cluster_name, path=self.layout.root, leader=None, epoch=0,
                                 session=Session.SUSPENDED)
        self._last_reported: ClusterView | None = None
        self._dead_since: float | None = None  # kazoo's connection thread seen dead since (monotonic)

    # -- Coordinator ---------------------------------------------------------------------------------------

    def start(self, callbacks: Callbacks) -> None:
        self._callbacks = callbacks
        self._client.add_listener(self._on_state)
        self._client.start_async()
        self._thread = threading.Thread(target=self._run, name=f"zk-coordinator-{self.name}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._inbox.put(_Wake.STOP)
        if self._thread is not None:
            self._thread.join(timeout=self.session_timeout + 5)
        self._lease_until = 0.0

    def publish(self, record: MemberRecord) -> None:
        if record.name != self.name:
            raise CoordinatorError(f"{self.name} cannot publish a record for {record.name}")
        with self._lock:
            self._wanted.record = record
        self._wake()

    def contend(self, force: bool = False) -> None:
        with self._lock:
            self._wanted.contend = True
            self._wanted.force = self._wanted.force or force
        self._wake()

    def withdraw(self) -> None:
        with self._lock:
            self._wanted.contend = False
            self._wanted.force = False
        self._wake()

    def publish_ready_set(self, names: Iterable[str], on_published: Callable[[], None] | None = None) -> None:
        with self._lock:
            self._wanted.ready = (frozenset(names), on_published)
        self._wake()

    def view(self) -> ClusterView:
        return self._view

    def holds_lease(self) -> bool:
        return self._leading and time.monotonic() < self._lease_until

    # -- kazoo's threads: only wake the worker -------------------------------------------------------------

    def _on_state(self, state: str) -> None:
        if state != KazooState.CONNECTED:
            self._lease_until = 0.0  # fence at once, before the worker even runs
        self._inbox.put(_StateChange(state))

    def _on_watch(self, event: WatchedEvent) -> None:
        self._wake()

    def _wake(self) -> None:
        self._inbox.put(_Wake.WAKE)

    # -- the worker ----------------------------------------------------------------------------------------

    def _run(self) -> None:
        delays: Iterator[float] | None = None
        while True:
            timeout = self.session_timeout * RENEW_FRACTION if delays is None else next(delays)
            items = self._drain(timeout)
            if _Wake.STOP in items:
                self._shutdown()
                return
            for item in items:
                if isinstance(item, _StateChange):
                    self._handle_state(item.state)
            if self._session is Session.LOST and self._connection_thread_died():
                # Seen dead for RESTART_GRACE (a thread just started clears the flag in its first moments).
                now = time.monotonic()
                if self._dead_since is None:
                    self._dead_since = now
                elif now - self._dead_since >= RESTART_GRACE:
                    self._dead_since = None
                    self._restart_client()
            else:
                self._dead_since = None
            if self._session is not Session.CONNECTED or not self._client.connected:
                continue
            try:
                self._turn()
                delays = None
            except (KazooException, KazooTimeoutError, CoordinatorError) as exc:
                log.warning("ha.zookeeper.turn_failed", description=repr(exc))
                delays = delays or backoff_delays(0.05, max(0.1, self.session_timeout * RENEW_FRACTION))
            self._report_view()

    def _connection_thread_died(self) -> bool:
        """kazoo's connection thread ended although nobody stopped the client: an exception of its own (seen under
        load with kazoo 2.11: `RuntimeError: xids do not match` in `_read_response`). kazoo then reports LOST and
        never connects again by itself."""
        stopped = getattr(getattr(self._client, "_connection", None), "connection_stopped", None)
        asked = getattr(self._client, "_stopped", None)
        return bool(stopped is not None and stopped.is_set() and asked is not None and not asked.is_set())

    def _restart_client(self) -> None:
        log.warning("ha.zookeeper.client_restarted",
                    description="kazoo's connection thread ended on an error; starting it again (a new session)")
        try:
            # Not stop(): it would queue a close request that the new connection then sends, ending its session.
            self._client.start_async()
        except Exception as exc:  # retried at the next turn of the worker
            log.warning("ha.zookeeper.turn_failed", description=f"restarting the client: {exc!r}")

    def _drain(self, timeout: float) -> list[_Wake | _StateChange]:
        try:
            items = [self._inbox.get(timeout=timeout)]
        except queue.Empty:
            return []
        while True:
            try:
                items.append(self._inbox.get_nowait())
            except queue.Empty:
                return items

    def _handle_state(self, state: str) -> None:
        if state == KazooState.SUSPENDED:
            self._session = Session.SUSPENDED
            self._notify(self._callbacks.on_suspended)
        elif state == KazooState.LOST:
            self._session = Session.LOST
            self._session_id = None
            self._layout_ready = False
            self._lose_leadership("session lost")
        else:
            session_id = self._client.client_id[0] if self._client.client_id else None
            same_session = session_id is not None and session_id == self._session_id
            if self._session_id is not None and not same_session:
                self._lose_leadership("new session")
            previous = self._session
            self._session, self._session_id = Session.CONNECTED, session_id
            if previous is Session.SUSPENDED and same_session:
                self._notify(self._callbacks.on_resumed)
        self._view = self._make_view()
        self._report_view()

    def _turn(self) -> None:
        started = time.monotonic()
        with self._lock:
            wanted = _Wanted(self._wanted.record, self._wanted.contend, self._wanted.force, self._wanted.ready)
        self._ensure_layout()
        self._sync_ephemeral(self.layout.member(self.name), wanted.record.to_json() if wanted.record else None)
        self._sync_ephemeral(self.layout.candidate(self.name), b"" if wanted.contend else None)
        snap = self._read()
        if self._leading:
            if not self._owns_leader(snap):
                self._lose_leadership("leader znode gone")
            elif not wanted.contend:
                self._release()
                snap = self._read()
            else:
                self._lease_until = started + LEASE_FRACTION * self.session_timeout
        elif wanted.contend and self._should_attempt(snap, wanted.force) and self._attempt(snap, started):
            with self._lock:
                self._wanted.force = False
            snap = self._read()
        with self._lock:
            ready = self._wanted.ready
        if ready is not None:
            if self._leading:
                self._write_ready(snap, *ready)
            else:
                self._drop_ready(ready[0])  # only a leader may publish it
        self._view = self._make_view()

    def _read(self) -> Snapshot:
        self._snapshot = read_snapshot(self._ops, self.layout, watch=self._on_watch)
        return self._snapshot

    def _owns_leader(self, snap: Snapshot) -> bool:
        return snap.leader == self.name and snap.leader_owner == self._session_id

    def _should_attempt(self, snap: Snapshot, force: bool) -> bool:
        return election.should_attempt(self.name, build_view(self.layout, snap), force=force)

    def _attempt(self, snap: Snapshot, started: float) -> bool:
        epoch = election.next_epoch(snap.epoch, snap.members)
        tx = self._client.transaction()
        tx.set_data(self.layout.epoch, str(epoch).encode(), version=snap.epoch_version)
        tx.create(self.layout.leader, leader_data(self.name, self.address, epoch), ephemeral=True)
        results = self._ops.commit(tx)
        failures = [r for r in results if isinstance(r, Exception)]
        if failures:
            log.info("ha.zookeeper.election_lost", description=repr(failures))
            return False
        self._leading = True
        with self._lock:
            self._wanted.ready = None  # a ready set asked for before this election is not ours to publish
        self._lease_until = started + LEASE_FRACTION * self.session_timeout
        log.info("ha.zookeeper.elected", epoch=epoch)
        self._notify(lambda: self._callbacks.on_elected(epoch))
        return True

    def _release(self) -> None:
        with contextlib.suppress(NoNodeError):
            self._ops.delete(self.layout.leader)
        self._lose_leadership("withdrawn")

    def _lose_leadership(self, why: str) -> None:
        self._lease_until = 0.0
        if self._leading:
            self._leading = False
            log.warning("ha.zookeeper.leadership_lost", reason=why)
            self._notify(self._callbacks.on_lost)

    def _write_ready(self, snap: Snapshot, names: frozenset[str], done: Callable[[], None] | None) -> None:
        tx = self._client.transaction()
        tx.check(self.layout.leader, 0)
        tx.set_data(self.layout.ready, ready_data(snap.epoch, self.name, names))
        failures = [r for r in self._ops.commit(tx) if isinstance(r, Exception)]
        if failures:
            raise CoordinatorError(f"ready set not written: {failures!r}")
        log.info("ha.zookeeper.ready_set", epoch=snap.epoch, names=sorted(names))
        self._drop_ready(names)
        if done is not None:
            self._notify(done)
        self._snapshot = read_snapshot(self._ops, self.layout, watch=self._on_watch)

    def _drop_ready(self, names: frozenset[str]) -> None:
        with self._lock:
            if self._wanted.ready is not None and self._wanted.ready[0] == names:
                self._wanted.ready = None

    def _ensure_layout(self) -> None:
        if self._layout_ready:
            return
        for path in (self.layout.members, self.layout.candidates):
            self._ops.ensure_path(path)
        for path, initial in ((self.layout.epoch, b"0"), (self.layout.ready, b"")):
            with contextlib.suppress(NodeExistsError):
                self._ops.create(path, initial)
        self._layout_ready = True

    def _sync_ephemeral(self, path: str, data: bytes | None) -> None:
        """Make our ephemeral znode at ``path`` hold ``data`` (None: absent)."""
        stat = self._ops.exists(path)
        if data is None:
            if stat is not None and stat.ephemeralOwner == self._session_id:
                self._ops.delete(path)
            return
        if stat is not None and stat.ephemeralOwner != self._session_id:
            self._ops.delete(path)  # left by an earlier session of ours
            stat = None
        if stat is None:
            self._ops.create(path, data, ephemeral=True)
        else:
            current, _ = self._ops.get(path)
            if current != data:
                self._ops.set(path, data)

    def _make_view(self) -> ClusterView:
        if self._snapshot is None:
            return ClusterView(cluster=self.layout.cluster_name, path=self.layout.root, leader=None, epoch=0,
                               session=self._session)
        return build_view(self.layout, self._snapshot, i_am_leader=self._leading, session=self._session)

    def _report_view(self) -> None:
        view = self._view
        if view != self._last_reported:
            self._last_reported = view
            self._notify(lambda: self._callbacks.on_view(view))

    def _notify(self, fn: Callable[[], None]) -> None:
        try:
            self._callbacks.dispatch(fn)
        except Exception:
            log.error("ha.zookeeper.callback_failed", exc_info=True)

    def _shutdown(self) -> None:
        if self._session is Session.CONNECTED:
            try:
                if self._leading and self._snapshot is not None and self._owns_leader(self._snapshot):
                    self._ops.delete(self.layout.leader)
                for path in (self.layout.candidate(self.name), self.layout.member(self.name)):
                    self._sync_ephemeral(path, None)
            except (KazooException, KazooTimeoutError) as exc:
                log.warning("ha.zookeeper.resign_failed", description=repr(exc))
        self._leading = False
        self._lease_until = 0.0
        self._view = replace(self._view, i_am_leader=False, session=Session.LOST)
        self._client.remove_listener(self._on_state)
        self._client.stop()
        self._client.close()
