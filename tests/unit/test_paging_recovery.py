"""A restart of a broker with `--max-memory` whose journal holds more than the bound: what recovery pages, and what
the queues do with it afterwards. A real Server and journal on disk; the event loop is turned by hand."""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from proton import Message

from broker.config import BrokerConfig
from broker.errors import QueueFull
from broker.message import last_value_key_of
from broker.queue import DURABLE, HELD, DequeueReason, Queue
from broker.server import Server
from broker.store.records import JournalError
from ha.core import batch as B
from ha.replica import QueueReplicator
from tests.support.store import close, commit, journaled

BOUND = 100_000  # --max-memory: recovery reads ~32 KB of bodies, the rest is only indexed


def start(data_dir: Path, max_memory: int = BOUND) -> Server:
    return journaled(data_dir, max_memory)


RUNNING: list[Server] = []


def stop(s: Server) -> None:
    RUNNING.remove(s)
    close(s)


@pytest.fixture
def restart(tmp_path: Path) -> Iterator[list[Server]]:
    """Servers started on tmp_path, stopped at the end if the test did not (a test appends each one it starts)."""
    yield RUNNING
    for s in list(RUNNING):
        stop(s)


def body(i: int, pad: int = 1000) -> bytes:
    return f"{i:05d}".encode() + b"x" * pad


def two_hundred_orders(data_dir: Path, restart: list[Server]) -> tuple[Server, Queue]:
    """A broker on `data_dir` whose durable queue `orders` holds body(0)..body(199), on disk."""
    s = start(data_dir)
    restart.append(s)
    q, _ = s.wiring.declare_queue("orders", {"durable": True})
    for i in range(200):
        q.enqueue(body(i), durable=True)
    commit(s)
    return s, q


def drain(s: Server, q: Queue) -> list[bytes]:
    """Every message of `q` in delivery order, read back from the journal as a consumer would have them."""
    assert s.store is not None
    got: list[bytes] = []
    while True:
        if q.paged is not None and not q.has_available():
            s.store.page_in(q, 1 << 30)
        e = q.acquire_next()
        if e is None:
            return got
        got.append(e.data[:5])
        q.dequeue(e, DequeueReason.ACCEPTED)


def test_a_message_taken_after_a_restart_gets_a_position_above_the_paged_ones_and_both_are_kept(
        tmp_path: Path, restart: list[Server]) -> None:
    """Recovery keeps the oldest messages in memory and indexes the rest: the next message must not take the
    position of a paged one (it collided with it: the store's pass raised, and at the next restart the new
    record replaced the old message)."""
    s, q = two_hundred_orders(tmp_path, restart)
    stop(s)

    s = start(tmp_path)
    restart.append(s)
    q = s.wiring.queues["orders"]
    assert q.paged is not None and q.paged_count > 100, "the test needs a restart that pages"
    q.enqueue(b"after" + b"x" * 1000, durable=True)
    commit(s)
    stop(s)

    s = start(tmp_path)
    restart.append(s)
    q = s.wiring.queues["orders"]
    assert drain(s, q) == [body(i)[:5] for i in range(200)] + [b"after"]


def test_queues_that_cannot_page_are_recovered_whole_in_memory(tmp_path: Path, restart: list[Server]) -> None:
    """Priority, max-count and last-value queues never page (their order, limits and replacements need every
    message in memory): recovery reads them whole, whatever the bound."""
    s = start(tmp_path)
    restart.append(s)
    prio, _ = s.wiring.declare_queue("prio", {"durable": True, "priority-levels": 10})
    limited, _ = s.wiring.declare_queue("limited", {"durable": True, "max-count": 100})
    for _ in range(100):
        prio.enqueue(b"low  " + b"x" * 1000, priority=0, durable=True)
    prio.enqueue(b"HIGH " + b"x" * 1000, priority=9, durable=True)
    for i in range(100):
        limited.enqueue(body(i), durable=True)
    commit(s)
    stop(s)

    s = start(tmp_path)
    restart.append(s)
    prio, limited = s.wiring.queues["prio"], s.wiring.queues["limited"]
    assert prio.paged_count == limited.paged_count == 0
    e = prio.acquire_next()
    assert e is not None and e.data[:5] == b"HIGH "
    assert limited.depth == 100
    with pytest.raises(QueueFull):
        limited.enqueue(b"one too many", durable=True)


def test_a_queue_given_a_limit_while_paged_counts_its_paged_messages_and_is_recovered_whole(
        tmp_path: Path, restart: list[Server]) -> None:
    """max-count set on a queue whose messages are paged: the limit counts them, and a restart reads them back (the
    queue can no longer page)."""
    s, q = two_hundred_orders(tmp_path, restart)
    assert s.memory is not None
    s.memory._next = 0.0
    s.memory.end_of_pass()  # its check: pages the queue out beyond the bound
    assert q.paged_count > 0, "the test needs paged messages"
    s.wiring.update_queue("orders", {"max-count": 200})
    with pytest.raises(QueueFull):
        q.enqueue(b"one too many", durable=True)
    commit(s)
    stop(s)

    s = start(tmp_path)
    restart.append(s)
    q = s.wiring.queues["orders"]
    assert q.paged_count == 0 and len(q.entries) == 200
    assert drain(s, q) == [body(i)[:5] for i in range(200)]


