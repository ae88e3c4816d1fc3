"""A backup applies a replicated transaction all or none: the parts of each unit are held until all have come (pure).

The primary replicates the transactions one of its passes committed as one *unit* (ha.core.batch version 3): one
batch per queue the unit touched, each starting with an "X" record (unit id, number of parts). The parts travel on
the queues' own links of one connection, so they arrive interleaved with other batches and in any order across
queues. `TxnParts` decides, batch by batch, what may be applied now:

- a batch of a queue with nothing held back is applied at once, unless it is a part of a unit: then it is held (the
  queue's *head*) until every part of its unit has come;
- a batch of a queue that holds something back waits behind it (per queue, batches are applied in the order the
  primary sent them: a later batch may dequeue what a part enqueues);
- when the last part of a unit comes, every part of it is released together, then what waited behind each part,
  up to the next held part.

A batch with several "X" records (a browser that sent several units at once) is a part of each of them: it and the
units it joins are released only when all of them are complete. What is still held when the connection ends is
discarded (`clear`): nothing of an incomplete unit is applied, and since nothing of it was acknowledged the primary
never settled its discharge.

Per the format, a unit never has two parts on one queue; a part that would (or a unit whose parts disagree on
their number, or more parts than it said) is a broken peer: `TxnPartsError`.
"""

from __future__ import annotations

from collections import deque
from typing import Generic, TypeVar

T = TypeVar("T")


class TxnPartsError(ValueError):
    """The primary's transaction parts contradict each other."""


class _Unit:
    __slots__ = ("parts", "queues")

    def __init__(self, parts: int) -> None:
        self.parts = parts
        self.queues: list[str] = []  # the queues whose held head is a part of this unit

    @property
    def complete(self) -> bool:
        return len(self.queues) == self.parts


class TxnParts(Generic[T]):
    """One per connection to the primary. Items are whatever the caller applies (a queue's parsed batch)."""

    __slots__ = ("heads", "held", "units")

    def __init__(self) -> None:
        self.held: dict[str, deque[tuple[T, list[tuple[int, int]]]]] = {}  # queue -> head part, then what waits
        self.heads: dict[str, list[int]] = {}  # queue -> the units its head part belongs to
        self.units: dict[int, _Unit] = {}

    @property
    def holding(self) -> bool:
        """Is anything held back (a unit incomplete)?"""
        return bool(self.held)

    def arrive(self, queue: str, item: T, txns: list[tuple[int, int]]) -> list[tuple[str, T]]:
        """A batch of `queue` arrived (`txns`: its (unit, parts), [] outside a transaction). Returns the batches to
        apply now, in order (per queue, in arrival order)."""
        waiting = self.held.get(queue)
        if waiting is not None:
            waiting.append((item, txns))
            return []
        if not txns:
            return [(queue, item)]
        self.held[queue] = deque([(item, txns)])
        return self._settle([queue])

    def clear(self) -> tuple[int, int]:
        """The connection ended: forget everything held. Returns (incomplete units, batches) discarded."""
        units = len(self.units)
        batches = sum(len(q) for q in self.held.values())
        self.held.clear()
        self.heads.clear()
        self.units.clear()
        return units, batches

    # ----- inside -------------------------------------------------------------------------------------------------
    def _register(self, queue: str, txns: list[tuple[int, int]]) -> None:
        """`queue`'s head is now a part of each of `txns`."""
        ids = []
        for txn, parts in txns:
            u = self.units.get(txn)
            if u is None:
                u = self.units[txn] = _Unit(parts)
            elif u.parts != parts:
                raise TxnPartsError(f"transaction {txn}: a part says {parts} parts, another {u.parts}")
            if queue in u.queues:
                raise TxnPartsError(f"transaction {txn}: two parts on queue {queue!r}")
            u.queues.append(queue)
            if len(u.queues) > u.parts:
                raise TxnPartsError(f"transaction {txn}: more than its {u.parts} parts")
            ids.append(txn)
        self.heads[queue] = ids

    def _settle(self, fresh: list[str]) -> list[tuple[str, T]]:
        """Register the new heads of `fresh` queues and release every group of units now complete, then what
        waited behind them, repeatedly."""
        out: list[tuple[str, T]] = []
        todo = list(fresh)
        while todo:
            queue = todo.pop()
            waiting = self.held.get(queue)
            if waiting is None or queue in self.heads:
                continue
            self._register(queue, waiting[0][1])
            group = self._group(queue)
            if group is None:
                continue
            queues = list(dict.fromkeys(q for u in group for q in self.units[u].queues))
            for u in group:
                del self.units[u]
            for q in queues:
                del self.heads[q]
                w = self.held[q]
                out.append((q, w.popleft()[0]))
                while w and not w[0][1]:
                    out.append((q, w.popleft()[0]))
                if w:
                    todo.append(q)
                else:
                    del self.held[q]
        return out

    def _group(self, queue: str) -> list[int] | None:
        """The units joined to `queue`'s head (through parts that belong to several), if all are complete."""
        seen: dict[int, None] = {}
        frontier = list(self.heads[queue])
        while frontier:
            txn = frontier.pop()
            if txn in seen:
                continue
            seen[txn] = None
            u = self.units[txn]
            if not u.complete:
                return None
            for q in u.queues:
                frontier.extend(self.heads[q])
        return list(seen)
