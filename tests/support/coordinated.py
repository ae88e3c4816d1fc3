"""A stand-in for a broker's HA node as the coordinated role sees it (ha.coordinated.NodeSide), for driving the real
`CoordinatedRole` on the in-memory coordinator without a Server. Its `promote` and `demote` are the real controller's
(ha.core.controller, as HaNode's); a test sets up its state, epoch and journaled standing directly."""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from ha.core import controller as C
from ha.core.restart import ReadyView
from ha.core.states import HaState


class Primary:
    def __init__(self) -> None:
        self.ready: list[str] = []

    def ready_names(self) -> list[str]:
        return list(self.ready)


class Node:
    """A broker's HA node as far as CoordinatedRole can tell (ha.coordinated.NodeSide)."""

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

    # the controller's facts, settable for a test's set-up
    @property
    def state(self) -> HaState:
        return self.ctl.state

    @state.setter
    def state(self, value: HaState) -> None:
        self.ctl.state = value

    @property
    def epoch(self) -> int:
        return self.ctl.epoch

    @epoch.setter
    def epoch(self, value: int) -> None:
        self.ctl.epoch = value

    @property
    def ready_epoch(self) -> int:
        return self.ctl.ready_epoch

    @ready_epoch.setter
    def ready_epoch(self, value: int) -> None:
        self.ctl.ready_epoch = value

    @property
    def view(self) -> ReadyView | None:
        return self.ctl.view

    @view.setter
    def view(self, value: ReadyView | None) -> None:
        self.ctl.view = value

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
