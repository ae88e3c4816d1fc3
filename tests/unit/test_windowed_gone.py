"""A windowed message (its id in the queue's duplicate window) consumed on the primary before a backup had it: its
publisher is settled only once that backup has the id ("G" records, batch format version 4), never at the dequeue
alone. The primary's real QueueWatch, GuardBook, BackupCatchup and ReplicatingSender, with a link that is not
there (the batches it would send are collected and parsed); the broker's real Queue."""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from proton import Message

from broker.dedup import key
from broker.links import AcceptCompletion
from broker.options import QueueOptions
from broker.queue import REDELIVERED, WINDOWED, DequeueReason, Entry, Queue
from broker.store.store import Store
from ha import protocol as P
from ha.core.batch import Acquired, Gone, Released, Window, parse
from ha.core.catchup import BackupCatchup
from ha.core.guards import GuardBook
from ha.core.idset import PositionSet
from ha.primary import Primary as RealPrimary
from ha.replicating import QueueWatch, ReplicatingSender
from tests.support.store import close, commit, journaled


class Token:
    def __init__(self) -> None:
        self.released = 0

    def release(self) -> None:
        self.released += 1


class Primary:
    """What a QueueWatch and a ReplicatingSender use of the primary, and one backup "b" guarding."""

    def __init__(self, q: Queue, batch_bytes: int = 256 * 1024) -> None:
        self.q = q
        self.guards: GuardBook[Any] = GuardBook()
        self.guards.add_backup("b")
        self.watches: dict[str, QueueWatch] = {}
        self.changed: list[QueueWatch] = []
        self.to_run: set[ReplicatingSender] = set()
        self.config = SimpleNamespace(ha_flow_messages=1000, ha_batch_bytes=batch_bytes, ha_flow_bytes=16 << 20)
        self.server = SimpleNamespace(store=None, wiring=SimpleNamespace(queues={q.name: q}))
        self.node = SimpleNamespace(epoch=1)
        self.epoch_start: dict[str, int] = {}
        self.previous_epoch = 0
        self.backups: dict[str, Any] = {}
        self.watch = self.watches[q.name] = QueueWatch(self, q.name)  # type: ignore[arg-type]
        q.observers.append(self.watch)
        self.sent: list[bytes] = []

    def attach(self, version: int = 4, dequeue_acks: bool = False) -> ReplicatingSender:
        """The backup's browser attaches now (holding nothing), as Primary._attach_queue does it."""
        backup = SimpleNamespace(catchup=BackupCatchup([self.q.name]))
        props = {P.LINK_BATCH_MAX: version, P.LINK_BATCH: 1, P.LINK_DEQUEUE_ACKS: 1 if dequeue_acks else 0}
        link = SimpleNamespace(_impl=None, remote_properties=props, properties={}, is_receiver=False,
                               source=SimpleNamespace(address=None))
        st = SimpleNamespace(kind="ha")
        self.backups = {"b": SimpleNamespace(name="b", conn=st, epoch=1, senders={}, reattach={},
                                             catchup=backup.catchup)}
        s = RealPrimary._attach_queue(self, link, st, P.QUEUE_PREFIX + self.q.name)  # type: ignore[arg-type]
        assert isinstance(s, ReplicatingSender)
        s._send = self.sent.append  # type: ignore[method-assign]
        return s

    def _backup_of(self, st: Any) -> Any:
        return self.backups["b"]

    def publish(self, mid: str, window: bool = True) -> tuple[Entry, Token]:
        """A publisher's transfer routed as the router does it (the id enters the window), held for the backup."""
        data = bytes(Message(id=mid, body=mid, durable=True).encode())
        e = self.q.enqueue(data, 4, None, True)
        k = key(mid)
        assert k is not None and self.q.dedup is not None
        if window:
            self.q.dedup.add(k, time.time())
        e.flags |= WINDOWED
        t = Token()
        self.watch.hold(e.position, t, len(data))  # type: ignore[arg-type]
        return e, t

    def end_of_pass(self) -> list[Any]:
        """Flush the watch, let the browsers with work send (credit 100), as Primary.end_of_pass does: the records
        they sent (but the window's)."""
        for w in self.changed:
            w.flush()
        self.changed = []
        self.sent.clear()
        senders, self.to_run = self.to_run, set()
        for s in senders:
            s._send_batches(100)
        return [r for payload in self.sent for r in parse(payload, 1 << 20) if type(r) is not Window]

    def acked(self, b: Any, queue: str, positions: PositionSet) -> None:
        """(what Primary.acked does with the guards)"""
        for c in self.guards.acked(b.name, queue, positions).released:
            c.release()

    def ack(self, *positions: int) -> None:
        self.acked(SimpleNamespace(name="b"), self.q.name, PositionSet(positions))


