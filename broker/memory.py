"""`--max-memory`: how much memory queued messages may take, and what happens beyond it (flow to disk).

Queued memory is counted as every message's body plus `ENTRY_COST` bytes for each message in memory
(`JOURNALED_ENTRY_COST` on a durable queue of a broker with a journal: its messages' journal locations are objects of
their own), plus what the index of paged ones takes (`PageIndex.memory`: 12 bytes each, 20 outside a run of
positions). The process needs its own baseline besides: see docs/durability.md.

- Over the bound, the highest messages of the biggest durable queues are *paged out*: their journal records stay,
  memory keeps 12-20 bytes each (`Queue.paged`), down to `LOW_WATER` of the bound. Paged messages are read back in
  order when memory is below `LOW_WATER` again, and whenever consumers of a queue run short (`FEED_BELOW`), so a
  consumer is never starved by the bound.
- The messages in memory of queues that can page take at most `PAGEABLE_SHARE` of the bound (paged out beyond it,
  down to `LOW_WATER` of that share): the memory paging frees is not the process's to give back at once (the
  allocator keeps an arena while anything in it lives), and the index of paged messages grows into the rest. Without
  the share a broker filled far past its bound peaked at bound + baseline + 65 MiB (docs/performance.md).
- What cannot be paged (non-durable messages, non-durable queues, priority, last-value and limited queues, or any
  queue without a journal) is refused while memory stays over the bound after paging:
  `amqp:resource-limit-exceeded` to the publisher (`Router`), logged once per episode as `memory.over`.
- Messages sent under a transaction are held in memory until its commit (broker.transactions): they count, and
  while memory is over the bound a transactional transfer is refused the same way, durable or not.

The check runs at the end of a pass, at most every `CHECK_INTERVAL` seconds (a pass is microseconds; the sum over
queues is not free), so the bound can be overshot by what arrives in that time.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from broker.extension import Extension
from broker.log import get_logger
from broker.paging import LOW_WATER, PAGEABLE_SHARE
from broker.store.store import ENTRY_COST, JOURNALED_ENTRY_COST

if TYPE_CHECKING:
    from broker.queue import Queue
    from broker.server import Server

log = get_logger("broker.memory")

CHECK_INTERVAL = 0.005  # seconds between sums of queued memory
FEED_BELOW = 256  # a queue with consumers and fewer available messages in memory reads paged ones back
FEED_BYTES = 1024 * 1024  # bytes read back at once for a queue's consumers


def in_memory(q: Queue, journaled: bool) -> int:
    """Bytes the messages of `q` held in memory take; `journaled`: the broker has a journal (see the module's note)."""
    return q.bytes + len(q.entries) * (JOURNALED_ENTRY_COST if journaled and q.options.durable else ENTRY_COST)


def pageable_memory(queues: Any) -> int:
    """Bytes the messages in memory of journaled queues that can page take (`queues`: the store's)."""
    return sum(in_memory(q, True) for q in queues if q.pageable)


def queued_memory(queues: Any, journaled: bool) -> int:
    """Bytes of memory the messages of `queues` take, paged ones included."""
    total = 0
    for q in queues:
        total += in_memory(q, journaled)
        if q.paged is not None:
            total += q.paged.memory
    return total


class MemoryBound(Extension):
    def __init__(self, server: Server, limit: int) -> None:
        self.server = server
        self.limit = limit
        self.low = int(limit * LOW_WATER)
        self.share = int(limit * PAGEABLE_SHARE)
        self.share_low = int(self.share * LOW_WATER)
        self.used = 0
        self.over = False
        self.refused = 0
        self._next = 0.0

    def end_of_pass(self) -> bool:
        store = self.server.store
        did = False
        if store is not None and store.paging:
            for q in list(store.paging):
                if q.paged is not None and q in self.server.consumers and q._available < FEED_BELOW:
                    # Bytes too: a few big messages are enough to go on (those held by consumers do not count).
                    room = FEED_BYTES - in_memory(q, True) * q._available // max(len(q.entries), 1)
                    if room > 0:
                        fed = store.page_in(q, room)
                        if fed:
                            q.fed = q.top_in_memory()  # not paged out again while its consumers are there
                            did = True
        now = time.monotonic()
        if now < self._next:
            return did
        self._next = now + CHECK_INTERVAL
        used = queued_memory(self.server.wiring.queues.values(), store is not None) + self.server.transactions.held
        if store is not None:
            pageable = pageable_memory(store.queues)
            if used > self.limit or pageable > self.share:
                used -= self._page_out(store, max(used - self.low, pageable - self.share_low))
            elif used < self.low and pageable < self.share_low and store.paging:
                used += self._page_in(store, min(self.low - used, self.share_low - pageable))
                did = True
        self.used = used
        over = used > self.limit
        if over != self.over:
            self.over = over
            self.server.refresh_refusing()
            if over:
                log.warning("memory.over", used=used, limit=self.limit,
                            description="queued messages over --max-memory: what cannot be paged to disk is "
                                        "refused (amqp:resource-limit-exceeded)")
            else:
                log.info("memory.under", used=used, limit=self.limit, refused=self.refused)
                self.refused = 0
        return did

    def _page_out(self, store: Any, want: int) -> int:
        """Free about `want` bytes, from the queues holding the most in memory."""
        freed = 0
        queues: list[Queue] = [q for q in store.queues if q.pageable and q.entries]
        queues.sort(key=lambda q: in_memory(q, True), reverse=True)
        consumers = self.server.consumers
        for q in queues:
            if freed >= want:
                break
            freed += store.page_out(q, want - freed, q.fed if q in consumers else 0)
        return freed

    def _page_in(self, store: Any, room: int) -> int:
        """Read paged messages back, about `room` bytes, shared between the paged queues."""
        taken = 0
        paging = list(store.paging)
        for i, q in enumerate(paging):
            share = (room - taken) // (len(paging) - i)
            if share > 0:  # only what fits (a message bigger than the room would be paged out at the next check)
                taken += store.page_in(q, share, whole=True)
        return taken

    def attributes(self) -> dict[str, Any]:
        return {"memory": {"limit": self.limit, "used": self.used, "over": self.over}}
