"""Consumer accepts answered once the dequeue is replicated: the primary's bookkeeping (pure).

A consumer that attaches with receiver-settle-mode *second* waits for the broker's settlement of its accept. On a
replicated queue the primary dequeues at once (so nobody else gets the message) but answers only when every backup
that receives the queue's dequeues acknowledged applying (and journaling) them: then a failover, or a restart of the
whole cluster from any ready store, cannot deliver the accepted message again.

Per pass and queue the accepts form one `AcceptGroup` with the positions the pass dequeued; every replicating
browser of the queue that acknowledges dequeues gets the group in its `DequeueWaits`, and so does the local journal
when there is one. The browser sends the dequeue ranges in order; the backup acknowledges the ranges it applied (batch
format acknowledgements version 2, ha.core.batch). Each acknowledgement takes its ranges out of every waiting group of
that browser; a group whose positions are all acknowledged stops waiting for that browser. A browser that goes away
stops waiting for all of its groups (its backup is no longer one that could take over with this queue).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable
from typing import Generic, TypeVar

from ha.core.idset import PositionSet

T = TypeVar("T", bound=Hashable)


class AcceptGroup(Generic[T]):
    """The accepts (tokens) of one pass on one queue; answered when nothing waits for them any more."""

    __slots__ = ("tokens", "waiting")

    def __init__(self, tokens: list[T]) -> None:
        self.tokens = tokens
        self.waiting = 0

    def wait(self) -> None:
        """One more waiter (a browser, the journal)."""
        self.waiting += 1

    def release_one(self) -> list[T]:
        """A waiter is done: the tokens to answer now (all of them, once the last waiter is done), else []."""
        if self.waiting <= 0:
            raise ValueError("released more often than waited for")
        self.waiting -= 1
        return self.tokens if self.waiting == 0 else []


class DequeueWaits(Generic[T]):
    """One per replicating browser: the groups waiting for its backup to acknowledge dequeue positions."""

    __slots__ = ("pending",)

    def __init__(self) -> None:
        self.pending: deque[tuple[PositionSet, AcceptGroup[T]]] = deque()

    def __len__(self) -> int:
        return len(self.pending)

    def add(self, positions: PositionSet, group: AcceptGroup[T]) -> list[T]:
        """`group` waits until `positions` (dequeued, to be sent on this browser) are acknowledged. Returns tokens
        to answer at once (nothing to wait for: empty positions)."""
        if not positions:
            return []
        group.wait()
        self.pending.append((positions, group))
        return []

    def acked(self, dequeued: PositionSet) -> list[T]:
        """The backup acknowledged applying `dequeued`: the tokens of every group now complete."""
        out: list[T] = []
        if not dequeued or not self.pending:
            return out
        kept: deque[tuple[PositionSet, AcceptGroup[T]]] = deque()
        for positions, group in self.pending:
            rest = positions.difference(dequeued)
            if rest:
                kept.append((rest, group))
            else:
                out.extend(group.release_one())
        self.pending = kept
        return out

    def drop(self) -> list[T]:
        """The browser is gone: it holds back nothing any more."""
        out: list[T] = []
        for _, group in self.pending:
            out.extend(group.release_one())
        self.pending.clear()
        return out
