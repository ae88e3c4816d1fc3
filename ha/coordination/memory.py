"""An in-memory coordination store with controllable sessions, for fast unit tests of the election logic.

It follows the same rules as the ZooKeeper backend (candidates ranked by `election.should_attempt`, epochs from
`election.next_epoch`, records of a member vanish when its session expires, a suspended session keeps them), but
everything happens synchronously on the caller's thread.  Tests steer the sessions::

    store = MemoryStore("/understudy/c1")
    a, b = store.coordinator("a"), store.coordinator("b")
    a.start(Callbacks(on_elected=elected.append)); b.start(Callbacks())
    a.publish(MemberRecord("a", "h:1", "backup", "ready")); a.contend()
    store.suspend("a")   # a: on_suspended, holds_lease() False; still leader in the store
    store.expire("a")    # a: on_lost; b may now win
    store.reconnect("a") # a: new session, re-publishes its record and candidacy
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import replace

from ha.coordination import election
from ha.coordination.base import Callbacks, ClusterView, Coordinator, CoordinatorError, MemberRecord, Session

Notification = Callable[[], None]


class MemoryStore:
    """The shared store: leader, epoch counter, ready set and the members' sessions."""

    def __init__(self, path: str = "/understudy/test") -> None:
        self.path = path
        self.epoch = 0
        self.leader: str | None = None
        self.ready_set: frozenset[str] | None = None
        self.ready_leader: str | None = None
        self.ready_epoch = 0
        self.elections = 0
        self._coordinators: dict[str, MemoryCoordinator] = {}
        self._busy = False
        self._dirty = False

    def coordinator(self, name: str) -> MemoryCoordinator:
        if name in self._coordinators:
            raise CoordinatorError(f"duplicate member name {name!r}")
        coordinator = MemoryCoordinator(self, name)
        self._coordinators[name] = coordinator
        return coordinator

    # -- test controls -------------------------------------------------------------------------------------

    @contextmanager
    def simultaneously(self) -> Iterator[None]:
        """Make several changes before any election or view runs (e.g. brokers starting at the same moment)."""
        self._busy = True
        try:
            yield
        finally:
            self._busy = False
        self.reconcile()

    def suspend(self, name: str) -> None:
        """Drop the member's connection; its session (and leadership) stays until `expire`."""
        member = self._coordinators[name]
        if member.session is Session.CONNECTED:
            member.session = Session.SUSPENDED
            member.notify(lambda cb: cb.on_suspended())
        self.reconcile()

    def resume(self, name: str) -> None:
        """Give a suspended member its connection back with the same session."""
        member = self._coordinators[name]
        if member.session is Session.SUSPENDED:
            member.session = Session.CONNECTED
            member.notify(lambda cb: cb.on_resumed())
        self.reconcile()

    def expire(self, name: str) -> None:
        """Expire the member's session: its records vanish and it loses leadership."""
        member = self._coordinators[name]
        member.session = Session.LOST
        if self.leader == name:
            self.leader = None
        if member.leading:
            member.leading = False
            member.notify(lambda cb: cb.on_lost())
        self.reconcile()

    def reconnect(self, name: str) -> None:
        """A new session for an expired member: its record and candidacy are registered again."""
        member = self._coordinators[name]
        if member.session is Session.LOST:
            member.session = Session.CONNECTED
        self.reconcile()

    # -- the store's rules ---------------------------------------------------------------------------------

    def alive(self) -> list[MemoryCoordinator]:
        return [c for c in self._coordinators.values() if c.started and c.session is not Session.LOST]

    def snapshot(self, me: MemoryCoordinator) -> ClusterView:
        alive = self.alive()
        members = tuple(sorted((c.record for c in alive if c.record is not None), key=lambda r: r.name))
        candidates = tuple(sorted(c.name for c in alive if c.contending))
        view = ClusterView(
            cluster=self.path.rsplit("/", 1)[-1],
            path=self.path,
            leader=self.leader,
            epoch=self.epoch,
            members=members,
            candidates=candidates,
            ready_set=self.ready_set,
            ready_leader=self.ready_leader,
            ready_epoch=self.ready_epoch,
            i_am_leader=self.leader == me.name and me.session is not Session.LOST,
            session=me.session,
        )
        return _with_reason(view)

    def reconcile(self) -> None:
        """Run elections and deliver views until nothing changes (re-entrant calls just ask for another pass)."""
        if self._busy:
            self._dirty = True
            return
        self._busy = True
        try:
            self._dirty = True
            while self._dirty:
                self._dirty = False
                self._elect()
                for member in list(self._coordinators.values()):
                    member.deliver()
        finally:
            self._busy = False

    def _elect(self) -> None:
        if self.leader is not None:
            return
        for member in self.alive():
            if member.session is not Session.CONNECTED or not member.contending:
                continue
            view = self.snapshot(member)
            if election.should_attempt(member.name, view, force=member.force):
                self.epoch = election.next_epoch(self.epoch, view.members)
                self.leader = member.name
                self.elections += 1
                member.leading = True
                member.force = False
                member.notify(_elected(self.epoch))
                return


