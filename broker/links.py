"""What happens on each kind of link: publishers, consumers/browsers, the event stream.

A link handler gets its link's deliveries and credit changes straight from the event loop, as raw proton-C pointers
(`on_delivery(d)`, `on_flow()`; see broker.engine.raw), and may ask to be run once per pass (`server.wake(handler)`),
which is where cross-connection work (dispatching to consumers) happens. Attach, detach and errors arrive through
the server. Handlers keep the proton `Link` wrapper (`self.link`, which also pins the C link) for those rare paths.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any

from proton import Condition, Delivery, Link, Message

from broker.delivery_limit import dead_letter_if_over
from broker.engine import raw
from broker.errors import MessageRefused
from broker.message import with_delivery_header
from broker.queue import ACQUIRED, REDELIVERED, DequeueReason, Entry, Queue

if TYPE_CHECKING:
    from broker.connections import ConnectionState
    from broker.server import Server
    from broker.wiring import WiringEvent

_get_drain = raw.lib.pn_link_get_drain
TRANSACTIONAL = 0x34  # a delivery state transactional-state (AMQP 1.0 part 4): broker.transactions


class LinkHandler:
    """Base: a link attached to the broker. Subclasses override what they need."""

    counts_as_consumer = False

    def __init__(self, server: Server, link: Link, conn: ConnectionState) -> None:
        self.server = server
        self.link = link
        self.l = link._impl
        self.conn = conn
        self.closed = False

    def on_flow(self) -> None:
        pass

    def on_delivery(self, d: Any) -> None:
        """A delivery on this link changed (new transfer data, or the peer's outcome/settlement): raw pointer."""

    def run(self) -> None:
        """Deferred work, once per pass after `server.wake(self)`."""

    def on_detached(self) -> None:
        """The link is gone (peer detached, session/connection closed or lost). Clean up once."""


def reject(d: Any, condition: str, description: str) -> None:
    """Settle a received delivery as rejected with an error (off the hot path: uses proton's wrapper)."""
    delivery = Delivery.wrap(d)
    if not delivery.settled:
        delivery.local.condition = Condition(condition, description)
        delivery.update(Delivery.REJECTED)
    delivery.settle()


# ----------------------------------------------------------------------------------------------------------------
class Completion:
    """A received client delivery that is settled only when every holder has released it."""

    __slots__ = ("delivery", "error", "followers", "keys", "pending", "publisher")

    def __init__(self, publisher: PublisherLink, delivery: Any) -> None:
        self.publisher = publisher
        self.delivery = delivery  # raw pointer; touched only while the publisher link is open
        self.pending = 1
        self.error: tuple[str, str] | None = None  # a holder could not keep its promise: reject, don't accept
        self.followers: list[Completion] | None = None  # resends of this message, answered after it
        self.keys: list[tuple[str, bytes]] | None = None  # its (queue, message-id) in Router.unconfirmed

    def follow(self, original: Completion) -> None:
        """Be answered only after `original` (this is a resend of it that a duplicate window dropped)."""
        self.pending += 1
        if original.followers is None:
            original.followers = []
        original.followers.append(self)

    def release(self) -> None:
        self.pending -= 1
        if self.pending == 0:
            self.publisher.server.to_settle.append(self)

    def fail(self, condition: str, description: str) -> None:
        """Release, but the client is told the message was not taken (e.g. the journal could not write it)."""
        if self.error is None:
            self.error = (condition, description)
        self.release()


class AcceptCompletion:
    """A consumer's accept the broker answers (settles) only once every holder released it: a consumer with
    receiver-settle-mode second learns that its accept took effect (e.g. the backups have the dequeue)."""

    __slots__ = ("consumer", "delivery")

    def __init__(self, consumer: ConsumerLink, delivery: Any) -> None:
        self.consumer = consumer
        self.delivery = delivery  # raw pointer; None once the consumer settled it itself

    def release(self) -> None:
        self.consumer.server.accepts_to_settle.append(self)


# What an extension holds for an accept (`Extension.hold_accept`): a consumer's accept, or the discharge of a commit
# whose accepts dequeued messages of the queue (broker.transactions). Both are released exactly once.
AcceptToken = AcceptCompletion | Completion


class PublisherLink(LinkHandler):
    """A client sends to a queue, an exchange, or (null target) anywhere named by each message's `to`."""

    def __init__(self, server: Server, link: Link, conn: ConnectionState, address: str | None) -> None:
        super().__init__(server, link, conn)
        self.address = address
        self.window = server.config.credit_window
        self.max_size = server.config.max_message_size
        self.unsettled = 0  # deliveries received and not yet settled (held for replication)
        self.rejected_since_log = 0

    def top_up(self) -> None:
        """Give credit while fewer than `window` deliveries are held: a slow holder becomes backpressure."""
        raw.top_up(self.l, self.window, self.unsettled)

    def run(self) -> None:
        self.top_up()

    def on_delivery(self, d: Any) -> None:
        if raw.delivery_partial(d):
            if raw.delivery_pending(d) > self.max_size:
                self._too_big()
            return
        if raw.delivery_aborted(d):  # the sender gave up on this message: drop it
            raw.delivery_settle(d)
            self.server.wake(self)
            return
        n = raw.delivery_pending(d)
        if n > self.max_size:
            self._too_big()
            return
        data = raw.recv(self.l, n)
        if raw.delivery_remote_state(d) == TRANSACTIONAL:
            self.server.transactions.transfer(self, d, data)
            return
        self.unsettled += 1
        try:
            self.server.route(self, d, data)
        except MessageRefused as e:
            self.refuse(d, e.condition, e.description)

    def _too_big(self) -> None:
        desc = f"message larger than max-message-size {self.max_size}"
        self.server.log_link_refused(self, "amqp:link:message-size-exceeded", desc)
        self.server.close_link(self.link, "amqp:link:message-size-exceeded", desc)

    def refuse(self, d: Any, condition: str, description: str) -> None:
        self.unsettled -= 1
        reject(d, condition, description)
        self.rejected_since_log += 1
        self.server.log_message_rejected(self, condition, description)
        self.server.wake(self)

    def settle(self, d: Any) -> None:
        """Accept and settle (once per client message: the C calls only)."""
        self.unsettled -= 1
        raw.accept(d)

    def settle_rejected(self, d: Any, condition: str, description: str) -> None:
        self.refuse(d, condition, description)


# ----------------------------------------------------------------------------------------------------------------
class ConsumerLink(LinkHandler):
    """The broker sends messages from a queue: acquiring (move) or browsing (copy)."""

    def __init__(self, server: Server, link: Link, conn: ConnectionState, queue: Queue, browse: bool) -> None:
        super().__init__(server, link, conn)
        self.queue = queue
        self.browse = browse
        self.counts_as_consumer = True
        self.presettled = raw.link_remote_snd_settle_mode(self.l) == raw.SND_SETTLED
        self.unacked: dict[Any, Entry] = {}  # delivery pointer -> entry
        self.answering: dict[Any, AcceptCompletion] = {}  # accepted, dequeued, settled once the holders release
        self.cursor = 0  # browse position
        self.undeliverable: set[int] = set()  # positions this consumer said it cannot take
        self.tag = 0

    @property
    def credit(self) -> int:
        return int(raw.link_credit(self.l))

    def on_flow(self) -> None:
        if raw.link_credit(self.l) > 0:
            self.server.wake_queue(self.queue)
        elif _get_drain(self.l):
            raw.link_drained(self.l)

    def drain_if_asked(self) -> None:
        if _get_drain(self.l) and raw.link_credit(self.l) > 0:
            raw.link_drained(self.l)

    def send(self, entry: Entry) -> None:
        """Send one entry (already acquired when moving)."""
        data = entry.data
        if entry.count or entry.flags & REDELIVERED:  # re-encode the header (redeliveries only)
            data = with_delivery_header(data, entry.count, not entry.flags & REDELIVERED)
        self.tag += 1
        d = raw.send(self.l, self.tag, data)
        if self.presettled:
            raw.delivery_settle(d)
            if not self.browse:
                self.queue.dequeue(entry, DequeueReason.ACCEPTED)
        elif not self.browse:
            self.unacked[d] = entry
        else:
            raw.delivery_settle(d)  # browsed copies need no outcome

    def on_delivery(self, d: Any) -> None:
        """The consumer's outcome for a message we sent."""
        entry = self.unacked.get(d)
        state = raw.delivery_remote_state(d)
        if entry is None:
            held = self.answering.get(d)
            if held is not None:
                if raw.delivery_settled(d):  # the consumer stopped waiting for our answer: the pointer goes now
                    del self.answering[d]
                    held.delivery = None
                    raw.delivery_settle(d)
                return
            if state or raw.delivery_settled(d):
                raw.delivery_settle(d)
            return
        remote_settled = raw.delivery_settled(d)
        if not state and not remote_settled:
            return
        if state == TRANSACTIONAL:
            if self.server.transactions.outcome(self, d, entry):
                del self.unacked[d]
            return
        del self.unacked[d]
        q = self.queue
        if state == raw.ACCEPTED or not state:
            q.dequeue(entry, DequeueReason.ACCEPTED)
            if state and not remote_settled:  # receiver-settle-mode second: it waits for our settlement
                token = AcceptCompletion(self, d)
                self.answering[d] = token
                if not self.server.hold_accept(token, q):
                    token.release()  # settled at the end of the pass, behind the same fences as publishers
                return
        elif state == raw.RELEASED:
            q.release(entry, delivery_failed=False, redelivered=False)
            self.server.wake_queue(q)
        elif state == raw.MODIFIED:
            disp = raw.delivery_remote(d)
            failed = bool(raw.disposition_is_failed(disp))
            if raw.disposition_is_undeliverable(disp):
                self.undeliverable.add(entry.position)
            if not (failed and dead_letter_if_over(self.server, q, entry)):
                q.release(entry, delivery_failed=failed, redelivered=failed)
            self.server.wake_queue(q)
        elif state == raw.REJECTED:
            data = entry.data
            q.dequeue(entry, DequeueReason.REJECTED)
            self.server.dead_letter(q, data)
        else:
            q.release(entry, delivery_failed=False)
            self.server.wake_queue(q)
        raw.delivery_settle(d)

    def return_unacked(self) -> int:
        """Link or connection gone: everything unsettled goes back, marked redelivered."""
        n = 0
        for entry in self.unacked.values():
            if entry.state == ACQUIRED:
                if not dead_letter_if_over(self.server, self.queue, entry):
                    self.queue.release(entry, delivery_failed=True, redelivered=True)
                n += 1
        self.unacked.clear()
        if n:
            self.server.wake_queue(self.queue)
        return n

    def answer(self, token: AcceptCompletion) -> None:
        """Settle a held accept (the link is open: its pointers are valid)."""
        d = token.delivery
        if d is not None and self.answering.pop(d, None) is token:
            raw.delivery_settle(d)

    def on_detached(self) -> None:
        self.answering.clear()  # their pointers go with the link; the accepts took effect (dequeued)
        self.conn.unsettled_returned += self.return_unacked()


# ----------------------------------------------------------------------------------------------------------------
class EventsLink(LinkHandler):
    """`$events`: every wiring change, in sequence order, as pre-settled messages."""

    MAX_BACKLOG = 100_000

    def __init__(self, server: Server, link: Link, conn: ConnectionState) -> None:
        super().__init__(server, link, conn)
        self.backlog: deque[bytes] = deque()
        self.tag = 0

    def push(self, ev: WiringEvent) -> None:
        m = Message(properties=ev.to_properties(), body=_plain(ev.attributes), subject=f"{ev.type}.{ev.kind}")
        self.backlog.append(m.encode())
        if len(self.backlog) > self.MAX_BACKLOG:
            self.server.close_link(self.link, "amqp:resource-limit-exceeded", "event subscriber too slow")
            return
        self.flush()

    def on_flow(self) -> None:
        self.flush()

    def flush(self) -> None:
        link = self.l
        while self.backlog and raw.link_credit(link) > 0:
            self.tag += 1
            raw.send_settled(link, self.tag, self.backlog.popleft())

    def on_detached(self) -> None:
        self.server.events_links.discard(self)


def _plain(v: Any) -> Any:
    """Attributes as AMQP-friendly values (tuples -> lists, keys as strings)."""
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_plain(x) for x in v]
    return v
