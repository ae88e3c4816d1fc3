"""A stand-in for a broker's HA node as the coordinated role sees it (ha.coordinated.NodeSide), for driving the real
`CoordinatedRole` on the in-memory coordinator without a Server. Its `promote` and `demote` are the real controller's
(ha.core.controller, as HaNode's); a test sets up its state, epoch and journaled standing directly."""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any, Generic, TypeVar

from ha.core import controller as C
from ha.core.restart import ReadyView
from ha.core.states import HaState

T = TypeVar("T")


class Primary:
    def __init__(self) -> None:
        self.ready: list[str] = []

    def ready_names(self) -> list[str]:
        return list(self.ready)


class _Fact(Generic[T]):
    """One of the controller's facts, read from it and settable for a test's set-up."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, node: Node, owner: type | None = None) -> T:
        return getattr(node.ctl, self.name)  # type: ignore[no-any-return]

    def __set__(self, node: Node, value: T) -> None:
        setattr(node.ctl, self.name, value)


class Node:
    """A broker's HA node as far as CoordinatedRole can tell (ha.coordinated.NodeSide)."""

    state: _Fact[HaState] = _Fact()
    epoch: _Fact[int] = _Fact()
    ready_epoch: _Fact[int] = _Fact()
    view: _Fact[ReadyView | None] = _Fact()  # its journaled member list (HaNode.ready_view)

    def __init__(self, name: str, immediate: bool = False) -> None:
        self.calls: list[Callable[[], None]] = []  # call_soon_threadsafe: run when the test says (or at once)
        dispatch: Callable[[Callable[[], None]], None] = (lambda fn: fn()) if immediate else self.calls.append
        self.server: Any = SimpleNamespace(id=name, call_soon_threadsafe=dispatch)
        self.config: Any = SimpleNamespace()
        self.address = f"h{name}:5672"
        self.ctl = C.Controller(name)
        self.primary: Primary | None = None
        self.backup: Any = SimpleNamespace(kick=lambda: None)
        self.promotions: list[tuple[bool, int | None, bool]] = []
        self.data_position = 0

    def run(self) -> None:
        while self.calls:
            self.calls.pop(0)()

    def position(self) -> int:
        return self.data_position

    def _run(self, actions: list[C.Action]) -> list[C.Action]:
        for a in actions:
            if isinstance(a, C.StartPrimary):  # nothing to wait for here: active at once
                self.primary = Primary()
                self._run(self.ctl.handle(C.Recovered(0.0)))
            elif isinstance(a, C.StopPrimary):
                self.primary = None
        return actions

    def adopt_epoch(self, epoch: int) -> None:
        self._run(self.ctl.handle(C.EpochSeen(epoch)))

    def promote(self, forced: bool = False, epoch: int | None = None,
                newest_store: bool = False) -> tuple[bool, str]:
        self.promotions.append((forced, epoch, newest_store))
        return C.answer(self._run(self.ctl.handle(C.Promote(forced, epoch, newest_store))))

    def demote(self, reason: str) -> None:
        self._run(self.ctl.handle(C.Demote(reason)))
