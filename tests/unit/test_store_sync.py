"""The store's group commit: what waits for the journal (a client's durable delivery, a backup's acknowledgement)
runs only after the fdatasync of the pass that journaled it, never before. A real Server and journal on disk; the
event loop is turned by hand."""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from proton import Message

from broker.config import BrokerConfig
from broker.engine.engine import AFTER_FLUSH_ROUNDS
from broker.links import Completion
from broker.queue import DURABLE, DequeueReason, Queue
from broker.server import Server
from broker.store import journal as J
from broker.store import records as R
from broker.store.journal import INLINE_OFF, INLINE_SYNC_BYTES, INLINE_SYNC_SLOW, segment_name
from broker.store.store import read_journal
from broker.transactions import ACCEPTED, Taken
from tests.support.store import wait_synced


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
    wait_synced(server)


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


def test_a_small_commit_with_nothing_in_flight_is_synced_by_the_loop_after_its_writes(server: Server) -> None:
    """One-at-a-time publishing: the pass's fdatasync runs on the loop, right after the pass's output is written to
    the sockets (what it sends to backups is on its way while this disk flushes), and what waits for it is
    released in that same turn of the loop (no round trip through the syncer thread)."""
    store = server.store
    assert store is not None
    settle(server)
    done: list[str] = []
    store.journal.append(R.document(R.STATE, {"probe": 2}))
    store.when_synced(lambda: done.append("ack"))
    store.end_of_pass()
    assert done == [] and store.journal.deferred is not None  # written, not synced: the loop's writes go first
    assert server.engine.after_flush == store.sync_deferred
    syncs: list[int] = []
    real = store.journal.syncer.request  # type: ignore[union-attr]
    store.journal.syncer.request = lambda t, fds: (syncs.append(t), real(t, fds))  # type: ignore[union-attr]
    server.engine.run_once(0)
    assert done == ["ack"] and not store.tickets and store.journal.synced == store.journal.ticket
    assert syncs == [] and store.journal.deferred is None


def test_small_commits_of_one_turn_share_the_deferred_sync(server: Server) -> None:
    store = server.store
    assert store is not None
    settle(server)
    done: list[str] = []
    for n in range(3):
        store.journal.append(R.document(R.STATE, {"probe": n}))
        store.when_synced(lambda n=n: done.append(f"ack{n}"))
        store.end_of_pass()
    assert done == [] and len(store.tickets) == 3 and store.journal.deferred is not None
    assert store.journal.deferred[0] == store.journal.ticket
    assert store.sync_deferred()
    assert done == ["ack0", "ack1", "ack2"] and not store.tickets and not store.sync_deferred()


