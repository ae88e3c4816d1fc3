"""Local transactions (AMQP 1.0 part 4): the coordinator link, declare and discharge, transactional transfers and
consumer outcomes.

A client attaches a link whose target is a *coordinator* and sends it control messages: `declare` (answered with
`declared` carrying a new txn-id) and `discharge` (`fail` false: commit, true: roll back; answered `accepted`, or
rejected with `amqp:transaction:unknown-id` / `amqp:transaction:rollback`). Under a declared transaction:

- a transfer whose delivery state is `transactional-state(txn-id)` is checked (it must name a queue or exchange
  that exists) and answered at once with `transactional-state(txn-id, accepted)`; the message is *held* in the
  transaction, invisible to consumers;
- a consumer's outcome wrapped in `transactional-state(txn-id, outcome)` keeps the message acquired and settles the
  delivery; `accepted` and `rejected` are applied at commit; `released` and `modified` are applied at once (a roll
  back would release the message anyway).

Commit applies everything in one go, on the event loop, in one pass: the held messages are routed and enqueued in
the order they were sent, then the accepted messages are dequeued. Before anything is applied every held message's
route and room is checked (queue limits counted for the whole transaction, the journal and --max-memory
refusals): a commit is applied whole or refused whole (`amqp:transaction:rollback`, and the transaction is rolled
back). The discharge is then held like one client transfer that routed to all of the transaction's messages: it is
settled once the durable store has journaled the durable ones and every ready backup has acknowledged them
(broker.extension `hold`), and like a consumer's accept (receiver-settle-mode second) on each queue whose messages
its accepts and rejects dequeued: once every backup receiving that queue's dequeues acknowledged them
(broker.extension `hold_accept`). A commit the client saw settle survives a failover: its messages are there and
the messages it accepted are gone.

Roll back (asked, or the coordinator link, its session or connection ended with the transaction open) drops the
held messages and releases the messages it had taken, as a failed delivery (delivery-count + 1, redelivered).

Not the hot path: transactional transfers go through proton's Python wrappers (a few tens of microseconds each).
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from proton import Delivery, Described, Message, ulong

from broker.delivery_limit import dead_letter_if_over
from broker.engine import raw
from broker.errors import JournalRefusal, MemoryRefusal, MessageRefused, NoRoute, QueueFull
from broker.links import Completion, ConsumerLink, PublisherLink
from broker.log import get_logger
from broker.message import current_key, current_subject, current_to, decode
from broker.queue import ACQUIRED, DequeueReason, Entry, Queue, record_evictions, take_back

if TYPE_CHECKING:
    from broker.connections import ConnectionState
    from broker.server import Server

log = get_logger("broker")

# Descriptors of AMQP 1.0 part 4 (transactions) and the outcomes of part 3.
DECLARE = 0x31
DISCHARGE = 0x32
DECLARED = 0x33
TRANSACTIONAL_STATE = 0x34
ACCEPTED = 0x24
HELD_COST = 120  # bytes of memory a held message takes besides its encoding (its bytes object, tuple, list slot)
REJECTED = 0x25
RELEASED = 0x26
MODIFIED = 0x27
_NAMES = {"amqp:declare:list": DECLARE, "amqp:discharge:list": DISCHARGE, "amqp:accepted:list": ACCEPTED,
          "amqp:rejected:list": REJECTED, "amqp:released:list": RELEASED, "amqp:modified:list": MODIFIED}

UNKNOWN_ID = "amqp:transaction:unknown-id"
ROLLBACK = "amqp:transaction:rollback"

_serial = itertools.count(1)
_prefix = os.urandom(4)


def _code(descriptor: Any) -> int | None:
    """A described value's descriptor as its numeric code (by number or by symbolic name)."""
    if isinstance(descriptor, int):
        return int(descriptor)
    if isinstance(descriptor, str):
        return _NAMES.get(str(descriptor))
    return None


def _txn_id(value: Any) -> bytes | None:
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    return None