def _queue() -> Queue:
    args = {"duplicate-window": 10}
    return Queue("q", args, QueueOptions.from_arguments(args))


def test_a_message_consumed_before_it_was_sent_is_settled_once_the_backup_acknowledges_its_id() -> None:
    p = Primary(_queue())
    s = p.attach()
    s.flow_bytes = 0  # the replication credit is used up: live messages wait
    s.inflight.append((0, 1))
    s.inflight_bytes = 1
    e, t = p.publish("m-1")
    assert p.end_of_pass() == [] and list(s.live) == [e]  # held, not sent
    p.q.dequeue(e, DequeueReason.ACCEPTED)  # a consumer takes it
    s.flow_bytes = 16 << 20
    records = p.end_of_pass()
    assert t.released == 0  # not at the dequeue
    assert Gone("G", 1, b"Sm-1") in records and not any(type(r) is tuple and len(r) == 6 for r in records)
    p.ack(1)
    assert t.released == 1


def test_a_message_consumed_after_it_was_sent_waits_for_the_acknowledgement_with_no_gone_record() -> None:
    p = Primary(_queue())
    p.attach()
    e, t = p.publish("m-1")
    assert [r[0] for r in p.end_of_pass() if type(r) is tuple and len(r) == 6] == [1]  # sent, with its id
    p.q.dequeue(e, DequeueReason.ACCEPTED)
    assert not any(type(r) is Gone for r in p.end_of_pass()) and t.released == 0
    p.ack(1)
    assert t.released == 1


def test_a_backup_of_batch_format_3_is_not_waited_for_at_the_dequeue() -> None:
    p = Primary(_queue())
    p.attach(version=3)
    e, t = p.publish("m-1")
    p.q.dequeue(e, DequeueReason.ACCEPTED)  # in the pass that took it
    assert t.released == 0
    p.end_of_pass()
    assert t.released == 1  # as before version 4


def test_a_message_whose_write_failed_is_released_at_once_and_its_id_never_sent() -> None:
    """The journal's write failed: the publisher is refused, the id leaves the primary's window (broker.store), so
    no backup may take it (a resend after a failover would be dropped: lost)."""
    p = Primary(_queue())
    p.attach()
    e, t = p.publish("m-1")
    Store.take_back([[(p.q, e)]], [])
    assert p.q.dedup is not None and not p.q.dedup.seen(b"Sm-1", time.time())
    records = p.end_of_pass()
    assert t.released == 1 and not any(type(r) is Gone for r in records)


def test_a_catch_up_message_consumed_before_it_was_sent_is_acknowledged_without_a_message() -> None:
    """Below the browser's snapshot the id came in the window of its first batch: a "G" without the id makes the
    backup acknowledge the position, and it does not count as a catch-up acknowledgement."""
    p = Primary(_queue())
    held = [p.publish(f"m-{i}") for i in range(1, 4)]
    p.end_of_pass()  # no browser yet: held for "b" all the same
    s = p.attach()
    s.catchup_window = 0  # catch-up sends nothing yet
    p.q.dequeue(held[1][0], DequeueReason.ACCEPTED)
    records = p.end_of_pass()
    assert Gone("G", 2, b"") in records and held[1][1].released == 0
    s.catchup_window = 1000
    p.to_run.add(s)  # (as the backup's credit or acknowledgements do)
    records = p.end_of_pass()
    assert sorted(r[0] for r in records if type(r) is tuple and len(r) == 6) == [1, 3]
    s.acknowledged(PositionSet([1, 2, 3]))
    s._acked(s.acks)  # (what run() does)
    assert [t.released for _, t in held] == [1, 1, 1] and not s.catchup_sent and s.qc.done


def test_a_catch_up_message_consumed_after_it_was_sent_gets_no_gone_record() -> None:
    """Sent by catch-up (acknowledged exactly when applied): an acknowledgement-only "G" too would be taken for
    the catch-up batch's and leave it counted in flight."""
    p = Primary(_queue())
    e, t = p.publish("m-1")
    p.end_of_pass()
    s = p.attach()
    assert [r[0] for r in p.end_of_pass() if type(r) is tuple and len(r) == 6] == [1]
    p.q.dequeue(e, DequeueReason.ACCEPTED)
    assert not any(type(r) is Gone for r in p.end_of_pass()) and s.catchup_sent
    s._acked(PositionSet([1]))
    assert t.released == 1 and not s.catchup_sent and s.catchup_bytes == 0


