"""`--max-memory` with big messages: reading paged messages back for consumers, and refilling memory below the
bound, stay within the bound instead of reading back what the next check pages out again. A real Server and
journal on disk; the event loop and the memory check are turned by hand."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.paging import PageIndex
from broker.server import Server
from tests.support.store import close, commit, journaled

MiB = 1 << 20


@pytest.fixture
def make(tmp_path: Path) -> Iterator[list[Server]]:
    servers: list[Server] = []
    yield servers
    for s in servers:
        close(s)


def start(servers: list[Server], data_dir: Path, max_memory: int) -> Server:
    s = journaled(data_dir, max_memory)
    servers.append(s)
    return s


def check(s: Server) -> bool:
    """The end of a pass with the memory check due."""
    assert s.memory is not None and s.store is not None
    s.memory._next = 0.0
    return s.memory.end_of_pass()


def test_consumers_of_big_messages_are_fed_about_a_mebibyte_not_256_messages(
        make: list[Server], tmp_path: Path) -> None:
    """256 messages of 1 MiB are 32 times an 8 MiB bound: the feed counts bytes too, and what it read back is not
    paged out again at the next check (it was read and dropped every pass, holding the loop)."""
    s = start(make, tmp_path, 8 * MiB)
    store = s.store
    assert store is not None
    q, _ = s.wiring.declare_queue("big", {"durable": True})
    for i in range(60):
        q.enqueue(bytes([65 + i % 26]) * MiB, durable=True)
        commit(s)
        check(s)
    assert q.paged_count > 50
    s.consumers[q] = []  # a consumer is attached (what the feed looks at)
    while q.has_available():
        e = q.acquire_next()
        assert e is not None
        q.dequeue(e)
    before = store.paged_in, store.paged_out
    for _ in range(20):
        check(s)
    read, dropped = store.paged_in - before[0], store.paged_out - before[1]
    assert read >= 1 and read * MiB <= 4 * MiB and dropped == 0, (read, dropped)  # (the pageable half of the bound)
    assert q.has_available()
    assert s.memory is not None and s.memory.used <= 8 * MiB
    again = store.paged_in
    for _ in range(20):
        check(s)
    assert store.paged_in == again and store.paged_out == before[1]


def test_a_paged_message_bigger_than_the_room_is_not_read_back_to_be_paged_out_again(
        make: list[Server], tmp_path: Path) -> None:
    s = start(make, tmp_path, MiB)  # the queues that page may hold 512 KiB
    store = s.store
    assert store is not None
    q, _ = s.wiring.declare_queue("big", {"durable": True})
    for i in range(4):
        q.enqueue(bytes([65 + i]) * 300_000, durable=True)
    commit(s)
    for _ in range(3):
        check(s)
    before = store.paged_in, store.paged_out
    for _ in range(20):
        check(s)
    assert (store.paged_in, store.paged_out) == before
    assert q.depth == 4


def test_take_front_whole_takes_none_beyond_the_bytes_asked() -> None:
    index = PageIndex()
    for pos, size in ((1, 100), (2, 100), (3, 500)):
        index.add(pos, pos << 8, size)
    assert [p for p, _, _ in index.take_front(10, 300, whole=True)] == [1, 2]
    assert index.take_front(10, 300, whole=True) == []
    assert [p for p, _, _ in index.take_front(10, 300)] == [3]  # at least one otherwise


def test_a_browser_sees_the_paged_messages_too_in_order_and_takes_none(make: list[Server], tmp_path: Path) -> None:
    """It saw only those in memory, then nothing (a drain reported the end of the queue)."""
    s = start(make, tmp_path, MiB)
    q, _ = s.wiring.declare_queue("q", {"durable": True})
    for i in range(2000):
        q.enqueue(b"%06d" % i + b"x" * 994, durable=True)
        if i % 100 == 99:
            commit(s)
            check(s)
    assert q.paged_count > 1000, "the test needs paged messages"
    cursor, seen = 0, []
    while (e := q.browse_after(cursor)) is not None:
        cursor = e.position
        seen.append(e.data[:6])
    assert seen == [b"%06d" % i for i in range(2000)]
    assert q.depth == 2000 and q.paged_count > 1000