@dataclass(eq=False, slots=True)
class _Applied:
    """What a commit applied, for its undo: where its messages and its rejects' dead letters went, the messages
    they pushed out (with their data), and the messages its accepts and rejects dequeued (with their data)."""

    routed: list[tuple[Queue, Entry]] = field(default_factory=list)
    copies: list[tuple[Queue, Entry]] = field(default_factory=list)
    evicted: list[tuple[Queue, Entry, bytes]] = field(default_factory=list)
    gone: list[tuple[Queue, Entry, bytes]] = field(default_factory=list)


def _nothing(_: str) -> None:
    """The undo of a commit already undone."""


@dataclass(eq=False)
class Taken:
    """A consumer's outcome on a message, under a transaction: applied at commit, released at roll back."""

    consumer: ConsumerLink
    queue: Queue
    entry: Entry
    outcome: int  # ACCEPTED or REJECTED


@dataclass(eq=False)
class Transaction:
    id: bytes
    coordinator: CoordinatorLink
    messages: list[tuple[str, bytes]] = field(default_factory=list)  # (address, encoded message), in send order
    taken: list[Taken] = field(default_factory=list)
    held: int = 0  # memory its held messages take (`HELD_COST` each besides the message), counted by --max-memory

    @property
    def conn(self) -> ConnectionState:
        return self.coordinator.conn