def test_paged_messages_of_a_windowed_queue_come_back_marked_windowed(tmp_path: Path) -> None:
    """A record does not say whether its message's id entered the window: read back on a queue with one, a
    message counts as windowed (its publisher waits for the backups' acknowledgement, not the dequeue)."""
    s = journaled(tmp_path, 1 << 20)
    try:
        store = s.store
        assert store is not None
        plain, _ = s.wiring.declare_queue("plain", {"durable": True})
        windowed, _ = s.wiring.declare_queue("windowed", {"durable": True, "duplicate-window": 100})
        for q in (plain, windowed):
            for i in range(20):
                q.enqueue(Message(id=f"m-{i}", body="x" * 100_000, durable=True).encode(), durable=True)
            store.end_of_pass()
            store.sync_deferred()
            assert store.page_out(q, 1 << 30) > 0 and q.paged_count
            assert store.page_in(q, 1 << 30) > 0
        assert all(e.flags & WINDOWED for e in windowed.entries.values())
        assert not any(e.flags & WINDOWED for e in plain.entries.values())
    finally:
        close(s)


def test_a_message_taken_and_dequeued_in_the_round_its_browser_attached_in_is_acknowledged() -> None:
    """Routed, dequeued (a ring queue overflowing, a purge) and the backup's browser attached, all before the pass
    ends: the place is held for the backup only at the flush after the attach, and the message was never on the
    queue the browser saw. The browser acknowledges it ("G" without an id) or its publisher waits for good."""
    p = Primary(_queue())
    _, t0 = p.publish("m-0")  # stays on the queue: the dequeued place is below the browser's snapshot
    e, t = p.publish("m-1")
    _, t2 = p.publish("m-2")
    p.q.dequeue(e, DequeueReason.PURGED)
    p.attach()
    records = p.end_of_pass()
    assert Gone("G", 2, b"") in records and t.released == 0
    p.ack(1, 2, 3)
    assert (t0.released, t.released, t2.released) == (1, 1, 1)


def test_a_paged_message_dequeued_unread_before_it_was_sent_sends_its_id(tmp_path: Path) -> None:
    """A purge (or a move) of paged messages dequeues them without reading them back: the browser's own copy,
    not yet sent, gives the id (released at the dequeue, the backup never learned it)."""
    s = journaled(tmp_path, 1 << 20)
    try:
        q, _ = s.wiring.declare_queue("windowed", {"durable": True, "duplicate-window": 100})
        p = Primary(q)
        b = p.attach()
        b.flow_bytes = 0  # the replication credit is used up: live messages wait
        b.inflight.append((0, 1))
        b.inflight_bytes = 1
        e, t = p.publish("m-1")
        p.end_of_pass()
        commit(s)
        assert s.store is not None and s.store.page_out(q, 1 << 30) and q.paged_count == 1
        assert q.purge() == 1
        b.flow_bytes = 16 << 20
        records = p.end_of_pass()
        assert Gone("G", e.position, b"Sm-1") in records and t.released == 0
        p.ack(e.position)
        assert t.released == 1
    finally:
        close(s)


def test_a_message_whose_id_is_not_in_the_window_is_acknowledged_without_it() -> None:
    """A message read back from the journal counts as windowed though its id may never have entered the window
    (moved or dead-lettered into the queue): the backup must not take an id the primary's window does not have
    (its window would differ, and drop a resend the primary takes)."""
    p = Primary(_queue())
    b = p.attach()
    b.flow_bytes = 0
    b.inflight.append((0, 1))
    b.inflight_bytes = 1
    e, t = p.publish("moved-1", window=False)
    p.end_of_pass()
    p.q.dequeue(e, DequeueReason.ACCEPTED)
    b.flow_bytes = 16 << 20
    assert Gone("G", 1, b"") in p.end_of_pass()
    p.ack(1)
    assert t.released == 1


def test_acknowledgement_only_records_are_sent_within_the_batch_bytes() -> None:
    """A browser attaching after 300 windowed messages were purged unsent: their acknowledgements go over several
    batches of --ha-batch-bytes, not one transfer as big as the purge."""
    p = Primary(_queue(), batch_bytes=1024)
    tokens = [p.publish(f"m-{i}")[1] for i in range(300)]
    p.end_of_pass()
    p.q.purge()
    p.end_of_pass()
    b = p.attach()
    sizes, acked = [], 0
    for _ in range(10):
        p.end_of_pass()
        sizes += [len(x) for x in p.sent]
        got = [r.position for x in p.sent for r in parse(x, 1 << 20) if type(r) is Gone]
        acked += len(got)
        if got:
            b.acknowledged(PositionSet(got))
            b._acked(b.acks)
            b.acks = PositionSet()
    assert acked == 300 and all(t.released == 1 for t in tokens)
    assert len(sizes) > 3 and max(sizes) < 1024 + 64