def test_a_slow_inline_sync_hands_the_syncs_to_the_thread_for_a_while(server: Server,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A disk busy with another process's writes can take a second for one fdatasync, and an inline one holds the
    loop (no heartbeats) meanwhile: after one slow inline sync the small commits go to the syncer thread for
    INLINE_OFF[0] seconds, twice as long if it happens again soon after, and inline again once that has passed."""
    store = server.store
    assert store is not None
    journal = store.journal
    settle(server)
    real = os.fdatasync

    def slow(fd: int) -> None:
        time.sleep(INLINE_SYNC_SLOW * 1.5)
        real(fd)

    def small_commit() -> list[str]:
        done: list[str] = []
        journal.append(R.document(R.STATE, {"probe": 4}))
        store.when_synced(lambda: done.append("ack"))
        store.end_of_pass()
        return done

    monkeypatch.setattr(os, "fdatasync", slow)
    small_commit()
    assert journal.deferred is not None and store.sync_deferred()  # inline, and slow
    assert journal.slow_syncs == 1 and journal.inline_off_for == INLINE_OFF[0]
    assert journal.inline_off_until > time.monotonic() + INLINE_OFF[0] - 5
    done = small_commit()
    assert journal.deferred is None and store.tickets and done == []  # to the thread: the loop does not wait
    settle(server)
    assert done == ["ack"]

    journal.inline_off_until = time.monotonic() - 1  # the time is up: inline again
    small_commit()
    assert journal.deferred is not None and store.sync_deferred()  # slow again, soon after the first
    assert journal.slow_syncs == 2 and journal.inline_off_for == 2 * INLINE_OFF[0]

    monkeypatch.setattr(os, "fdatasync", lambda fd: None)  # a fast disk (the real one may be slow in CI)
    journal.inline_off_until = time.monotonic() - 1
    small_commit()
    assert journal.deferred is not None and store.sync_deferred() and journal.slow_syncs == 2


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
    assert {pos: m.data for pos, m in msgs.items()} == {2: b"new"}


def test_the_loop_does_not_sleep_on_after_flush_work_it_left(server: Server) -> None:
    """A hook that keeps releasing work is bounded per turn of the loop, and the next turn does not wait for a
    socket: what it left is done at once."""
    engine = server.engine
    calls: list[int] = []

    def hook() -> bool:
        calls.append(1)
        return len(calls) <= AFTER_FLUSH_ROUNDS
    engine.after_flush = hook
    engine.run_once(0)
    assert len(calls) == AFTER_FLUSH_ROUNDS and engine._timeout(60.0) == 0.0
    engine.run_once(60.0)  # returns at once: owed work
    assert len(calls) == AFTER_FLUSH_ROUNDS + 1 and engine._timeout(60.0) > 0


def test_a_closed_store_stops_probing_a_failed_journal(server: Server, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """After a write failure the store probes the journal every PROBE_INTERVAL; once the store is closed (the
    broker stopping) no probe runs: it would start a new segment in a journal that was closed after its last
    sync."""
    store = server.store
    assert store is not None
    settle(server)
    monkeypatch.setattr("broker.store.store.PROBE_INTERVAL", 0.05)
    store._fail("journal: write failed (test)", [])
    segments = sorted(p.name for p in (tmp_path / "journal").iterdir())
    store.close()
    deadline = time.monotonic() + 0.5
    while time.monotonic() < deadline:
        server.engine.run_once(0.05)
    assert sorted(p.name for p in (tmp_path / "journal").iterdir()) == segments
    assert store.failed is not None  # nor was the closed journal declared writable again


def test_a_pass_too_big_for_its_segment_is_refused_and_the_journal_goes_on_in_a_new_one(
        server: Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A message's location keeps its segment offset in 32 bits: a pass whose commit would take the segment past
    4 GiB (scaled down here) is not written, its publishers are refused with resource-limit-exceeded, the store
    starts a new segment in the next turn of the loop (not after its one-second probe of a failed disk), and what
    was acknowledged before and after is recovered."""
    store = server.store
    assert store is not None
    settle(server)
    q, _ = server.wiring.declare_queue("big", {"durable": True})
    q.enqueue_replica(1, b"a" * 1000, 0, DURABLE, 0, None)
    store.end_of_pass()
    settle(server)
    first, size = store.journal.segment, store.journal.size
    monkeypatch.setattr(R, "LOC_OFFSET", size + 50_000)
    publisher = SimpleNamespace(server=server)
    refused = Completion(publisher, None)  # type: ignore[arg-type]
    q.enqueue_replica(2, b"b" * 60_000, 0, DURABLE, 0, None)
    assert store.hold(refused, [(q, q.entries[2])])
    store.end_of_pass()
    assert refused.error is not None and refused.error[0] == "amqp:resource-limit-exceeded"
    assert "past the 4 GiB a segment may hold" in refused.error[1]
    assert store.failed is not None  # for the rest of this pass (a backup leaves rather than acknowledge them)
    server.engine.run_once(0)
    assert store.failed is None and not server.refusing  # writable again in the next turn, in a new segment
    assert store.journal.segment > first
    assert sorted(q.entries) == [1]  # refused: taken off its queue again (a resend must not make it twice)
    assert (tmp_path / "journal" / segment_name(first)).stat().st_size == size
    taken = Completion(publisher, None)  # type: ignore[arg-type]
    q.enqueue_replica(3, b"c" * 1000, 0, DURABLE, 0, None)
    assert store.hold(taken, [(q, q.entries[3])])
    store.end_of_pass()
    settle(server)
    assert taken.error is None and taken.pending == 0
    image, _, _, _ = read_journal(tmp_path / "journal")
    (msgs,) = image.messages.values()
    assert {pos: m.data[:1] for pos, m in msgs.items()} == {1: b"a", 3: b"c"}


def replicas_whose_write_will_fail(server: Server, monkeypatch: pytest.MonkeyPatch) -> Queue:
    """A durable queue given replicas at positions 1 and 2 (as a backup's), whose write at the end of the pass will
    fail (SegmentFull, the 4 GiB scaled down, as a full disk would) while the next segment has room for them."""
    store = server.store
    assert store is not None
    settle(server)
    q, _ = server.wiring.declare_queue("replicas", {"durable": True})
    store.journal.append(R.document(R.STATE, {"probe": "x" * 30_000}))
    store.end_of_pass()
    settle(server)
    monkeypatch.setattr(R, "LOC_OFFSET", 40_000)
    for pos in (1, 2):
        q.enqueue_replica(pos, b"r" * 5_000, 0, DURABLE, 0, None)
    return q


def test_what_a_failed_write_left_queued_is_written_with_the_probe_that_finds_the_journal_writable(
        server: Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A backup's replicas (nobody to refuse: the backup leaves its primary instead) stay queued when their write
    fails; the probe that finds the journal writable writes them, before the backup rejoins and says what it holds:
    else a message it keeps in memory would be missing from its journal after a restart."""
    store = server.store
    assert store is not None
    q = replicas_whose_write_will_fail(server, monkeypatch)
    store.end_of_pass()
    assert store.failed is not None and sorted(q.entries) == [1, 2] and not q.entries[1].seg
    server.engine.run_once(0)  # the probe: a new segment, and the replicas written with it
    assert store.failed is None and q.entries[1].seg and q.entries[2].seg
    settle(server)
    image, _, _, _ = read_journal(tmp_path / "journal")
    (msgs,) = image.messages.values()
    assert sorted(msgs) == [1, 2]


def test_what_waits_for_the_disk_waits_through_a_failed_write_until_the_journal_writes_again(
        server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    """`when_synced` promises "once everything journaled so far is on disk" (a backup's acknowledgement, a
    consumer's accept): a failed write keeps no such promise. What waited for it, and what asks while the journal
    has failed, runs only once the probe's write is on disk."""
    store = server.store
    assert store is not None
    replicas_whose_write_will_fail(server, monkeypatch)
    done: list[str] = []
    store.when_synced(lambda: done.append("acknowledge 1-2"))
    store.end_of_pass()
    assert store.failed is not None and done == []
    store.when_synced(lambda: done.append("asked meanwhile"))
    assert done == []
    server.engine.run_once(0)  # the probe: a new segment, the replicas written with it
    settle(server)
    assert store.failed is None and done == ["acknowledge 1-2", "asked meanwhile"]


# ----- faults of the disk: what was not known on disk is never accepted, what was is never lost ----------------------
def durable_queue(server: Server, arguments: dict[str, Any] | None = None) -> Queue:
    store = server.store
    assert store is not None
    settle(server)
    q, _ = server.wiring.declare_queue("orders", {"durable": True, **(arguments or {})})
    store.end_of_pass()
    settle(server)
    return q


def a_publisher_waiting(server: Server, q: Queue, position: int) -> Completion:
    """A client's durable message on `q`, held by the store until its pass is on disk."""
    store = server.store
    assert store is not None
    waiting = Completion(SimpleNamespace(server=server), None)  # type: ignore[arg-type]
    q.enqueue_replica(position, b"m", 0, DURABLE, 0, None)
    assert store.hold(waiting, [(q, q.entries[position])])
    return waiting


def failing_once(monkeypatch: pytest.MonkeyPatch, errno_: int = errno.EIO) -> list[int]:
    """The next fdatasync on this process fails; later ones succeed (Linux reports a writeback error once)."""
    real, calls = os.fdatasync, []

    def fdatasync(fd: int) -> None:
        calls.append(fd)
        if len(calls) == 1:
            raise OSError(errno_, os.strerror(errno_))
        real(fd)
    monkeypatch.setattr(os, "fdatasync", fdatasync)
    return calls


def test_an_inline_fdatasync_that_fails_refuses_the_message_and_is_not_asked_again(
        server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    """Linux reports a writeback error to one fdatasync of a file, then returns 0 (PostgreSQL's "fsyncgate"): a
    failed sync on the loop is not handed to the sync process, whose fdatasync of the same file would succeed and
    accept a message that may never have reached the disk. Its publisher is refused; the journal has failed."""
    store = server.store
    assert store is not None
    q = durable_queue(server)
    waiting = a_publisher_waiting(server, q, 1)
    store.end_of_pass()
    assert store.journal.deferred is not None  # small, nothing in flight: synced by the loop after its writes
    calls = failing_once(monkeypatch)
    store.sync_deferred()
    assert calls and waiting.error == ("amqp:resource-limit-exceeded", "journal: fdatasync failed (Input/output error)")
    assert store.failed is not None and server.refusing


def test_a_roll_over_whose_sync_of_the_old_segment_fails_refuses_what_was_written_there(
        server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    """A new segment starts only once the old one is synced; when that fdatasync fails, what was written to the
    old one since its last good sync (this pass's message, its own sync still owed) is refused, not accepted by
    the owed sync that the kernel would let pass."""
    store = server.store
    assert store is not None
    q = durable_queue(server)
    waiting = a_publisher_waiting(server, q, 1)
    store.journal.overflowed = True  # this pass also rolls over to a new segment
    first = store.journal.segment
    failing_once(monkeypatch)
    store.end_of_pass()
    store.sync_deferred()  # the sync this pass's commit still owed: it would pass
    assert waiting.error is not None and waiting.error[0] == "amqp:resource-limit-exceeded"
    assert store.failed is not None and store.journal.segment == first


def test_a_roll_over_drops_no_older_segment_before_its_checkpoint_is_written_and_synced(
        server: Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Until the new segment's checkpoint is on disk, the older segments are what holds the durable wiring, the HA
    standing and the duplicate windows: a checkpoint that cannot be written (the disk full after the new segment's
    header) leaves them, and the journal still replays to all of it; so does the probe that writes it later."""
    store = server.store
    assert store is not None
    server.wiring.declare_exchange("x", "direct", {"durable": True})
    q = durable_queue(server, {"duplicate-window": 1000})
    server.wiring.bind("x", "orders", "k", {})
    store.record_state(7, "primary", "active", ready_epoch=7)
    e = q.enqueue(b"body", durable=True)
    assert q.dedup is not None
    q.dedup.add(b"Sorder-42", time.time())
    store.end_of_pass()
    settle(server)
    q.dequeue(e)  # consumed: nothing live in the first segment
    store.end_of_pass()
    settle(server)
    real = J._write_all

    def full(fd: int, data: bytes, size_before: int) -> None:
        if len(data) > R.HEADER.size:
            raise J.JournalFull("journal: disk full (test)")
        real(fd, data, size_before)

    def replayed() -> tuple[list[str], list[str], int, list[bytes]]:
        image, _, _, _ = read_journal(tmp_path / "journal")
        (qid,) = image.queues
        return ([d["name"] for d in image.queues.values()], list(image.exchanges), image.state.get("epoch", 0),
                [k for k, _ in image.window(qid)])

    monkeypatch.setattr(J, "_write_all", full)
    store.journal.overflowed = True
    store.end_of_pass()  # the roll-over: a new segment's header, then its checkpoint fails
    assert store.failed is not None
    assert replayed() == (["orders"], ["x"], 7, [b"Sorder-42"])
    monkeypatch.setattr(J, "_write_all", real)
    store._retry()  # room again: the probe
    settle(server)
    assert store.failed is None
    assert replayed() == (["orders"], ["x"], 7, [b"Sorder-42"])


def test_a_new_segment_that_cannot_be_made_leaves_the_journal_writing_the_current_one(
        server: Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Out of descriptors (EMFILE) while making the next segment: the journal goes on in the one it had (else the
    store's list of segments and the file written would part, and the next roll-over would truncate a segment of
    acknowledged messages), and what is taken after is recovered."""
    store = server.store
    assert store is not None
    q = durable_queue(server)
    first = store.journal.segment
    real = J.sync_path
    calls: list[Path] = []

    def emfile(directory: Path) -> None:
        calls.append(directory)
        if len(calls) == 1:
            raise OSError(errno.EMFILE, "Too many open files")
        real(directory)

    monkeypatch.setattr(J, "sync_path", emfile)
    store.journal.overflowed = True
    store.end_of_pass()
    assert calls and store.failed is not None and store.journal.segment == first == store.segments[-1]
    assert not (tmp_path / "journal" / segment_name(first + 1)).exists()
    server.engine.run_once(0)  # the probe, in the next turn (the commit overflowed): a new segment now
    assert store.failed is None and store.journal.segment == first + 1 == store.segments[-1]
    taken = [a_publisher_waiting(server, q, p) for p in (1, 2)]
    store.end_of_pass()
    settle(server)
    store.journal.overflowed = True
    store.end_of_pass()  # and the roll-over after: nothing of the segment they are in is lost
    settle(server)
    assert all(t.error is None and t.pending == 0 for t in taken)
    image, _, _, _ = read_journal(tmp_path / "journal")
    (msgs,) = image.messages.values()
    assert sorted(msgs) == [1, 2]


def test_a_restart_syncs_the_last_segment_before_it_makes_a_new_one(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the last segment may be torn: what a killed broker wrote last may be in the page cache only, so a
    restart syncs it before a newer segment exists (else a power loss soon after would tear a segment that is no
    longer the last: damage, and the broker would not start)."""
    s = Server(BrokerConfig(port=0, data_dir=tmp_path), "unit")
    assert s.store is not None
    s.store.recover()
    s.start()
    settle(s)
    s.store.close()
    s.engine.close()
    real_open, real_datasync, real_sync = os.open, os.fdatasync, os.fsync
    names: dict[int, str] = {}
    seen: list[str] = []

    def opened(path: Any, flags: int, *args: Any, **kw: Any) -> int:
        fd = real_open(path, flags, *args, **kw)
        names[fd] = f"{Path(path).name}{' (new)' if flags & os.O_CREAT else ''}"
        return fd

    def synced(real: Callable[[int], None]) -> Callable[[int], None]:
        def sync(fd: int) -> None:
            seen.append(f"sync {names.get(fd, '?')}")
            real(fd)
        return sync

    monkeypatch.setattr(os, "open", opened)
    monkeypatch.setattr(os, "fdatasync", synced(real_datasync))
    monkeypatch.setattr(os, "fsync", synced(real_sync))
    s = Server(BrokerConfig(port=0, data_dir=tmp_path), "unit")
    assert s.store is not None
    s.store.recover()
    seen.append("recovered")
    s.start()
    settle(s)
    s.store.close()
    s.engine.close()
    assert seen.index(f"sync {segment_name(1)}") < seen.index("recovered")


def test_what_waited_through_a_failure_is_answered_only_once_the_probes_roll_over_and_compaction_are_on_disk(
        tmp_path: Path) -> None:
    """A consumer's accept waits for its dequeue, which a failed write carried; the probe that finds the journal
    writable starts a new segment and compacts the oldest, writing the carried records there: the accept is
    answered only once every write made by then is on disk."""
    s = Server(BrokerConfig(port=0, data_dir=tmp_path, journal_segment_bytes=64 * 1024), "unit")
    store = s.store
    assert store is not None
    store.recover()
    s.start()
    try:
        j = store.journal
        q = durable_queue(s)
        kept = []
        for _ in range(3):  # three segments of 1 KiB messages
            kept.append([q.enqueue(b"m" * 1000, durable=True) for _ in range(60)])
            store.end_of_pass()
            settle(s)
            j.overflowed = True
            store.end_of_pass()
            settle(s)
        for e in kept[0][1:]:
            q.dequeue(e, DequeueReason.ACCEPTED)  # the oldest segment keeps one live message: worth compacting
        store.end_of_pass()
        settle(s)
        good, j.fd = j.fd, os.open(tmp_path / "journal" / segment_name(j.segment), os.O_RDONLY)  # writes fail
        q.dequeue(kept[1][0], DequeueReason.ACCEPTED)
        store.end_of_pass()
        assert store.failed is not None
        answered: list[tuple[int, int]] = []
        store.when_synced(lambda: answered.append((j.synced, j.ticket)))
        os.close(j.fd)
        j.fd, j.overflowed = good, True  # room again, and time for a new segment
        store._retry()
        assert store.failed is None
        settle(s)
        assert answered and all(synced == written for synced, written in answered)
    finally:
        store.close()
        s.engine.close()


def test_a_paged_message_that_cannot_be_read_back_holds_no_segment_on_disk(server: Server, tmp_path: Path) -> None:
    """A paged message whose record is unreadable is lost (journal.read_failed), and is no longer counted live: its
    segment is dropped like any other once the rest of it is consumed, not kept (with every later one) for good."""
    store = server.store
    assert store is not None
    q = durable_queue(server)
    for i in range(3):
        q.enqueue(b"body-%d" % i, durable=True)
    store.end_of_pass()
    settle(server)
    first = store.journal.segment
    store.page_out(q, 1 << 20)
    assert q.paged is not None and len(q.paged) == 3 and not q.entries
    (where,) = [loc for pos, loc, _ in q.paged.items() if pos == 2]
    with open(tmp_path / "journal" / segment_name(first), "r+b") as f:  # its body damaged on disk
        f.seek((where & R.LOC_OFFSET) + R.ENQUEUE_OVERHEAD)
        f.write(b"X")
    store.page_in(q, 1 << 20)
    assert [e.data for e in q.entries.values()] == [b"body-0", b"body-2"]
    assert store.live(first) == 2
    for e in list(q.entries.values()):
        q.dequeue(e, DequeueReason.ACCEPTED)
    store.end_of_pass()
    settle(server)
    store.journal.overflowed = True
    store.end_of_pass()  # a roll-over: the first segment has nothing live
    settle(server)
    assert first not in store.segments and not (tmp_path / "journal" / segment_name(first)).exists()


def test_a_failed_write_of_a_pass_with_a_commit_keeps_what_the_pass_journaled_besides_the_commit(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A transaction's unit held everything its pass journaled after the commit began (the pass's other dequeues
    too, a queue declared later in it): a failed write dropped all of it for good while memory went on. Now the
    unit is the commit's own records: what came before and after it is carried to the next write that succeeds,
    and only the commit fails (its accept comes back after a restart, as its client was told it failed)."""
    s = Server(BrokerConfig(port=0, data_dir=tmp_path), "unit")
    s.start()
    store = s.store
    assert store is not None
    qin, _ = s.wiring.declare_queue("in", {"durable": True})
    s.wiring.declare_queue("out", {"durable": True})
    x, z = qin.enqueue(b"X", durable=True), qin.enqueue(b"Z", durable=True)
    store.end_of_pass()
    settle(s)
    assert qin.acquire_next() is x and qin.acquire_next() is z
    qin.dequeue(z, DequeueReason.ACCEPTED)  # another consumer's accept, earlier in the pass
    coordinator = SimpleNamespace(conn=SimpleNamespace(id="c1"), txns={})
    txn = s.transactions.declare(coordinator)  # type: ignore[arg-type]
    txn.messages.append(("out", bytes(Message(body="Y", durable=True).encode())))
    txn.taken.append(Taken(None, qin, x, ACCEPTED))  # type: ignore[arg-type]
    s.transactions.commit(txn)
    s.wiring.declare_queue("late", {"durable": True})  # a management CREATE later in the same pass
    real = J._write_all

    def eio(*_: object) -> None:
        raise R.JournalError("journal: simulated EIO")

    monkeypatch.setattr(J, "_write_all", eio)
    store.end_of_pass()
    monkeypatch.setattr(J, "_write_all", real)
    assert store.failed is not None
    deadline = time.monotonic() + 5
    while store.failed is not None and time.monotonic() < deadline:  # the probe writes what was carried
        s.engine.run_once(0.05)
    settle(s)
    store.close()
    s.engine.close()
    image, _, _, _ = read_journal(tmp_path / "journal")
    assert {d["name"] for d in image.queues.values()} == {"in", "out", "late"}
    (qid,) = [q for q, d in image.queues.items() if d["name"] == "in"]
    assert [e.data for e in image.messages[qid].values()] == [b"X"]  # Z's accept kept; the commit's not