class Transactions:
    """Every open transaction of the broker, by txn-id. A txn-id is only valid on the connection that declared it."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.open: dict[bytes, Transaction] = {}
        self.held = 0  # bytes the held messages of every open transaction take (broker.memory counts them)
        self.committed = 0
        self.rolled_back = 0

    def declare(self, coordinator: CoordinatorLink) -> Transaction:
        txn = Transaction(_prefix + next(_serial).to_bytes(8, "big"), coordinator)
        self.open[txn.id] = txn
        coordinator.txns[txn.id] = txn
        return txn

    def find(self, value: Any, conn: ConnectionState) -> Transaction | None:
        tid = _txn_id(value)
        txn = self.open.get(tid) if tid is not None else None
        return txn if txn is not None and txn.conn is conn else None

    def _end(self, txn: Transaction) -> None:
        if self.open.pop(txn.id, None) is not None:
            self.held -= txn.held
        txn.coordinator.txns.pop(txn.id, None)

    # ----- under a transaction -------------------------------------------------------------------------------------
    def transfer(self, pub: PublisherLink, d: Any, data: bytes) -> None:
        """A complete transfer whose delivery state is transactional: hold it in its transaction, answer it."""
        delivery = Delivery.wrap(d)
        state = delivery.remote.data or []
        txn = self.find(state[0] if state else None, pub.conn)
        if txn is None:
            pub.unsettled += 1  # refuse() counts it down
            pub.refuse(d, UNKNOWN_ID, "the transfer names a transaction that is not open on this connection")
            return
        try:
            decode(data)
            address = pub.address or current_to()
            if not address:
                raise NoRoute("amqp:precondition-failed", "anonymous relay needs a 'to' address on each message")
            if pub.address is None and self.server.access.acl is not None:
                self.server.access.relay(pub, address)  # as a plain relay transfer (broker.router)
            self._targets(address)
            memory = self.server.memory
            if memory is not None and memory.over:  # held in memory until the commit, durable or not
                memory.refused += 1
                raise MemoryRefusal(f"not taken: memory is over --max-memory ({memory.limit} bytes), and a "
                                    f"transaction holds its messages in memory until its commit")
        except MessageRefused as e:
            pub.unsettled += 1
            pub.refuse(d, e.condition, e.description)
            return
        txn.messages.append((address, data))
        size = len(data) + HELD_COST
        txn.held += size
        self.held += size
        if not delivery.settled:
            delivery.local.data = [txn.id, Described(ulong(ACCEPTED), [])]
            delivery.update(TRANSACTIONAL_STATE)
        delivery.settle()
        self.server.wake(pub)  # credit

    def outcome(self, consumer: ConsumerLink, d: Any, entry: Entry) -> bool:
        """A consumer's transactional outcome for `entry` (still in its unacked map). Returns True when the
        transaction took it (the caller forgets the delivery), False to leave it as it is."""
        delivery = Delivery.wrap(d)
        state = delivery.remote.data or []
        txn = self.find(state[0] if state else None, consumer.conn)
        if txn is None:
            self.server.close_link(consumer.link, UNKNOWN_ID,
                                   "a disposition names a transaction that is not open on this connection")
            return False
        outcome = state[1] if len(state) > 1 else None
        if not isinstance(outcome, Described):  # transactional acquisition without an outcome yet: wait for it
            return False
        code = _code(outcome.descriptor)
        if code is None:
            self.server.close_link(consumer.link, "amqp:decode-error", f"unknown outcome {outcome.descriptor!r}")
            return False
        q = consumer.queue
        raw.delivery_settle(d)
        if code in (ACCEPTED, REJECTED):
            txn.taken.append(Taken(consumer, q, entry, code))
            return True
        if code == MODIFIED:
            fields = outcome.value if isinstance(outcome.value, list) else []
            failed = bool(fields[0]) if fields else False
            if not (failed and dead_letter_if_over(self.server, q, entry)):
                q.release(entry, delivery_failed=failed, redelivered=failed)
        else:
            q.release(entry, delivery_failed=False, redelivered=False)
        self.server.wake_queue(q)
        return True

    # ----- discharge -------------------------------------------------------------------------------------------------
    def discharge(self, coordinator: CoordinatorLink, d: Any, fields: list[Any]) -> None:
        txn = self.find(fields[0] if fields else None, coordinator.conn)
        if txn is None:
            coordinator.refuse(d, UNKNOWN_ID, "no open transaction with this id on this connection")
            return
        if len(fields) > 1 and fields[1]:
            self.rollback(txn, "discharge")
            coordinator.settle(d)
            self.server.wake(coordinator)
            return
        c = Completion(coordinator, d)
        try:
            routed, dequeued, windowed = self.commit(txn, c)
        except MessageRefused as e:
            self.rollback(txn, "commit_failed")
            log.warning("transaction.commit_failed", connection=txn.conn.id, condition=e.condition,
                        description=e.description)
            coordinator.refuse(d, ROLLBACK, f"the transaction was rolled back: {e.description}")
            return
        touched = list(dict.fromkeys([*(q for q, _ in routed), *dequeued]))
        for ext in self.server.extensions:
            ext.committed(touched)
        if routed or windowed:  # (a retry whose messages the windows all dropped: a recovering primary holds it)
            self.server.router.hold_groups_of(q for q, _ in routed)  # this pass's earlier deliveries first
            for ext in self.server.extensions:
                if ext.hold(c, routed):
                    c.pending += 1
        for q in dequeued:  # and like a consumer's accept on each queue whose messages it dequeued
            c.pending += 1
            if not self.server.hold_accept(c, q):
                c.pending -= 1
        for went, dropped in windowed:  # a retry is answered after the commit it repeats, as a resend would be
            self.server.router.follow(c, went, dropped)
        c.release()

    def commit(self, txn: Transaction, answer: Completion | None = None
               ) -> tuple[list[tuple[Queue, Entry]], list[Queue], list[tuple[Any, Any]]]:
        """Apply the transaction whole (raises MessageRefused, having applied nothing). Returns where its messages
        (and its rejects' dead letters: the discharge is answered once they are held as its messages are, and they
        are part of its unit on the backups) were enqueued, the queues whose messages its accepts and rejects
        dequeued, and for each windowed message where it went and what its windows dropped (`Router.follow`).
        Should the journal fail to write it, it is undone at the end of the pass and `answer` (the discharge)
        refused (`_undo`)."""
        self._check(txn)
        self._end(txn)
        store = self.server.store
        if store is not None:  # on disk, all of what follows until `end_unit` or none of it
            store.begin_unit()
        router = self.server.router
        done = _Applied()
        windowed: list[tuple[Any, Any]] = []
        dequeued: dict[Queue, None] = {}  # in order, once each
        record_evictions(done.evicted)
        try:
            for address, data in txn.messages:
                went, dropped = router.enqueue_committed(address, data)
                done.routed += went
                if dropped is not None:
                    windowed.append((went, dropped))
            for t in txn.taken:
                q, e = t.queue, t.entry
                if q.entries.get(e.position) is not e or e.state != ACQUIRED:
                    continue  # the queue was purged or deleted meanwhile
                dequeued[q] = None
                data = e.data
                done.gone.append((q, e, data))
                if t.outcome == ACCEPTED:
                    q.dequeue(e, DequeueReason.ACCEPTED)
                else:
                    q.dequeue(e, DequeueReason.REJECTED)
                    done.copies += self.server.dead_letter(q, data)
        except MessageRefused:
            # A limit `_check` does not foresee (a last-value queue or a ring whose messages are all acquired
            # refusing one more): what was applied goes, and the caller's roll back releases what it had taken.
            record_evictions(None)
            self._take_back(done)
            if store is not None:
                store.end_unit(_nothing)  # (the unit holds its enqueues and their dequeues: nothing stands)
            raise
        finally:
            record_evictions(None)
        if store is not None:
            store.end_unit(lambda why: self._undo(txn, answer, done, why))
        self.committed += 1
        log.debug("transaction.committed", connection=txn.conn.id, messages=len(txn.messages), count=len(txn.taken))
        return [*done.routed, *done.copies], list(dequeued), windowed

    def _take_back(self, done: _Applied) -> None:
        """Undo in memory what a commit applied (nothing of it was seen outside this pass: it is not answered, and
        the backups are sent the pass's changes at its end): its messages and its rejects' dead letters are taken
        off their queues (as the store takes back refused deliveries: one a consumer took in this pass stays with
        it); the messages they pushed out of ring queues or replaced on last-value queues are back; what its
        accepts and rejects dequeued is back at its place, acquired (`Queue.reinstate`)."""
        take_back(done.routed)
        take_back(done.copies)
        own = {id(e) for _, e in done.routed} | {id(e) for _, e in done.copies}
        for q, e, data in reversed(done.evicted):
            if id(e) not in own:  # (not one of its own: a ring it filled pushes out its first ones too)
                q.reinstate(e, data, acquired=False)
                self.server.wake_queue(q)
        for q, e, data in done.gone:
            q.reinstate(e, data)

    def _undo(self, txn: Transaction, answer: Completion | None, done: _Applied, why: str) -> None:
        """The pass's journal write failed, and with it the commit's unit (broker.store calls this before anything
        waiting for that write is answered, and before the backups are sent the pass's changes): the commit is
        refused whole in memory too, as on disk (`_take_back`); what it had taken is released as a roll back
        releases it, and the discharge refused. (Applied in memory, the accepts stood while the consumer was told
        the commit had failed: the messages were gone until a restart brought them back, and gone for good from
        a backup promoted next.)"""
        self._take_back(done)
        released = self._release((q, e) for q, e, _ in done.gone)
        if answer is not None and answer.error is None:
            answer.error = (ROLLBACK, f"the transaction was rolled back: {why}")
        self.committed -= 1
        self.rolled_back += 1
        log.info("transaction.rolled_back", connection=txn.conn.id, reason="commit_failed",
                 messages=len(txn.messages), count=released)
        log.warning("transaction.commit_failed", connection=txn.conn.id, condition="amqp:resource-limit-exceeded",
                    description=why)

    def _check(self, txn: Transaction) -> None:
        """Raise MessageRefused unless every held message can be enqueued now (room counted for all of them), and
        its accepts journaled: while the journal cannot write, one that dequeues a journaled message is rolled back
        before anything of it is applied (its write would fail, and `_undo` have to take it all back)."""
        store = self.server.store
        if store is not None and store.failed is not None and any(t.entry.seg for t in txn.taken):
            raise JournalRefusal(f"not taken: {store.failed}")
        router = self.server.router
        more: dict[Queue, list[int]] = {}
        for address, data in txn.messages:
            _, _, durable = decode(data, trusted=True)
            targets = self._targets(address)
            if self.server.refusing:
                router.check_refusing(address, targets, durable)
            size = len(data)
            for q in targets:
                n = more.setdefault(q, [0, 0])
                n[0] += 1
                n[1] += size
                o = q.options
                if o.lvq_key is not None:
                    current_key(o.lvq_key)  # a key no last-value queue can take refuses the whole transaction
                if o.ring or o.lvq_key is not None:
                    continue
                if (o.max_count is not None and q.depth + n[0] > o.max_count) or (  # paged ones count (has_room)
                        o.max_size is not None and q.all_bytes + n[1] > o.max_size):
                    raise QueueFull(f"queue {q.name} has no room for the transaction's messages "
                                    "(max-count/max-size, policy reject)")

    def _targets(self, address: str) -> list[Queue]:
        """The queues a message decoded last goes to at `address` now (NoRoute when nothing is there)."""
        wiring = self.server.wiring
        q = wiring.queues.get(address)
        if q is not None:
            return [q]
        if address in wiring.exchanges:
            return self.server.router.route_exchange(address, current_subject())
        raise NoRoute("amqp:not-found", f"no queue or exchange named {address!r}")

    def _release(self, taken: Iterable[tuple[Queue, Entry]]) -> int:
        """Release what a transaction had taken and still holds, as a failed delivery (or dead-letter it at its
        queue's delivery-limit); returns how many."""
        released = 0
        for q, e in taken:
            if q.entries.get(e.position) is not e or e.state != ACQUIRED:
                continue
            if not dead_letter_if_over(self.server, q, e):
                q.release(e, delivery_failed=True, redelivered=True)
            self.server.wake_queue(q)
            released += 1
        return released

    def rollback(self, txn: Transaction, reason: str) -> None:
        """Forget the held messages; release what the transaction had taken as a failed delivery."""
        self._end(txn)
        released = self._release((t.queue, t.entry) for t in txn.taken)
        self.rolled_back += 1
        (log.debug if reason == "discharge" else log.info)(
            "transaction.rolled_back", connection=txn.conn.id, reason=reason, messages=len(txn.messages),
            count=released)


class CoordinatorLink(PublisherLink):
    """The target of a link whose terminus is a coordinator: declare and discharge control messages. Its
    settlements (pub.settle: accepted; refuse: rejected with a condition) are those of a publisher, so a commit's
    discharge can be held like a transfer (broker.server `_settle`)."""

    def __init__(self, server: Server, link: Any, conn: ConnectionState) -> None:
        super().__init__(server, link, conn, None)
        self.txns: dict[bytes, Transaction] = {}

    def on_delivery(self, d: Any) -> None:
        if raw.delivery_partial(d):
            if raw.delivery_pending(d) > self.max_size:
                self.server.close_link(self.link, "amqp:link:message-size-exceeded", "control message too large")
            return
        data = raw.recv(self.l, raw.delivery_pending(d))
        self.unsettled += 1
        m = Message()
        try:
            m.decode(data)
        except Exception:
            self.refuse(d, "amqp:decode-error", "a coordinator takes declare and discharge messages only")
            return
        body = m.body
        code = _code(body.descriptor) if isinstance(body, Described) else None
        fields = body.value if isinstance(body, Described) and isinstance(body.value, list) else []
        txns = self.server.transactions
        if code == DECLARE:
            if fields and fields[0] is not None:
                self.refuse(d, "amqp:not-implemented", "global (distributed) transactions are not supported")
                return
            txn = txns.declare(self)
            delivery = Delivery.wrap(d)
            delivery.local.data = [txn.id]
            delivery.update(DECLARED)
            delivery.settle()
            self.unsettled -= 1
            self.server.wake(self)
        elif code == DISCHARGE:
            txns.discharge(self, d, fields)
        else:
            self.refuse(d, "amqp:decode-error", "a coordinator takes declare and discharge messages only")

    def on_detached(self) -> None:
        for txn in list(self.txns.values()):
            self.server.transactions.rollback(txn, "detached")
