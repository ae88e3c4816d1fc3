"""A transaction's commit whose journal write fails (the journal's first failure, in the commit's own pass) is
undone in memory as it is on disk: its accepted and rejected messages are back on their queues (released as a roll
back releases them), its messages and dead letters are taken off theirs, and its discharge is refused. Before, the
accepts stood in memory while the client was told the commit had failed: the messages were gone until a restart
brought them back (and gone for good from a backup, which was sent the dequeues). A real Server with its journal
on disk, turned by hand; the write fails through the journal's own write call."""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from proton import Message

from broker.config import BrokerConfig
from broker.errors import MessageRefused, QueueFull
from broker.links import Completion
from broker.options import QueueOptions
from broker.queue import ACQUIRED, AVAILABLE, REDELIVERED, DequeueReason, Entry, Queue
from broker.server import Server
from broker.store import journal as J
from broker.store import records as R
from broker.store.store import read_journal
from broker.transactions import ACCEPTED, REJECTED, Taken, Transaction
from tests.support.store import close, commit, journaled


def _txn(s: Server) -> Transaction:
    coordinator = SimpleNamespace(conn=SimpleNamespace(id="c1"), txns={})
    return s.transactions.declare(coordinator)  # type: ignore[arg-type]


def _answer(s: Server) -> Completion:
    """The discharge's answer, as `Transactions.discharge` makes it (its publisher: the coordinator link)."""
    return Completion(SimpleNamespace(server=s), None)  # type: ignore[arg-type]


