"""A stand-in for a broker's HA node as the coordinated role sees it (ha.coordinated.NodeSide), for driving the real
`CoordinatedRole` on the in-memory coordinator without a Server. Its `promote` asks the rule HaNode.promote asks
(ha.core.promotion)."""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from ha.core import promotion
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
        self.epoch = 0
        self.ready_epoch = 0
        self.state = HaState.JOINING
        self.primary: Primary | None = None
        self.backup: Any = SimpleNamespace(kick=lambda: None)
        self.promotions: list[tuple[bool, int | None, bool]] = []
        self.data_position = 0
        self.view: ReadyView | None = None  # its journaled member list (HaNode.ready_view)

    def run(self) -> None:
        while self.calls:
            self.calls.pop(0)()

    def position(self) -> int:
        return self.data_position

    def adopt_epoch(self, epoch: int) -> None:
        self.epoch = max(self.epoch, epoch)

    def promote(self, forced: bool = False, epoch: int | None = None,
                newest_store: bool = False) -> tuple[bool, str]:
        """The real rule (ha.core.promotion, as HaNode.promote), carried out on these fields."""
        self.promotions.append((forced, epoch, newest_store))
        d = promotion.decide(promotion.Facts(self.server.id, self.state, self.epoch, self.ready_epoch, self.view),
                             promotion.Request(forced, epoch, newest_store))
        if d.already or not d.ok:
            return d.ok, d.text
        self.epoch = d.epoch
        self.ready_epoch = self.epoch
        self.view = ReadyView(self.epoch, 0, self.server.id)
        self.state = HaState.ACTIVE
        self.primary = Primary()
        return True, "promoted"

    def demote(self, reason: str) -> None:
        self.state = HaState.JOINING
        self.primary = None
