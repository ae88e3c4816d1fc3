"""The store's group commit: what waits for the journal (a client's durable delivery, a backup's acknowledgement)
runs only after the fdatasync of the pass that journaled it, never before. A real Server and journal on disk; the
event loop is turned by hand."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.config import BrokerConfig
from broker.queue import DURABLE, DequeueReason
from broker.server import Server
from broker.store import records as R
from broker.store.journal import INLINE_SYNC_BYTES
from broker.store.store import read_journal


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    s = Server(BrokerConfig(port=0, data_dir=tmp_path), "unit")
    assert s.store is not None
    s.store.recover()
    s.start()
    try:
        yield s
    finally:
        s.store.close()
        s.engine.close()


def settle(server: Server) -> None:
    """Let every sync in flight (the start-up checkpoint's) report back."""
    store = server.store
    assert store is not None
    deadline = time.monotonic() + 5
    while store.tickets and time.monotonic() < deadline:
        server.engine.run_once(0.02)
    assert not store.tickets


def test_when_synced_waits_for_the_sync_of_the_pass_that_journaled(server: Server) -> None:
    store = server.store
    assert store is not None
    settle(server)
    done: list[str] = []
    store.journal.append(R.document(R.STATE, {"probe": "x" * (INLINE_SYNC_BYTES + 1)}))  # too big to sync inline
    store.when_synced(lambda: done.append("ack"))
    assert done == []  # journaled, not even written
    store.end_of_pass()  # written; the fdatasync runs in the syncer thread
    assert done == [] and store.tickets
    deadline = time.monotonic() + 5
    while not done and time.monotonic() < deadline:
        server.engine.run_once(0.05)  # the syncer's report arrives as a call on the loop
    assert done == ["ack"] and store.journal.synced == store.journal.ticket


def test_nothing_journaled_means_no_wait(server: Server) -> None:
    store = server.store
    assert store is not None
    for _ in range(50):  # let the start-up checkpoint's sync arrive
        server.engine.run_once(0.02)
        if not store.tickets:
            break
    done: list[str] = []
    store.when_synced(lambda: done.append("ack"))
    assert done == ["ack"]


def test_a_small_commit_with_nothing_in_flight_is_synced_in_its_own_pass(server: Server) -> None:
    """One-at-a-time publishing: the pass's fdatasync runs on the loop, so what waits for it is released in the
    same pass (no round trip through the syncer thread)."""
    store = server.store
    assert store is not None
    settle(server)
    done: list[str] = []
    store.journal.append(R.document(R.STATE, {"probe": 2}))
    store.when_synced(lambda: done.append("ack"))
    store.end_of_pass()
    assert done == ["ack"] and not store.tickets and store.journal.synced == store.journal.ticket


def test_a_small_commit_behind_a_sync_in_flight_waits_for_the_thread(server: Server) -> None:
    store = server.store
    assert store is not None
    settle(server)
    done: list[str] = []
    store.journal.append(R.document(R.STATE, {"probe": "x" * (INLINE_SYNC_BYTES + 1)}))
    store.end_of_pass()  # a big commit: to the syncer thread
    store.journal.append(R.document(R.STATE, {"probe": 3}))
    store.when_synced(lambda: done.append("ack"))
    store.end_of_pass()  # small, but the first is not known synced yet: it must not overtake it
    assert done == [] and len(store.tickets) >= 1
    deadline = time.monotonic() + 5
    while not done and time.monotonic() < deadline:
        server.engine.run_once(0.05)
    assert done == ["ack"] and store.journal.synced == store.journal.ticket


def test_a_position_dequeued_and_taken_again_in_one_pass_is_recovered_with_its_new_message(
        server: Server, tmp_path: Path) -> None:
    """A backup's catch-up after a failover drops a message an older epoch gave position P and takes the new
    primary's message at P, often in one pass: the dequeue must be on disk before the new enqueue, or recovery
    drops a message the cluster acknowledged (found by the whole-cluster-kill soak, seed 188555377)."""
    store = server.store
    assert store is not None
    q, _ = server.wiring.declare_queue("dq", {"durable": True})
    for pos, body in ((1, b"a"), (2, b"old")):
        q.enqueue_replica(pos, body, 0, DURABLE, 0, None)
    store.end_of_pass()
    q.dequeue_range(2, 2, DequeueReason.REPLICATED)  # the stale message at 2 ...
    q.enqueue_replica(2, b"new", 0, DURABLE, 0, None)  # ... and the new primary's message at 2, in the same pass
    q.dequeue_range(1, 1, DequeueReason.REPLICATED)  # an ordinary dequeue of the same pass: still written at its end
    store.end_of_pass()
    settle(server)
    image, _, _, _ = read_journal(tmp_path / "journal")
    (msgs,) = image.messages.values()
    assert {pos: m[4] for pos, m in msgs.items()} == {2: b"new"}