def test_a_last_value_queue_replaces_what_a_restart_recovered(tmp_path: Path, restart: list[Server]) -> None:
    def value(k: str, v: str) -> bytes:
        return bytes(Message(body=v, durable=True, properties={"k": k}).encode())

    s = start(tmp_path)
    restart.append(s)
    q, _ = s.wiring.declare_queue("prices", {"durable": True, "lvq-key": "k"})
    for k in ("a", "b"):
        d = value(k, "old")
        q.enqueue(d, durable=True, key=last_value_key_of(d, "k"))
    commit(s)
    stop(s)

    s = start(tmp_path)
    restart.append(s)
    q = s.wiring.queues["prices"]
    d = value("a", "new")
    q.enqueue(d, durable=True, key=last_value_key_of(d, "k"))
    assert q.depth == 2  # a: new, b: old


class Dequeues:
    """A queue observer that notes the positions dequeued (what replication hears)."""

    def __init__(self, into: list[int]) -> None:
        self.into = into

    def dequeued(self, _q: Queue, e: Any, _reason: DequeueReason) -> None:
        self.into.append(e.position)

    def __getattr__(self, _name: str) -> Any:
        return lambda *_: None


def test_paged_messages_whose_segment_cannot_be_read_stay_on_their_queue_and_are_read_again(
        tmp_path: Path, restart: list[Server], monkeypatch: pytest.MonkeyPatch) -> None:
    """An I/O error reading paged messages back (a transient EIO): they stay paged, in order, and nothing is told of
    a dequeue (they left the queue without a trace, and came back at the next restart); a second later they are
    read again."""
    s = start(tmp_path)
    restart.append(s)
    store = s.store
    assert store is not None
    q, _ = s.wiring.declare_queue("orders", {"durable": True})
    for i in range(10):
        q.enqueue(body(i), durable=True)
    commit(s)
    store.page_out(q, 1 << 20)
    assert q.paged_count == 10 and not q.entries
    gone: list[int] = []  # what replication would be told
    q.observers.append(Dequeues(gone))
    real = os.pread

    def eio(*_: object) -> bytes:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "pread", eio)
    assert store.page_in(q, 1 << 20) == 0
    assert q.paged_count == 10 and q.depth == 10 and not q.entries and not gone
    assert store.read_errors == 1
    monkeypatch.setattr(os, "pread", real)
    assert store.page_in(q, 1 << 20) == 0  # not before a second has passed
    store.read_again_at.clear()
    assert store.page_in(q, 1 << 20) > 0
    assert drain(s, q) == [body(i)[:5] for i in range(10)]
    commit(s)
    stop(s)
    s = start(tmp_path)
    restart.append(s)
    assert s.wiring.queues["orders"].depth == 0  # consumed, and journaled as such


def test_a_backup_keeps_what_its_primary_says_of_a_message_it_has_paged(
        tmp_path: Path, restart: list[Server]) -> None:
    """The primary's consumers took message 1 and failed it three times (Released, count 3), and hold message 2
    (Acquired): on a backup that has both paged, that was dropped (after a failover message 1 came back with its
    old count, so delivery-limit undercounted, and message 2 not as redelivered). Applied when read back, and
    journaled."""
    s = start(tmp_path)
    restart.append(s)
    store = s.store
    assert store is not None
    q, _ = s.wiring.declare_queue("q", {"durable": True})
    for pos in range(1, 11):
        q.enqueue_replica(pos, b"m%d" % pos, 0, DURABLE, 0, None)  # as a backup applies its primary's messages
    commit(s)
    store.page_out(q, 1 << 20)
    assert q.paged_count == 10
    QueueReplicator._apply_state(q, B.Acquired("A", 1, 2))
    QueueReplicator._apply_state(q, B.Released("R", 1, 1, 3))
    store.page_in(q, 1 << 20)
    one, two = q.entries[1], q.entries[2]
    assert (one.count, one.redelivered) == (3, True)
    assert (two.count, two.redelivered, bool(two.flags & HELD)) == (1, True, True)
    commit(s)
    stop(s)
    s = start(tmp_path)
    restart.append(s)
    assert s.wiring.queues["q"].entries[1].count == 3



def test_a_queue_read_back_whole_at_a_restart_that_cannot_be_read_does_not_start(
        tmp_path: Path, restart: list[Server], monkeypatch: pytest.MonkeyPatch) -> None:
    """A queue that can no longer page is read back whole at a restart: an I/O error then stops the start with the
    error (it left the unread messages out, and nothing held their segment any more)."""
    s, _ = two_hundred_orders(tmp_path, restart)
    s.wiring.update_queue("orders", {"max-count": 1000})
    commit(s)
    stop(s)

    def eio(*_: object) -> bytes:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "pread", eio)
    with pytest.raises(JournalError, match="could not be read back"):
        Server(BrokerConfig(port=0, data_dir=tmp_path, max_memory=BOUND), "unit").start()
