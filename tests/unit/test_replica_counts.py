"""A backup's delivery counts (ha.replica.QueueReplicator._apply_state): a message a consumer of the primary holds
is kept as after a failover (count + 1, a guess never journaled); a release from the primary sets the count the
primary has. Only a count above the one journaled (a failed delivery on the primary) is handed to the queue's
observers, so the backup's store writes the record again; a plain release is not."""

from __future__ import annotations

from broker.options import QueueOptions
from broker.queue import HELD, REDELIVERED, DequeueReason, Entry, Queue
from ha.core import batch as B
from ha.replica import QueueReplicator


class Recorder:
    def __init__(self) -> None:
        self.counts: list[tuple[int, int]] = []

    def enqueued(self, queue: Queue, entry: Entry) -> None: ...
    def acquired(self, queue: Queue, entry: Entry) -> None: ...
    def released(self, queue: Queue, entry: Entry) -> None: ...
    def dequeued(self, queue: Queue, entry: Entry, reason: DequeueReason) -> None: ...
    def reinstated(self, queue: Queue, entry: Entry) -> None: ...

    def recounted(self, queue: Queue, entry: Entry) -> None:
        self.counts.append((entry.position, entry.count))


def replica() -> tuple[Queue, Entry, Recorder]:
    q = Queue("q", {}, QueueOptions(durable=True))
    seen = Recorder()
    q.observers.append(seen)
    e = q.enqueue_replica(1, b"m", 0, 0, 0, None)
    return q, e, seen


def test_a_plain_release_on_the_primary_is_not_journaled_again() -> None:
    q, e, seen = replica()
    QueueReplicator._apply_state(q, B.Acquired("A", 1, 1))
    assert (e.count, e.flags & (HELD | REDELIVERED)) == (1, HELD | REDELIVERED)  # as after a failover
    QueueReplicator._apply_state(q, B.Released("R", 1, REDELIVERED, 0))  # released, not failed: count 0
    assert (e.count, e.flags & HELD, seen.counts) == (0, 0, [])


def test_a_failed_delivery_on_the_primary_is_handed_to_the_store() -> None:
    q, e, seen = replica()
    QueueReplicator._apply_state(q, B.Acquired("A", 1, 1))
    QueueReplicator._apply_state(q, B.Released("R", 1, REDELIVERED, 1))  # the consumer failed it: count 1
    assert (e.count, seen.counts) == (1, [(1, 1)])
    QueueReplicator._apply_state(q, B.Released("R", 1, REDELIVERED, 1))  # the same again: nothing new
    assert seen.counts == [(1, 1)]