def test_acknowledgement_only_records_go_out_though_the_first_batch_is_full_of_window() -> None:
    """A window of thousands of ids fills the first batch on its own: the "G" records follow in batches of their
    own at once (that batch brings no acknowledgement that would run the browser again: they waited for good)."""
    args = {"duplicate-window": 100_000}
    p = Primary(Queue("q", args, QueueOptions.from_arguments(args)))
    assert p.q.dedup is not None
    for i in range(20_000):
        p.q.dedup.add(key(f"earlier-{i:032d}") or b"", 1.0)
    held = [p.publish(f"m-{i}") for i in range(1, 4)]
    p.end_of_pass()
    for e, _ in held:
        p.q.dequeue(e, DequeueReason.ACCEPTED)
    p.end_of_pass()
    p.attach()
    records = p.end_of_pass()
    assert len(p.sent) >= 2 and [r.position for r in records if type(r) is Gone] == [1, 2, 3]
    p.ack(1, 2, 3)
    assert [t.released for _, t in held] == [1, 1, 1]


def test_a_consumer_waiting_for_its_accept_lets_the_message_go_once_the_backup_was_sent_it() -> None:
    """A consumer in receiver-settle-mode second is told its accept stands only once the backup acknowledged the
    dequeue, which it applies after the message (and its id) it was sent before: the dequeue settles the publisher,
    as before version 4. One the backup was not sent yet (or an at-most-once consumer's) waits for its "G"."""
    p = Primary(_queue())
    s = p.attach(dequeue_acks=True)
    assert s.dequeue_acks
    (sent, t1), (presettled, t2) = p.publish("m-1"), p.publish("m-2")
    p.end_of_pass()  # both sent
    s.flow_bytes = 0  # then the replication credit is used up: m-3 waits
    s.inflight_bytes = s.flow_bytes + 1
    unsent, t3 = p.publish("m-3")
    p.end_of_pass()
    consumer = SimpleNamespace(server=SimpleNamespace(accepts_to_settle=[]))
    for e, held in ((sent, True), (presettled, False), (unsent, True)):
        p.q.dequeue(e, DequeueReason.ACCEPTED)
        if held:  # (what the consumer link does for an accept in mode second)
            p.watch.hold_accept(AcceptCompletion(consumer, None))  # type: ignore[arg-type]
    s.flow_bytes = 16 << 20
    records = p.end_of_pass()
    assert (t1.released, t2.released, t3.released) == (1, 0, 0)
    assert Gone("G", 3, b"Sm-3") in records
    p.ack(3)
    assert (t2.released, t3.released) == (1, 1)


def test_a_commit_lets_nothing_go_early() -> None:
    """A commit's dequeues on a queue may be followed by others before it asks to be answered (its dead letter
    pushing a message out of a ring queue): its answer does not name the message, so nothing is let go early."""
    p = Primary(_queue())
    p.attach(dequeue_acks=True)
    (taken, t1), (pushed, t2) = p.publish("m-1"), p.publish("m-2")
    p.end_of_pass()
    p.q.dequeue(taken, DequeueReason.ACCEPTED)  # the commit's accept
    p.q.dequeue(pushed, DequeueReason.RING)  # pushed out by its dead letter
    p.watch.hold_accept(Token())  # type: ignore[arg-type]  # (a commit's Completion)
    p.end_of_pass()
    assert (t1.released, t2.released) == (0, 0)
    p.ack(2)
    assert (t1.released, t2.released) == (1, 1)


def test_a_dequeue_undone_in_its_pass_is_never_sent_to_the_backup() -> None:
    """A commit whose journal write failed is undone before the pass's batches go out (broker.transactions): the
    backup, which has the message acquired, is sent its release and no dequeue (nor a "G" record), and the message
    is not released from the guards until a later dequeue is acknowledged."""
    p = Primary(_queue())
    p.attach()
    e, t = p.publish("m-1")
    p.end_of_pass()
    p.ack(1)
    assert t.released == 1
    assert p.q.acquire_next() is e
    assert Acquired("A", 1, 1) in p.end_of_pass()
    data = e.data
    p.q.dequeue(e, DequeueReason.ACCEPTED)  # the commit
    assert p.q.reinstate(e, data)  # its write failed: undone, in the same pass
    p.q.release(e, delivery_failed=True, redelivered=True)
    records = p.end_of_pass()
    assert Released("R", 1, REDELIVERED, 1) in records
    assert not any(type(r) is Gone or (type(r) is tuple and len(r) == 2) for r in records), records
    assert p.q.entries[1] is e and e.data == data
    p.q.dequeue(p.q.acquire_next() or e, DequeueReason.ACCEPTED)  # consumed for good later: sent as usual
    assert (1, 1) in p.end_of_pass()
