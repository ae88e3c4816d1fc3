"""How `--max-memory` counts queued messages (broker.memory, pure): a message on a durable queue of a broker with a
journal costs its journal location besides the entry (measured: docs/performance.md)."""

from __future__ import annotations

from types import SimpleNamespace

from broker.memory import in_memory, queued_memory
from broker.paging import BLOCK_COST, PAGED_COST, POSITION_COST, PageIndex
from broker.store.store import ENTRY_COST, JOURNALED_ENTRY_COST


def _queue(durable: bool, n: int, body: int, paged: int = 0) -> SimpleNamespace:
    index = None
    if paged:
        index = PageIndex()
        for p in range(paged):
            index.add(n + p + 1, p, body)
    return SimpleNamespace(bytes=n * body, entries=dict.fromkeys(range(n)), paged=index,
                           options=SimpleNamespace(durable=durable))


def test_a_journaled_durable_queue_counts_each_message_location() -> None:
    durable, plain = _queue(True, 10, 100), _queue(False, 10, 100)
    assert JOURNALED_ENTRY_COST > ENTRY_COST
    assert in_memory(durable, journaled=True) == 10 * (100 + JOURNALED_ENTRY_COST)
    assert in_memory(durable, journaled=False) == 10 * (100 + ENTRY_COST)  # no journal: nothing has a location
    assert in_memory(plain, journaled=True) == 10 * (100 + ENTRY_COST)


def test_paged_messages_count_their_index_entry_only() -> None:
    q = _queue(True, 3, 100, paged=5)
    assert queued_memory([q], journaled=True) == 3 * (100 + JOURNALED_ENTRY_COST) + 5 * PAGED_COST + BLOCK_COST  # one run
    q.paged.add(100, 1, 100)  # after a gap, in a block too short for a new one: every position costs its bytes
    assert queued_memory([q], journaled=True) == 3 * (100 + JOURNALED_ENTRY_COST) + 6 * (PAGED_COST + POSITION_COST) + BLOCK_COST
