"""What happens on each kind of link: publishers, consumers/browsers, the event stream.

A link handler receives the link's events from the server (flow, deliveries, detach) and may ask to be run once
per reactor pass (`server.wake(handler)`), which is where cross-connection work (dispatching to consumers) happens:
touching two connections for every message defeats proton's event de-duplication.
"""

from __future__ import annotations

import itertools
from collections import deque
from typing import TYPE_CHECKING, Any

from cproton import PN_ACCEPTED, pn_delivery_settle, pn_delivery_settled, pn_delivery_update
from proton import Condition, Delivery, Link, Message, Receiver, Sender

from broker.message import MalformedMessage, with_delivery_header
from broker.queue import ACQUIRED, DequeueReason, Entry, Queue, QueueFull

if TYPE_CHECKING:
    from broker.server import ConnectionState, Server
    from broker.wiring import WiringEvent


class LinkError(Exception):
    """Refuse or close a link with an AMQP error condition."""

    def __init__(self, condition: str, description: str) -> None:
        super().__init__(description)
        self.condition = condition
        self.description = description


class LinkHandler:
    """Base: a link attached to the broker. Subclasses override what they need."""

    counts_as_consumer = False

    def __init__(self, server: Server, link: Link, conn: ConnectionState) -> None:
        self.server = server
        self.link = link
        self.conn = conn
        self.closed = False

    def on_flow(self) -> None:
        pass

    def on_delivery(self, delivery: Delivery) -> None:
        pass

    def run(self) -> None:
        """Deferred work, once per reactor pass after `server.wake(self)`."""

    def on_detached(self) -> None:
        """The link is gone (peer detached, session/connection closed or lost). Clean up once."""


# ----------------------------------------------------------------------------------------------------------------
class Completion:
    """A received client delivery that is settled only when every holder has released it."""

    __slots__ = ("delivery", "pending", "publisher")

    def __init__(self, publisher: PublisherLink, delivery: Delivery) -> None:
        self.publisher = publisher
        self.delivery = delivery
        self.pending = 1

    def release(self) -> None:
        self.pending -= 1
        if self.pending == 0:
            self.publisher.server.settle_later(self)


class PublisherLink(LinkHandler):
    """A client sends to a queue, an exchange, or (null target) anywhere named by each message's `to`."""

    def __init__(self, server: Server, link: Receiver, conn: ConnectionState, address: str | None) -> None:
        super().__init__(server, link, conn)
        self.receiver = link
        self.address = address
        self.window = server.config.credit_window
        self.unsettled = 0  # deliveries received and not yet settled (held for replication)
        self.rejected_since_log = 0

    def top_up(self) -> None:
        """Give credit while fewer than `window` deliveries are held: a slow holder becomes backpressure."""
        link = self.receiver
        room = self.window - self.unsettled - link.credit
        if room >= self.window // 2 or (link.credit == 0 and room > 0):
            link.flow(room)

    def on_delivery(self, delivery: Delivery) -> None:
        if delivery.partial:
            if delivery.pending > self.server.config.max_message_size:
                self._too_big(delivery)
            return
        link = self.receiver
        if delivery.pending > self.server.config.max_message_size:
            self._too_big(delivery)
            return
        data = link.recv(delivery.pending)
        link.advance()
        if data is None:
            data = b""
        self.unsettled += 1
        try:
            self.server.route_and_hold(self, delivery, data)
        except MalformedMessage as e:
            self.reject(delivery, "amqp:decode-error", str(e))
        except LinkError as e:
            self.reject(delivery, e.condition, e.description)
        except QueueFull as e:
            self.reject(delivery, "amqp:resource-limit-exceeded", str(e))
        self.top_up()

    def _too_big(self, delivery: Delivery) -> None:
        desc = f"message larger than max-message-size {self.server.config.max_message_size}"
        self.server.log_link_refused(self, "amqp:link:message-size-exceeded", desc)
        self.server.close_link(self.link, "amqp:link:message-size-exceeded", desc)

    def reject(self, delivery: Delivery, condition: str, description: str) -> None:
        self.unsettled -= 1
        if not delivery.settled:
            delivery.local.condition = Condition(condition, description)
            delivery.update(Delivery.REJECTED)
        delivery.settle()
        self.rejected_since_log += 1
        self.server.log_message_rejected(self, condition, description)

    def settled(self, delivery: Delivery) -> None:
        self.unsettled -= 1
        # Once per client message: the C calls only. proton's Delivery.update would first copy the local
        # disposition's data, annotations and condition, all empty here (it was 6 % of the e2e profile).
        impl = delivery._impl
        if not pn_delivery_settled(impl):
            pn_delivery_update(impl, PN_ACCEPTED)
        pn_delivery_settle(impl)


