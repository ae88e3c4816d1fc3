"""External backend: Pacemaker (through the OCF agent) or an operator promotes; there is no election here.

The broker turns a management ``promote`` request into `ExternalCoordinator.promote` (the epoch comes with the
request, or is one above the highest epoch seen) and ``demote`` into `ExternalCoordinator.demote`.  The view is
local: my own record plus whatever members the broker learnt from the primary (`observe_members`).  There is no
session, so the lease is simply "I was promoted and not demoted since"; fencing is the external manager's job.

Usage::

    coordinator = ExternalCoordinator("c1", "b1")
    coordinator.start(Callbacks(on_elected=become_primary, on_lost=demote, dispatch=inject))
    coordinator.promote(epoch=None)   # on_elected(highest seen + 1)
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import replace

from ha.coordination.base import Callbacks, ClusterView, Coordinator, CoordinatorError, MemberRecord


class ExternalCoordinator(Coordinator):
    def __init__(self, cluster: str, name: str, epoch: int = 0) -> None:
        self.name = name
        self._lock = threading.Lock()
        self._callbacks = Callbacks()
        self._started = False
        self._contending = False
        self._record: MemberRecord | None = None
        self._others: tuple[MemberRecord, ...] = ()
        self._view = ClusterView(cluster=cluster, path=cluster, leader=None, epoch=epoch)
        self._last: ClusterView | None = None

    # -- what the broker's management requests call --------------------------------------------------------

    def promote(self, epoch: int | None = None) -> int:
        """Lead from now on, at ``epoch`` (default: one above the highest seen).  Returns the epoch."""
        with self._lock:
            current = self._view.epoch
            new = current + 1 if epoch is None else epoch
            if new <= current:
                raise CoordinatorError(f"promote epoch {new} is not above the highest epoch seen ({current})")
            self._set(leader=self.name, epoch=new, i_am_leader=True)
        self._notify(lambda: self._callbacks.on_elected(new))
        self._report()
        return new

    def demote(self) -> None:
        """Stop leading (``on_lost`` if this broker led)."""
        with self._lock:
            was_leader = self._view.i_am_leader
            self._set(leader=None, i_am_leader=False)
        if was_leader:
            self._notify(self._callbacks.on_lost)
        self._report()

    def observe_epoch(self, epoch: int, leader: str | None = None) -> None:
        """The broker saw ``epoch`` (e.g. from a primary); a higher one ends our own leadership."""
        with self._lock:
            if epoch <= self._view.epoch:
                return
            was_leader = self._view.i_am_leader
            self._set(leader=leader, epoch=epoch, i_am_leader=False)
        if was_leader:
            self._notify(self._callbacks.on_lost)
        self._report()

    def observe_members(self, records: Iterable[MemberRecord]) -> None:
        """Members the broker learnt of from the primary's membership (shown in the view)."""
        with self._lock:
            self._others = tuple(r for r in records if r.name != self.name)
            self._set()
        self._report()

    # -- Coordinator ---------------------------------------------------------------------------------------

    def start(self, callbacks: Callbacks) -> None:
        self._callbacks = callbacks
        self._started = True
        self._report()

    def stop(self) -> None:
        self._started = False

    def publish(self, record: MemberRecord) -> None:
        if record.name != self.name:
            raise CoordinatorError(f"{self.name} cannot publish a record for {record.name}")
        with self._lock:
            self._record = record
            self._set()
        self._report()

    def contend(self, force: bool = False) -> None:
        with self._lock:
            self._contending = True
            self._set()
        self._report()

    def withdraw(self) -> None:
        with self._lock:
            self._contending = False
        self.demote()

    def publish_ready_set(self, names: Iterable[str], on_published: Callable[[], None] | None = None) -> None:
        with self._lock:
            self._set(ready_set=frozenset(names))
        if on_published is not None:
            self._notify(on_published)
        self._report()

    def view(self) -> ClusterView:
        return self._view

    def holds_lease(self) -> bool:
        return self._started and self._view.i_am_leader

    # -- internals -----------------------------------------------------------------------------------------

    def _set(self, **changes: object) -> None:
        own = (self._record,) if self._record is not None else ()
        members = tuple(sorted((*own, *self._others), key=lambda r: r.name))
        candidates = (self.name,) if self._contending else ()
        self._view = replace(self._view, members=members, candidates=candidates, **changes)  # type: ignore[arg-type]

    def _report(self) -> None:
        view = self._view
        if self._started and view != self._last:
            self._last = view
            self._notify(lambda: self._callbacks.on_view(view))

    def _notify(self, fn: Callable[[], None]) -> None:
        if self._started:
            self._callbacks.dispatch(fn)
