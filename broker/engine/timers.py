"""Timers and calls handed in from other threads: the parts of the event loop that are not I/O (pure, testable)."""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Callable


class Timer:
    """A scheduled call; `cancel()` before it is due and it never runs."""

    __slots__ = ("cancelled", "due", "fn")

    def __init__(self, due: float, fn: Callable[[], None]) -> None:
        self.due = due
        self.fn = fn
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class Timers:
    """A heap of timers on a monotonic clock (seconds). `due(now)` pops the ones whose time has come, in order."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Timer]] = []
        self._seq = itertools.count()

    def add(self, due: float, fn: Callable[[], None]) -> Timer:
        t = Timer(due, fn)
        heapq.heappush(self._heap, (due, next(self._seq), t))
        return t

    def next_due(self) -> float | None:
        heap = self._heap
        while heap and heap[0][2].cancelled:
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    def due(self, now: float) -> list[Timer]:
        out: list[Timer] = []
        heap = self._heap
        while heap and heap[0][0] <= now:
            t = heapq.heappop(heap)[2]
            if not t.cancelled:
                out.append(t)
        return out

    def __len__(self) -> int:
        return sum(1 for _, _, t in self._heap if not t.cancelled)


class Calls:
    """Callables queued from any thread (or a signal handler) for the loop thread; `wake` is called after each
    push so a sleeping loop notices (an eventfd write). No lock: deque append and popleft are atomic, and a lock
    could deadlock with a signal handler that runs on the loop thread while it holds the lock."""

    def __init__(self, wake: Callable[[], None]) -> None:
        self._items: deque[Callable[[], None]] = deque()
        self._wake = wake

    def push(self, fn: Callable[[], None]) -> None:
        self._items.append(fn)
        self._wake()

    def take(self) -> list[Callable[[], None]]:
        items = self._items
        out: list[Callable[[], None]] = []
        while items:
            out.append(items.popleft())
        return out

    def __bool__(self) -> bool:
        return bool(self._items)
