"""Records what coordinators report, with times, so tests can wait for and assert on callbacks."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

from ha.coordination.base import Callbacks, ClusterView


@dataclass(frozen=True)
class Event:
    at: float  # time.monotonic()
    member: str
    kind: str  # elected | suspended | resumed | lost | view
    value: Any = None


class Recorder:
    def __init__(self) -> None:
        self._events: list[Event] = []
        self._lock = threading.Lock()

    def add(self, member: str, kind: str, value: Any = None) -> None:
        with self._lock:
            self._events.append(Event(time.monotonic(), member, kind, value))

    def callbacks(self, member: str) -> Callbacks:
        def on_view(view: ClusterView) -> None:
            self.add(member, "view", view)

        return Callbacks(
            on_elected=lambda epoch: self.add(member, "elected", epoch),
            on_suspended=lambda: self.add(member, "suspended"),
            on_resumed=lambda: self.add(member, "resumed"),
            on_lost=lambda: self.add(member, "lost"),
            on_view=on_view,
        )

    def events(self, member: str | None = None, kind: str | None = None) -> list[Event]:
        with self._lock:
            return [
                e for e in self._events if (member is None or e.member == member) and (kind is None or e.kind == kind)
            ]

    def values(self, member: str | None, kind: str) -> list[Any]:
        return [e.value for e in self.events(member, kind)]

    def elections(self) -> list[tuple[str, int]]:
        """(member, epoch) of every on_elected, in order."""
        return [(e.member, e.value) for e in self.events(kind="elected")]