def _fail_write(s: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    """End the pass with a write that fails (EIO), as a full or broken disk fails it."""
    assert s.store is not None
    real = J._write_all

    def eio(*_: object) -> None:
        raise R.JournalError("journal: simulated EIO")

    monkeypatch.setattr(J, "_write_all", eio)
    s.store.end_of_pass()
    monkeypatch.setattr(J, "_write_all", real)
    assert s.store.failed is not None


def _until_writable(s: Server) -> None:
    assert s.store is not None
    deadline = time.monotonic() + 5
    while s.store.failed is not None and time.monotonic() < deadline:  # the probe, once a second
        s.engine.run_once(0.05)
    assert s.store.failed is None
    commit(s)


def test_a_commit_whose_write_fails_puts_back_what_it_accepted_and_takes_off_what_it_sent(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    s = journaled(tmp_path)
    assert s.store is not None
    qin, _ = s.wiring.declare_queue("in", {"durable": True})
    out, _ = s.wiring.declare_queue("out", {"durable": True})
    w, x = qin.enqueue(b"W", durable=True), qin.enqueue(b"X", durable=True)
    commit(s)
    live = s.store.live(s.store.journal.segment)
    assert qin.acquire_next() is w and qin.acquire_next() is x
    txn = _txn(s)
    txn.messages.append(("out", bytes(Message(body="Y", durable=True).encode())))
    txn.messages.append(("out", bytes(Message(body="V").encode())))  # not durable: nothing of it on disk
    txn.taken.append(Taken(None, qin, x, ACCEPTED))  # type: ignore[arg-type]
    answer = _answer(s)
    s.transactions.commit(txn, answer)
    assert x.position not in qin.entries and out.depth == 2  # applied, in memory
    _fail_write(s, monkeypatch)
    back = qin.entries[x.position]
    assert (back.data, back.state, back.count, bool(back.flags & REDELIVERED)) == (b"X", AVAILABLE, 1, True)
    assert qin.entries[w.position] is w and w.state == ACQUIRED  # another consumer's, untouched
    assert out.depth == 0 and out.bytes == 0  # none of its messages stays, the non-durable one neither
    assert answer.error is not None and answer.error[0] == "amqp:transaction:rollback"
    assert "simulated EIO" in answer.error[1]
    assert (s.transactions.committed, s.transactions.rolled_back) == (0, 1)
    assert qin.acquire_next() is back  # a consumer gets it again (before the later W is released)
    assert s.store.live(s.store.journal.segment) >= live  # its record counts as live again
    _until_writable(s)
    close(s)
    image, _, _, _ = read_journal(tmp_path / "journal")
    (qid,) = [q for q, d in image.queues.items() if d["name"] == "in"]
    (oid,) = [q for q, d in image.queues.items() if d["name"] == "out"]
    got = {e.data: e.count for e in image.messages[qid].values()}
    assert got == {b"W": 0, b"X": 1} and not image.messages.get(oid)  # after a restart: as the client was told


def test_a_rejected_message_comes_back_and_its_dead_letter_goes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    s = journaled(tmp_path)
    s.wiring.declare_exchange("dlx", "fanout", {"durable": True})
    dead, _ = s.wiring.declare_queue("dead", {"durable": True})
    s.wiring.bind("dlx", "dead", "")
    qin, _ = s.wiring.declare_queue("in", {"durable": True, "alternate-exchange": "dlx"})
    x = qin.enqueue(bytes(Message(body="X", durable=True).encode()), durable=True)
    commit(s)
    assert qin.acquire_next() is x
    txn = _txn(s)
    txn.taken.append(Taken(None, qin, x, REJECTED))  # type: ignore[arg-type]
    answer = _answer(s)
    routed, _, _ = s.transactions.commit(txn, answer)
    assert dead.depth == 1  # dead-lettered, in memory
    assert [q for q, _ in routed] == [dead]  # held as the commit's own messages are (journal, backups, unit)
    _fail_write(s, monkeypatch)
    assert dead.depth == 0 and qin.entries[x.position].count == 1
    assert answer.error is not None and answer.error[0] == "amqp:transaction:rollback"
    _until_writable(s)
    close(s)
    image, _, _, _ = read_journal(tmp_path / "journal")
    (did,) = [q for q, d in image.queues.items() if d["name"] == "dead"]
    assert not image.messages.get(did)


def test_a_commit_with_nothing_on_disk_stands_when_its_pass_write_fails(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its unit was empty (a queue that is not durable): the failed write lost nothing of it, so it stands."""
    s = journaled(tmp_path)
    plain, _ = s.wiring.declare_queue("plain", {})
    kept, _ = s.wiring.declare_queue("kept", {"durable": True})
    x = plain.enqueue(b"X")
    commit(s)
    assert plain.acquire_next() is x
    txn = _txn(s)
    txn.taken.append(Taken(None, plain, x, ACCEPTED))  # type: ignore[arg-type]
    answer = _answer(s)
    s.transactions.commit(txn, answer)
    kept.enqueue(b"K", durable=True)  # something else of the pass is journaled: its write fails
    _fail_write(s, monkeypatch)
    assert plain.depth == 0 and answer.error is None and s.transactions.committed == 1
    _until_writable(s)
    close(s)


def test_the_last_commit_is_undone_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A second commit of the pass accepted the message the first one sent: undone in reverse order, the message
    is released by the second and then taken off its queue by the first, not left behind."""
    s = journaled(tmp_path)
    q, _ = s.wiring.declare_queue("q", {"durable": True})
    commit(s)
    first = _txn(s)
    first.messages.append(("q", bytes(Message(body="M", durable=True).encode())))
    a1 = _answer(s)
    s.transactions.commit(first, a1)
    m = q.acquire_next()
    assert m is not None
    second = _txn(s)
    second.taken.append(Taken(None, q, m, ACCEPTED))  # type: ignore[arg-type]
    a2 = _answer(s)
    s.transactions.commit(second, a2)
    _fail_write(s, monkeypatch)
    assert q.depth == 0 and q.entries == {}
    assert a1.error is not None and a2.error is not None
    _until_writable(s)
    close(s)


@pytest.mark.parametrize("where", ["front", "middle", "extra"])
def test_a_reinstated_message_is_back_at_its_place(where: str) -> None:
    """Wherever the dequeue left it (trimmed off the front of the queue's order, dead in the middle, or out of the
    extra list of out-of-order entries), released it is delivered in position order again."""
    q = Queue("q", {}, QueueOptions())
    if where == "extra":
        for pos in (1, 3):
            q.enqueue_replica(pos, f"m{pos}".encode(), 0, 0, 0, None)
        q.enqueue_replica(2, b"m2", 0, 0, 0, None)  # below the back: the extra list
        target = 2
    else:
        for _ in range(3):
            q.enqueue(b"m")
        target = 1 if where == "front" else 2
    e = q.entries[target]
    taken = [q.acquire_next() for _ in range(3)]
    assert e in taken
    data = e.data
    q.dequeue(e, DequeueReason.ACCEPTED)
    assert q.depth == 2 and q.reinstate(e, data) and q.depth == 3 and e.state == ACQUIRED
    assert not q.reinstate(e, data)  # once
    seen, cursor = [], 0
    while (b := q.browse_after(cursor, include_acquired=True)) is not None:
        seen.append(b.position)
        cursor = b.position
    assert seen == [1, 2, 3]  # a browser walks it in order
    for t in taken:
        q.release(t)
    assert [x.position for x in iter(q.acquire_next, None)] == [1, 2, 3]
    assert q.bytes == sum(len(x.data) for x in q.entries.values())


@pytest.mark.parametrize("order", [(1, 2), (2, 1)])
def test_two_messages_taken_off_the_front_come_back_in_order(order: tuple[int, int]) -> None:
    """A commit that accepted the first two messages (in either order): both were trimmed off the front of the
    queue's order; put back, the second must not land before the first (browsers and the backups' catch-up plan
    read the queue's positions in that order)."""
    q = Queue("q", {}, QueueOptions())
    for _ in range(4):
        q.enqueue(b"m")
    taken = {e.position: e for e in (q.acquire_next(), q.acquire_next()) if e is not None}
    data = {p: e.data for p, e in taken.items()}
    for p in order:
        q.dequeue(taken[p], DequeueReason.ACCEPTED)
    for p in order:
        assert q.reinstate(taken[p], data[p])
    seen, cursor = [], 0
    while (b := q.browse_after(cursor, include_acquired=True)) is not None:
        seen.append(b.position)
        cursor = b.position
    assert seen == [1, 2, 3, 4] and q.position_ranges() == [(1, 4)]


def test_a_message_the_commit_pushed_out_of_a_ring_queue_comes_back(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    s = journaled(tmp_path)
    ring, _ = s.wiring.declare_queue("ring", {"durable": True, "max-count": 1, "limit-policy": "ring"})
    a = ring.enqueue(b"A", durable=True)
    commit(s)
    txn = _txn(s)
    txn.messages.append(("ring", bytes(Message(body="B", durable=True).encode())))
    txn.messages.append(("ring", bytes(Message(body="C", durable=True).encode())))  # pushes out B, its own
    s.transactions.commit(txn, _answer(s))
    assert a.position not in ring.entries and ring.depth == 1
    _fail_write(s, monkeypatch)
    assert list(ring.entries.values()) == [a] and a.state == AVAILABLE and a.data == b"A"
    assert ring.acquire_next() is a
    _until_writable(s)
    close(s)
    image, _, _, _ = read_journal(tmp_path / "journal")
    (qid,) = [q for q, d in image.queues.items() if d["name"] == "ring"]
    assert [e.data for e in image.messages[qid].values()] == [b"A"]


def test_a_message_the_commit_replaced_on_a_last_value_queue_comes_back(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    s = journaled(tmp_path)
    lvq, _ = s.wiring.declare_queue("last", {"durable": True, "lvq-key": "k"})
    old = bytes(Message(body="A", durable=True, properties={"k": "x"}).encode())
    s.router.enqueue_committed("last", old)
    commit(s)
    (a,) = lvq.entries.values()
    txn = _txn(s)
    txn.messages.append(("last", bytes(Message(body="B", durable=True, properties={"k": "x"}).encode())))
    s.transactions.commit(txn, _answer(s))
    assert a.position not in lvq.entries
    _fail_write(s, monkeypatch)
    assert list(lvq.entries.values()) == [a] and a.state == AVAILABLE
    s.router.enqueue_committed("last", bytes(Message(body="C", durable=True, properties={"k": "x"}).encode()))
    assert [e.data for e in lvq.entries.values()] != [old] and lvq.depth == 1  # its key is its again: replaced
    _until_writable(s)
    close(s)


def test_a_commit_a_limit_refuses_halfway_leaves_nothing_applied(tmp_path: Path) -> None:
    """`_check` counts room for limited queues, not for a ring whose messages are all acquired (it can push none
    out): the commit raised in the middle, its first message stayed queued and its journal unit open (the rest of
    the pass's records fell into it), while its client was told it had been rolled back."""
    s = journaled(tmp_path)
    assert s.store is not None
    a, _ = s.wiring.declare_queue("a", {"durable": True})
    ring, _ = s.wiring.declare_queue("ring", {"durable": True, "max-count": 1, "limit-policy": "ring"})
    held = ring.enqueue(b"H", durable=True)
    commit(s)
    assert ring.acquire_next() is held  # a consumer holds the ring's only message: it cannot be pushed out
    txn = _txn(s)
    txn.messages.append(("a", bytes(Message(body="first", durable=True).encode())))
    txn.messages.append(("ring", bytes(Message(body="second", durable=True).encode())))
    with pytest.raises(MessageRefused):
        s.transactions.commit(txn)
    assert a.depth == 0 and list(ring.entries.values()) == [held]
    assert all(end is not None for _, end in s.store.journal.units)  # the unit is closed
    late, _ = s.wiring.declare_queue("late", {"durable": True})
    late.enqueue(b"L", durable=True)  # the pass goes on
    commit(s)
    close(s)
    image, _, _, _ = read_journal(tmp_path / "journal")
    names = {q: d["name"] for q, d in image.queues.items()}
    assert {names[q]: [e.data for e in m.values()] for q, m in image.messages.items() if m} == {
        "ring": [b"H"], "late": [b"L"]}


def test_a_dead_letter_a_full_ring_cannot_take_is_dropped_and_the_commit_stands(tmp_path: Path) -> None:
    """A ring dead-letter queue whose messages are all acquired has no room for the copy: it is dropped, as for
    any full dead-letter queue (it raised in the middle of the commit, after its accepts had been applied: the
    client was told it was rolled back and the messages were gone)."""
    s = journaled(tmp_path)
    s.wiring.declare_exchange("dlx", "fanout", {"durable": True})
    dead, _ = s.wiring.declare_queue("dead", {"durable": True, "max-count": 1, "limit-policy": "ring"})
    s.wiring.bind("dlx", "dead", "")
    qin, _ = s.wiring.declare_queue("in", {"durable": True, "alternate-exchange": "dlx"})
    held = dead.enqueue(b"H", durable=True)
    w = qin.enqueue(b"W", durable=True)
    x = qin.enqueue(bytes(Message(body="X", durable=True).encode()), durable=True)
    commit(s)
    assert dead.acquire_next() is held and qin.acquire_next() is w and qin.acquire_next() is x
    txn = _txn(s)
    txn.taken += [Taken(None, qin, w, ACCEPTED), Taken(None, qin, x, REJECTED)]  # type: ignore[arg-type]
    routed, dequeued, _ = s.transactions.commit(txn)
    assert routed == [] and dequeued == [qin] and qin.depth == 0 and list(dead.entries.values()) == [held]
    commit(s)
    close(s)


def test_a_failed_commit_leaves_the_windows_the_dead_letter_did_not_enter(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A dead letter enters no duplicate window: taking it back must not make a window forget the id that the
    message's own publish put there (its resend would then be taken twice)."""
    s = journaled(tmp_path)
    s.wiring.declare_exchange("events", "fanout", {"durable": True})
    qin, _ = s.wiring.declare_queue("in", {"durable": True, "alternate-exchange": "events"})
    audit, _ = s.wiring.declare_queue("audit", {"durable": True, "duplicate-window": 100})
    for q in ("in", "audit"):
        s.wiring.bind("events", q, "")
    data = bytes(Message(id="X", body="X", durable=True).encode())
    s.router.enqueue_committed("events", data)  # published to both: its id in audit's window
    commit(s)
    assert audit.dedup is not None and audit.dedup.seen(b"SX", time.time())
    x = qin.acquire_next()
    assert x is not None
    txn = _txn(s)
    txn.taken.append(Taken(None, qin, x, REJECTED))  # type: ignore[arg-type]
    answer = _answer(s)
    routed, _, _ = s.transactions.commit(txn, answer)
    assert s.store is not None and s.store.hold(answer, routed)  # (as the discharge holds it)
    answer.pending += 1
    _fail_write(s, monkeypatch)
    assert audit.dedup.seen(b"SX", time.time()) and audit.depth == 1 and qin.entries[x.position] is x
    _until_writable(s)
    close(s)


def test_a_message_a_later_queue_refuses_is_taken_off_the_queues_that_took_it(tmp_path: Path) -> None:
    """An exchange routes the commit's message to a queue with a duplicate window, then to a ring that cannot take
    it: the first queue must not keep it (nor its id: the client's retry would be dropped as a duplicate)."""
    s = journaled(tmp_path)
    s.wiring.declare_exchange("fan", "fanout", {"durable": True})
    a, _ = s.wiring.declare_queue("a", {"durable": True, "duplicate-window": 100})
    ring, _ = s.wiring.declare_queue("ring", {"durable": True, "max-count": 1, "limit-policy": "ring"})
    for q in ("a", "ring"):
        s.wiring.bind("fan", q, "")
    held = ring.enqueue(b"H", durable=True)
    commit(s)
    assert ring.acquire_next() is held
    txn = _txn(s)
    txn.messages.append(("fan", bytes(Message(id="M", body="M", durable=True).encode())))
    with pytest.raises(MessageRefused):
        s.transactions.commit(txn)
    assert a.depth == 0 and a.dedup is not None and not a.dedup.seen(b"SM", time.time())
    commit(s)
    close(s)
    image, _, _, _ = read_journal(tmp_path / "journal")
    (aid,) = [q for q, d in image.queues.items() if d["name"] == "a"]
    assert not image.messages.get(aid)


def test_without_a_journal_a_commit_refused_halfway_is_rolled_back(tmp_path: Path) -> None:
    s = Server(BrokerConfig(port=0), "unit")
    qin, _ = s.wiring.declare_queue("in", {})
    ring, _ = s.wiring.declare_queue("ring", {"max-count": 1, "limit-policy": "ring"})
    first, _ = s.wiring.declare_queue("first", {})
    held, w = ring.enqueue(b"H"), qin.enqueue(b"W")
    assert ring.acquire_next() is held and qin.acquire_next() is w
    txn = _txn(s)
    txn.messages += [("first", bytes(Message(body="1").encode())), ("ring", bytes(Message(body="2").encode()))]
    txn.taken.append(Taken(None, qin, w, ACCEPTED))  # type: ignore[arg-type]
    with pytest.raises(MessageRefused):
        s.transactions.commit(txn)
    assert first.depth == 0 and qin.entries[w.position] is w and w.state == ACQUIRED
    s.transactions.rollback(txn, "commit_failed")  # what the discharge does next
    assert w.state == AVAILABLE and w.count == 1


def test_a_ring_that_cannot_make_room_pushes_nothing_out() -> None:
    """Only available messages can be pushed out of a ring: when even all of them would not make room, none is
    (they were, and the new message refused anyway: lost for nothing)."""
    q = Queue("ring", {}, QueueOptions.from_arguments({"max-size": 100, "limit-policy": "ring"}))
    a, b = q.enqueue(b"a" * 30), q.enqueue(b"b" * 60)
    assert q.acquire_next() is a and q.acquire_next() is b
    q.release(a)  # available again: 30 bytes that could go, 60 that cannot
    with pytest.raises(QueueFull):
        q.enqueue(b"c" * 46)
    assert q.entries == {a.position: a, b.position: b} and q.stats.ring_evicted == 0
    q.enqueue(b"d" * 40)  # pushing a out is enough for this one
    assert [e.data[:1] for e in q.entries.values()] == [b"b", b"d"] and q.stats.ring_evicted == 1


def test_a_message_one_queue_refuses_changes_none_of_its_queues(tmp_path: Path) -> None:
    """Routed to a ring that pushes out its oldest, a last-value queue that replaces its value and a ring that
    cannot make room (its message acquired): refused, it must leave the first two as they were (they lost the
    oldest message and the value for a message nobody kept, on the backups and on disk too)."""
    s = journaled(tmp_path)
    s.wiring.declare_exchange("fan", "fanout", {"durable": True})
    aring, _ = s.wiring.declare_queue("aring", {"durable": True, "max-count": 2, "limit-policy": "ring"})
    lv, _ = s.wiring.declare_queue("lv", {"durable": True, "lvq-key": "k"})
    ring, _ = s.wiring.declare_queue("ring", {"durable": True, "max-count": 1, "limit-policy": "ring"})
    for q in ("aring", "lv", "ring"):
        s.wiring.bind("fan", q, "")

    def publish(body: str) -> None:
        s.router.enqueue_committed("fan", bytes(Message(body=body, durable=True, properties={"k": "x"}).encode()))

    publish("v1")
    publish("v2")
    assert ring.acquire_next() is not None  # v2, held by a consumer: the ring cannot take v3
    before = {q.name: _texts(q) for q in (aring, lv, ring)}
    with pytest.raises(QueueFull, match="only available messages"):
        publish("v3")
    assert {q.name: _texts(q) for q in (aring, lv, ring)} == before == {
        "aring": ["v1", "v2"], "lv": ["v2"], "ring": ["v2"]}
    assert aring.stats.ring_evicted == 0  # nothing pushed out for it
    commit(s)
    close(s)


def _texts(q: Queue) -> list[str]:
    """The bodies of the AMQP messages on `q`, in position order."""
    out = []
    for e in sorted(q.entries.values(), key=lambda e: e.position):
        m = Message()
        m.decode(e.data)
        out.append(str(m.body))
    return out


def _window_queue(s: Server) -> tuple[Queue, Entry, Entry]:
    """A durable queue with a duplicate window holding a durable message "d" and one that is not durable, "v" (their
    ids taken as the router takes them), both acquired by a consumer."""
    from broker.dedup import key
    from broker.queue import WINDOWED

    q, _ = s.wiring.declare_queue("in", {"durable": True, "duplicate-window": 10})
    assert q.dedup is not None
    d = q.enqueue(bytes(Message(id="d", body="D", durable=True).encode()), durable=True)
    v = q.enqueue(bytes(Message(id="v", body="V").encode()))
    for e, k in ((d, key("d")), (v, key("v"))):
        assert k is not None
        q.dedup.add(k, time.time(), 0 if e is d else e.position)
        e.flags |= WINDOWED
    commit(s)
    assert q.acquire_next() is d and q.acquire_next() is v
    return q, d, v


def _window_after_restart(s: Server, tmp_path: Path) -> list[bytes]:
    _until_writable(s)  # (the probe writes every window whole)
    close(s)
    image, _, _, _ = read_journal(tmp_path / "journal")
    (qid,) = [n for n, doc in image.queues.items() if doc["name"] == "in"]
    return [k for k, _ in image.window(qid) or []]


def test_a_not_durable_message_put_back_keeps_its_id_out_of_the_journal(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The id of a message that is not durable is journaled once the message leaves its queue (a resend of a
    delivered message must still be dropped after a restart). A commit that accepted it and was undone puts it
    back: its id is left out again, or after a restart (the message gone with it) the resend would be dropped."""
    s = journaled(tmp_path)
    q, d, v = _window_queue(s)
    assert q.dedup is not None
    txn = _txn(s)
    txn.taken += [Taken(None, q, d, ACCEPTED), Taken(None, q, v, ACCEPTED)]  # type: ignore[arg-type]
    s.transactions.commit(txn, _answer(s))
    assert v.position not in q.entries and not q.dedup.volatile  # consumed: its id is kept from now on
    _fail_write(s, monkeypatch)
    assert q.entries[v.position].data == v.data and set(q.dedup.volatile) == {b"Sv"}  # back, and so is the mark
    assert _window_after_restart(s, tmp_path) == [b"Sd"]


def test_the_id_of_a_consumed_message_is_journaled_though_the_write_of_its_pass_failed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A commit that journals nothing (it accepted a message that is not durable) stands when its pass's write
    fails; the id that write held goes with the window the probe writes whole."""
    s = journaled(tmp_path)
    q, _, v = _window_queue(s)
    txn = _txn(s)
    txn.taken.append(Taken(None, q, v, ACCEPTED))  # type: ignore[arg-type]
    s.transactions.commit(txn, _answer(s))
    _fail_write(s, monkeypatch)
    assert v.position not in q.entries  # consumed for good
    assert _window_after_restart(s, tmp_path) == [b"Sd", b"Sv"]


def test_ids_of_a_failed_write_are_written_again_after_a_roll_over_that_failed_too(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The probe that finds the journal writable may start a new segment first; when that roll-over's checkpoint
    fails too, the ids its windows held (and those of the failed write before it) are written with the next write,
    not lost with the checkpoint."""
    s = journaled(tmp_path)
    assert s.store is not None
    q, _, v = _window_queue(s)
    txn = _txn(s)
    txn.taken.append(Taken(None, q, v, ACCEPTED))  # type: ignore[arg-type]
    s.transactions.commit(txn, _answer(s))
    _fail_write(s, monkeypatch)  # the settled id's write fails
    real = J._write_all

    def enospc(fd: int, data: bytes, size_before: int) -> None:  # room for a segment's header, not a checkpoint
        if len(data) > R.HEADER.size:
            raise R.JournalError("journal: simulated ENOSPC")
        real(fd, data, size_before)

    monkeypatch.setattr(J, "_write_all", enospc)
    monkeypatch.setattr(s.store.journal, "full", lambda: True)
    s.store._retry()  # the probe's roll-over: its checkpoint fails as well
    monkeypatch.setattr(J, "_write_all", real)
    monkeypatch.undo()
    assert s.store.failed is not None
    assert _window_after_restart(s, tmp_path) == [b"Sd", b"Sv"]
