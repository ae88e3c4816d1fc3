"""The `delivery-limit` queue argument (Artemis max-delivery-attempts, RabbitMQ delivery-limit): a message whose
delivery failed that many times is dead-lettered instead of being offered again.

A failed delivery is an outcome `modified` with `delivery-failed` (what proton's `release()` sends by default), or a
consumer that went away holding the message unsettled; both raise the message's delivery count. A plain `released`
is not a failure (the consumer did not try it) and does not count. Dead-lettering goes through the queue's
alternate exchange like a rejected message; without one (or when it routes nowhere) the message is dropped. Either
way it is logged (`queue.delivery_limit`), once per message: this is the rare path.

Counts live with the message on the primary; a backup gets a message's count with the message (live or catch-up)
but not the later failures, so after a failover a message may be tried up to `delivery-limit` more times.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from broker.log import get_logger
from broker.queue import DequeueReason, Entry, Queue

if TYPE_CHECKING:
    from broker.server import Server

log = get_logger("broker")


def dead_letter_if_over(server: Server, q: Queue, entry: Entry) -> bool:
    """A delivery of `entry` (acquired from `q`) just failed. When that is the `delivery-limit`-th failure, dequeue
    it and send it to the alternate exchange (or drop it) and return True; otherwise return False and leave the
    entry to the caller, which releases it as usual."""
    limit = q.options.delivery_limit
    if limit is None or entry.count + 1 < limit:
        return False
    data = entry.data
    q.dequeue(entry, DequeueReason.REJECTED)
    alt = q.options.alternate_exchange
    exists = alt is not None and alt in server.wiring.exchanges
    server.dead_letter(q, data)
    # count: failed deliveries (= the limit); exchange: the alternate exchange, null when the message was dropped
    log.warning("queue.delivery_limit", queue=q.name, position=entry.position, count=entry.count + 1,
                exchange=alt if exists else None)
    return True
