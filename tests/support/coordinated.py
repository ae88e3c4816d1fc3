"""A stand-in for a broker's HA node as the coordinated role sees it (ha.coordinated.NodeSide), for driving the real
`CoordinatedRole` on the in-memory coordinator without a Server. Its `promote` follows HaNode.promote's rule: a
ready backup, a forced promotion, a brand-new broker, or a joining one elected with the newest store."""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

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

    def run(self) -> None:
        while self.calls:
            self.calls.pop(0)()

    def position(self) -> int:
        return self.data_position

    def adopt_epoch(self, epoch: int) -> None:
        self.epoch = max(self.epoch, epoch)

    def promote(self, forced: bool = False, epoch: int | None = None,
                newest_store: bool = False) -> tuple[bool, str]:
        self.promotions.append((forced, epoch, newest_store))
        brand_new = self.epoch == 0 and self.state == HaState.JOINING
        if not (self.state == HaState.READY or forced or brand_new
                or (newest_store and self.state == HaState.JOINING)):
            return False, f"refusing to promote a backup in state {self.state.value}"
        self.epoch = max(self.epoch + 1, epoch or 0)
        self.ready_epoch = self.epoch
        self.state = HaState.ACTIVE
        self.primary = Primary()
        return True, "promoted"

    def demote(self, reason: str) -> None:
        self.state = HaState.JOINING
        self.primary = None
