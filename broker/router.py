"""Where messages go: routing a received message to its queues (and holding its settlement for the extensions),
dispatching queued messages to consumers and browsers, dead-lettering, and replies to management requests."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from proton import Message

from broker.dedup import key as id_key
from broker.engine import raw
from broker.errors import JournalRefusal, MemoryRefusal, NoRoute, QueueFull
from broker.links import Completion, PublisherLink
from broker.log import get_logger
from broker.message import current_key, current_message_id, current_subject, current_to, decode
from broker.queue import DURABLE, WINDOWED, Entry, Queue, take_back

if TYPE_CHECKING:
    from broker.connections import ConnectionState
    from broker.server import Server

log = get_logger("broker")

Dropped = tuple[bytes, list["Queue"]] | None  # a windowed message's id, and the queues whose window dropped it


class Router:
    def __init__(self, server: Server) -> None:
        self.server = server
        self.wiring = server.wiring
        self.queues = server.wiring.queues
        self.consumers = server.consumers
        self.extensions = server.extensions
        self.store = server.store
        # (queue, message-id) of windowed messages whose publisher has not been answered yet: a resend arriving
        # meanwhile is dropped by the window and answered only after the original (see `_follow`).
        self.unconfirmed: dict[tuple[str, bytes], Completion] = {}
        # This pass's client deliveries to plain queues, per queue in position order, not yet shown to the
        # extensions (`hold_groups`).
        self.groups: dict[Queue, tuple[list[Completion], list[Entry]]] = {}

    def route_exchange(self, exchange: str, subject: str | None) -> list[Queue]:
        names = self.wiring.route(exchange, subject)  # with the exchange's alternate-exchange
        qs = self.wiring.queues
        return [qs[n] for n in names if n in qs]

    def route(self, pub: PublisherLink, d: Any, data: bytes) -> None:
        """Route one received message (raises MessageRefused), then settle it or hold it for the extensions."""
        priority, expires, durable = decode(data)
        address = pub.address
        if address is None:
            address = current_to()
            if not address:
                raise NoRoute("amqp:precondition-failed", "anonymous relay needs a 'to' address on each message")
            if self.server.access.acl is not None:
                self.server.access.relay(pub, address)
        q = self.queues.get(address)
        if self.server.refusing:  # the journal cannot write, or memory is over --max-memory
            self._refuse(address, q, durable)
        if q is not None and q.plain:  # the usual case: one queue, nothing to check
            e = q.enqueue(data, priority, expires, durable)
            if q in self.consumers:
                self.server.dirty.add(q)
            if raw.delivery_settled(d):
                self._presettled(pub, d)
                return
            # The extensions see it at the end of the pass, with the rest of the pass's deliveries to `q`
            # (`hold_groups`): one call per queue and pass instead of one per message.
            g = self.groups.get(q)
            if g is None:
                g = self.groups[q] = ([], [])
            g[0].append(Completion(pub, d))
            g[1].append(e)
            return
        routed, dropped = self._route(address, q, data, priority, expires, durable)
        if raw.delivery_settled(d):
            self._presettled(pub, d)
            return
        c = Completion(pub, d)
        if (routed or dropped is not None) and self.extensions:  # a duplicate too: a recovering primary holds it
            if self.groups:
                self.hold_groups_of(t for t, _ in routed)  # keeps each queue's holds in position order
            for ext in self.extensions:
                if ext.hold(c, routed):
                    c.pending += 1
        self.follow(c, routed, dropped)
        c.release()

    def _presettled(self, pub: PublisherLink, d: Any) -> None:
        """Pre-settled by the sender: at most once, nothing to hold."""
        pub.unsettled -= 1
        raw.delivery_settle(d)
        self.server.woken.add(pub)

    def hold_groups(self) -> None:
        """Start of the end-of-pass work: hand each queue's group of this pass's client deliveries to the
        extensions (`Extension.hold_group`); a delivery no extension holds is settled in this pass."""
        groups, self.groups = self.groups, {}
        for q, (completions, entries) in groups.items():
            self._hold_group(q, completions, entries)

    def hold_groups_of(self, queues: Iterable[Queue]) -> None:
        """Hold now the groups of `queues` gathered so far in this pass: a delivery about to be held on one of them
        by another way (`Extension.hold`) must come after them, as its position does."""
        for q in queues:
            g = self.groups.pop(q, None)
            if g is not None:
                self._hold_group(q, *g)

    def _hold_group(self, q: Queue, completions: list[Completion], entries: list[Entry]) -> None:
        held = 0
        for ext in self.extensions:
            if ext.hold_group(q, completions, entries):
                held += 1
        if held > 1:
            for c in completions:
                c.pending += held - 1
        elif held == 0:  # the router's own share released (Completion.release, inlined)
            to_settle = self.server.to_settle
            for c in completions:
                c.pending -= 1
                if not c.pending:
                    to_settle.append(c)

    def _follow(self, c: Completion, routed: list[tuple[Queue, Entry]], mid: bytes, duplicates: list[Queue]) -> None:
        """A windowed message: a resend whose original is not answered yet is answered after it (were it answered
        at once, a primary dying before the backups have the original would lose both, the resend confirmed); an
        original that waits for anything is remembered until it is answered (`Server._settle` forgets it)."""
        unconfirmed = self.unconfirmed
        for q in duplicates:
            original = unconfirmed.get((q.name, mid))
            if original is not None and original is not c:  # (a commit holding the same id twice: itself)
                c.follow(original)
        if c.pending > 1:
            keys = [(q.name, mid) for q, _ in routed if q.dedup is not None]
            if keys:
                c.keys = keys if c.keys is None else c.keys + keys  # a commit's: of each of its messages
                for k in keys:
                    unconfirmed[k] = c

    def enqueue_committed(self, address: str, data: bytes) -> tuple[list[tuple[Queue, Entry]], Dropped]:
        """A committed transaction's message (broker.transactions, which checked routes and room first): where it
        went, and for a windowed one its id and the windows that dropped it (`follow` them)."""
        priority, expires, durable = decode(data, trusted=True)
        return self._route(address, self.queues.get(address), data, priority, expires, durable)

    def follow(self, c: Completion, routed: list[tuple[Queue, Entry]], dropped: Dropped) -> None:
        """`c` (its holds counted) answers a windowed message `routed` as `dropped` says: after the originals that
        are not answered yet, and remembered until it is answered itself (`_follow`)."""
        if dropped is not None:
            self._follow(c, routed, *dropped)

    def check_refusing(self, address: str, targets: list[Queue], durable: bool) -> None:
        """Raise as `route` would while the broker is refusing (journal failed, memory over the bound)."""
        self._refuse(address, targets[0] if len(targets) == 1 and targets[0].name == address else None, durable)

    def _refuse(self, address: str, q: Queue | None, durable: bool) -> None:
        """While the journal cannot write (or its disk is under --min-disk-free), a durable message for a durable
        queue is refused; while memory is over --max-memory, a message that cannot be paged to disk is (see
        broker.memory)."""
        targets = [q] if q is not None else (
            self.route_exchange(address, current_subject()) if address in self.wiring.exchanges else [])
        store = self.store
        why = store.refusing() if durable and store is not None else None
        if why is not None and any(t.options.durable for t in targets):
            raise JournalRefusal(f"not taken: {why}")
        memory = self.server.memory
        if memory is not None and memory.over:
            for t in targets:
                if not (durable and t.pageable and store is not None and store.failed is None):
                    memory.refused += 1
                    why = "the message is not durable" if not durable else f"queue {t.name} cannot page to disk"
                    raise MemoryRefusal(f"not taken: queued messages are over --max-memory ({memory.limit} bytes) "
                                        f"and {why}")

    def _route(self, address: str, q: Queue | None, data: bytes, priority: int, expires: float | None,
               durable: bool) -> tuple[list[tuple[Queue, Entry]], Dropped]:
        """Routing with checks: an exchange, duplicate windows, limits, last-value keys. Also returns, for a message
        with an id routed to a windowed queue, (id, queues whose window dropped it)."""
        if q is not None:
            targets: list[Queue] = [q]
        elif address in self.wiring.exchanges:
            targets = self.route_exchange(address, current_subject())
        else:
            raise NoRoute("amqp:not-found", f"no queue or exchange named {address!r}")
        mid: bytes | None = None
        duplicates: list[Queue] = []
        now = 0.0
        if any(t.dedup is not None for t in targets):
            mid = id_key(current_message_id())
            if mid is not None:
                now = time.time()
                fresh = [t for t in targets if t.dedup is None or not t.dedup.seen(mid, now)]
                if len(fresh) < len(targets):
                    duplicates = [t for t in targets if t not in fresh]
                    self._duplicate(mid, duplicates)
                    targets = fresh
        size = len(data)
        keys: dict[Queue, Any] = {}  # last-value keys, read (and refused) before any queue takes the message
        for q in targets:
            key = keys[q] = current_key(q.options.lvq_key) if q.options.lvq_key is not None else None
            if not q.has_room(size, key):
                raise QueueFull(f"queue {q.name} is full (max-count/max-size, policy reject)" if not q.options.ring
                                else f"queue {q.name} is full: a ring pushes out only available messages, and those "
                                "are not enough for this one")
        routed: list[tuple[Queue, Entry]] = []
        consumers = self.consumers
        try:
            for q in targets:
                e = q.enqueue(data, priority, expires, durable, keys.get(q))
                routed.append((q, e))
                if mid is not None and q.dedup is not None:
                    # (a not durable message on a durable queue: its id is journaled once it went, broker.store)
                    q.dedup.add(mid, now, 0 if e.flags & DURABLE or not q.options.durable else e.position)
                    e.flags |= WINDOWED  # replication tells the backups to take its id too (ha.core.batch)
                if q in consumers:
                    self.server.dirty.add(q)
        except QueueFull:  # (has_room said each would take it: a guard) none of them keeps it
            take_back(routed)
            raise
        return routed, (None if mid is None else (mid, duplicates))

    def _duplicate(self, mid: bytes, queues: list[Queue]) -> None:
        """A transfer whose message-id is in these queues' windows: accepted, not enqueued there (debug log)."""
        for q in queues:
            q.stats.duplicates += 1
            log.debug("queue.duplicate", queue=q.name, message_id=mid[1:].decode("utf-8", "replace") if mid[:1] == b"S"
                      else mid.hex(), count=q.stats.duplicates)

    def dead_letter(self, q: Queue, data: bytes) -> list[tuple[Queue, Entry]]:
        """A message `q`'s consumer rejected goes to the queue's alternate exchange, if it has one. Returns the
        copies, where they went."""
        alt = q.options.alternate_exchange
        if alt is None or alt not in self.wiring.exchanges or not data:
            return []
        meta = decode(data, trusted=True)
        copies = []
        for target in self.route_exchange(alt, current_subject()):
            if target is q or not target.has_room(len(data)):
                continue
            try:
                copies.append((target, target.enqueue(data, meta.priority, meta.expires, meta.durable)))
            except QueueFull:  # a ring whose messages are all acquired: no room after all, as for a full queue
                continue
            if target in self.consumers:
                self.server.dirty.add(target)
        return copies

    def dispatch(self, q: Queue) -> None:
        consumers = self.consumers.get(q)
        if not consumers:
            return
        credit = raw.link_credit
        movers = [c for c in consumers if not c.browse and credit(c.l) > 0]
        if movers and q.has_available():
            # Round robin, starting after whoever got the first message last time.
            i = 0
            while movers:
                c = movers[i % len(movers)]
                e = q.acquire_next(skip=c.undeliverable) if c.undeliverable else q.acquire_next()
                if e is None:
                    if c.undeliverable and q.has_available():
                        movers.remove(c)
                        continue
                    break
                c.send(e)
                if credit(c.l) <= 0:
                    movers.remove(c)
                else:
                    i += 1
            consumers.append(consumers.pop(0))
        for b in consumers:
            if b.browse:
                while credit(b.l) > 0:
                    e = q.browse_after(b.cursor)
                    if e is None:
                        break
                    b.cursor = e.position
                    b.send(e)
        for c in consumers:
            c.drain_if_asked()

    def reply_refusal(self, reply_to: str, st: ConnectionState) -> tuple[str, str] | None:
        """Why a management reply could not go to `reply_to`, asked before the request is carried out: no queue of
        that name, or one the requesting user may not send to (a temporary reply queue is anyone's: its name is
        not guessable). None: it can."""
        q = self.wiring.queues.get(reply_to)
        if q is None:
            return "amqp:not-found", f"reply-to {reply_to!r}: no such queue; the request was not carried out"
        access = self.server.access
        if not q.temporary and access.acl is not None:
            description = access.reply(st, reply_to)
            if description is not None:
                return "amqp:unauthorized-access", f"reply-to: {description}; the request was not carried out"
        return None

    def deliver_reply(self, reply_to: str, msg: Message) -> bool:
        """Put a reply on the queue named `reply_to` (dynamic reply queues are ordinary temporary queues); False if
        there is no such queue (any longer) or it is full."""
        q = self.wiring.queues.get(reply_to)
        if q is None:
            return False
        data = bytes(msg.encode())
        meta = decode(data, trusted=True)
        try:
            q.enqueue(data, meta.priority, meta.expires, meta.durable)
        except QueueFull:
            return False
        if q in self.consumers:
            self.server.dirty.add(q)
        return True