def _elected(epoch: int) -> Callable[[Callbacks], None]:
    return lambda cb: cb.on_elected(epoch)


def _with_reason(view: ClusterView) -> ClusterView:
    return replace(view, reason=election.wait_reason(view))


class MemoryCoordinator(Coordinator):
    """One broker's coordinator on a `MemoryStore`."""

    def __init__(self, store: MemoryStore, name: str) -> None:
        self.store = store
        self.name = name
        self.session = Session.CONNECTED
        self.started = False
        self.contending = False
        self.force = False
        self.leading = False
        self.record: MemberRecord | None = None
        self._callbacks = Callbacks()
        self._pending: list[Notification] = []
        self._last_view: ClusterView | None = None

    def notify(self, event: Callable[[Callbacks], None]) -> None:
        callbacks = self._callbacks
        self._pending.append(lambda: event(callbacks))

    def deliver(self) -> None:
        """Hand queued notifications, then the view if it changed, to the dispatcher."""
        if not self.started:
            return
        view = self.view()
        if view != self._last_view:
            self._last_view = view
            callbacks = self._callbacks
            self._pending.append(lambda: callbacks.on_view(view))
        pending, self._pending = self._pending, []
        for fn in pending:
            self._callbacks.dispatch(fn)

    # -- Coordinator ---------------------------------------------------------------------------------------

    def start(self, callbacks: Callbacks) -> None:
        self._callbacks = callbacks
        self.started = True
        self.store.reconcile()

    def stop(self) -> None:
        if self.store.leader == self.name:
            self.store.leader = None
        self.leading = False
        self.started = False
        self._pending.clear()
        self.store.reconcile()

    def publish(self, record: MemberRecord) -> None:
        if record.name != self.name:
            raise CoordinatorError(f"{self.name} cannot publish a record for {record.name}")
        self.record = record
        self.store.reconcile()

    def contend(self, force: bool = False) -> None:
        self.contending = True
        self.force = self.force or force
        self.store.reconcile()

    def withdraw(self) -> None:
        self.contending = False
        self.force = False
        if self.leading:
            self.leading = False
            if self.store.leader == self.name:
                self.store.leader = None
            self.notify(lambda cb: cb.on_lost())
        self.store.reconcile()

    def publish_ready_set(self, names: Iterable[str], on_published: Callable[[], None] | None = None) -> None:
        if not self.holds_lease():
            raise CoordinatorError(f"{self.name} does not lead; it cannot publish the ready set")
        self.store.ready_set = frozenset(names)
        self.store.ready_leader = self.name
        self.store.ready_epoch = self.store.epoch
        if on_published is not None:
            self._pending.append(on_published)
        self.store.reconcile()

    def view(self) -> ClusterView:
        return self.store.snapshot(self)

    def holds_lease(self) -> bool:
        return self.leading and self.store.leader == self.name and self.session is Session.CONNECTED