# ----------------------------------------------------------------------------------------------------------------
_tags = itertools.count(1)


class ConsumerLink(LinkHandler):
    """The broker sends messages from a queue: acquiring (move) or browsing (copy)."""

    def __init__(self, server: Server, link: Sender, conn: ConnectionState, queue: Queue, browse: bool) -> None:
        super().__init__(server, link, conn)
        self.sender = link
        self.queue = queue
        self.browse = browse
        self.counts_as_consumer = True
        self.presettled = link.remote_snd_settle_mode == Link.SND_SETTLED
        self.unacked: dict[Delivery, Entry] = {}
        self.cursor = 0  # browse position
        self.undeliverable: set[int] = set()  # positions this consumer said it cannot take

    def on_flow(self) -> None:
        if self.sender.credit > 0:
            self.server.wake_queue(self.queue)
        elif self.sender.drain_mode:
            self.sender.drained()

    def send(self, entry: Entry) -> None:
        """Send one entry (already acquired when moving)."""
        data = entry.msg.data
        if entry.delivery_count or entry.redelivered:
            data = with_delivery_header(data, entry.delivery_count, not entry.redelivered)
        d = self.sender.delivery(str(next(_tags)))
        self.sender.send(data)
        self.sender.advance()
        if self.presettled:
            d.settle()
            if not self.browse:
                self.queue.dequeue(entry, DequeueReason.ACCEPTED)
        elif not self.browse:
            self.unacked[d] = entry
        else:
            d.settle()  # browsed copies need no outcome

    def on_delivery(self, delivery: Delivery) -> None:
        """The consumer's outcome for a message we sent."""
        entry = self.unacked.get(delivery)
        if entry is None:
            if delivery.remote_state or delivery.settled:
                delivery.settle()
            return
        state = delivery.remote_state
        if state is None and not delivery.settled:
            return
        del self.unacked[delivery]
        q = self.queue
        if state == Delivery.ACCEPTED or state is None:
            q.dequeue(entry, DequeueReason.ACCEPTED)
        elif state == Delivery.RELEASED:
            q.release(entry, delivery_failed=False, redelivered=False)
            self.server.wake_queue(q)
        elif state == Delivery.MODIFIED:
            failed = bool(delivery.remote.failed)
            if delivery.remote.undeliverable:
                self.undeliverable.add(entry.position)
            q.release(entry, delivery_failed=failed, redelivered=failed)
            self.server.wake_queue(q)
        elif state == Delivery.REJECTED:
            q.dequeue(entry, DequeueReason.REJECTED)
            self.server.dead_letter(q, entry)
        else:
            q.release(entry, delivery_failed=False)
            self.server.wake_queue(q)
        delivery.settle()

    def return_unacked(self) -> int:
        """Link or connection gone: everything unsettled goes back, marked redelivered."""
        n = 0
        for d, entry in list(self.unacked.items()):
            if entry.state == ACQUIRED:
                self.queue.release(entry, delivery_failed=True, redelivered=True)
                n += 1
            del self.unacked[d]
        if n:
            self.server.wake_queue(self.queue)
        return n

    def on_detached(self) -> None:
        self.conn.unsettled_returned += self.return_unacked()


# ----------------------------------------------------------------------------------------------------------------
class EventsLink(LinkHandler):
    """`$events`: every wiring change, in sequence order, as pre-settled messages."""

    MAX_BACKLOG = 100_000

    def __init__(self, server: Server, link: Sender, conn: ConnectionState) -> None:
        super().__init__(server, link, conn)
        self.sender = link
        self.backlog: deque[bytes] = deque()

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
        s = self.sender
        while self.backlog and s.credit > 0:
            d = s.delivery(str(next(_tags)))
            s.send(self.backlog.popleft())
            s.advance()
            d.settle()

    def on_detached(self) -> None:
        self.server.events_links.discard(self)


def _plain(v: Any) -> Any:
    """Attributes as AMQP-friendly values (tuples -> lists, keys as strings)."""
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_plain(x) for x in v]
    return v
