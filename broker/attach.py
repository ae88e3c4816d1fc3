"""What a link attach becomes: a publisher, a consumer or browser, the management node, the event stream, or
whatever an extension claims. Refusals raise `LinkError` (or a `WiringError`), which the server turns into an attach
with a null terminus and a detach carrying the condition, as the spec asks."""

from __future__ import annotations

import time
import uuid as uuidlib
from typing import TYPE_CHECKING, Any

from proton import Link, Terminus

from broker.acl import EVENTS, Action, Kind
from broker.errors import LinkError
from broker.links import ConsumerLink, EventsLink, LinkHandler, PublisherLink
from broker.management_link import ManagementLink
from broker.queue import Queue
from broker.terminus import binding_key_from_filter, node_properties, refuse_filters
from broker.transactions import CoordinatorLink

if TYPE_CHECKING:
    from broker.connections import ConnectionState
    from broker.server import Server

MANAGEMENT = "$management"


class Attacher:
    def __init__(self, server: Server) -> None:
        self.server = server
        self.wiring = server.wiring

    def attach(self, link: Link, st: ConnectionState) -> LinkHandler:
        if link.is_receiver and link.remote_target.type == Terminus.COORDINATOR:
            # Not an anonymous relay (its address is null too): declare and discharge (broker.transactions).
            _copy_terminus(link)
            return CoordinatorLink(self.server, link, st)
        _copy_terminus(link)
        terminus = link.remote_target if link.is_receiver else link.remote_source
        address = terminus.address
        if address:
            for ext in self.server.extensions:
                h = ext.attach(self.server, link, st, address)
                if h is not None:
                    return h
        if link.is_receiver:
            return self._receiver(link, st, address)
        return self._sender(link, st, address)

    def _receiver(self, link: Any, st: ConnectionState, address: str | None) -> LinkHandler:
        """The peer sends to us."""
        target = link.remote_target
        link.max_message_size = self.server.config.max_message_size
        if address == MANAGEMENT:
            return ManagementLink(self.server, link, st)
        if target.dynamic:
            q = self._temp_queue(target.properties)
            link.target.address = q.name
            link.target.dynamic = True
            return PublisherLink(self.server, link, st, q.name)
        if address is None:
            return PublisherLink(self.server, link, st, None)  # anonymous relay (each `to` checked by the router)
        access = self.server.access
        kind = Kind.EXCHANGE if address in self.wiring.exchanges else Kind.QUEUE
        grant = access.attach(st, Action.PUBLISH, kind, address)
        if address not in self.wiring.queues and address not in self.wiring.exchanges:
            access.attach(st, Action.CREATE, Kind.QUEUE, address)
            self._auto_create(address, target.properties)
        h = PublisherLink(self.server, link, st, address)
        access.track(h, grant)
        return h

    def _sender(self, link: Any, st: ConnectionState, address: str | None) -> LinkHandler:
        """The peer receives from us."""
        source = link.remote_source
        access = self.server.access
        if address == EVENTS:
            refuse_filters(source.filter, f"the event stream {EVENTS}")
            grant = access.attach(st, Action.BROWSE, Kind.BROKER, EVENTS)
            h = EventsLink(self.server, link, st)
            access.track(h, grant)
            self.server.events_links.add(h)
            return h
        if source.dynamic:
            refuse_filters(source.filter, "a dynamic queue")
            q = self._temp_queue(source.properties)
            link.source.address = q.name
            return self.consumer(link, st, q, browse=False)
        if address is None:
            raise LinkError("amqp:invalid-field", "a receiving link needs a source address")
        if address in self.wiring.exchanges:
            grant = access.attach(st, Action.CONSUME, Kind.EXCHANGE, address)
            sub = self._subscribe_exchange(link, st, address)
            access.track(sub, grant)
            return sub
        refuse_filters(source.filter, f"queue {address!r}")  # before auto-create: a refused attach creates nothing
        browse = source.distribution_mode == Terminus.DIST_MODE_COPY
        # Checked before auto-create too: a refused attach creates nothing.
        grant = access.attach(st, Action.BROWSE if browse else Action.CONSUME, Kind.QUEUE, address)
        found = self.wiring.queues.get(address)
        if found is None:
            access.attach(st, Action.CREATE, Kind.QUEUE, address)
            found = self._auto_create(address, source.properties)
        c = self.consumer(link, st, found, browse)
        access.track(c, grant)
        return c

    def consumer(self, link: Any, st: ConnectionState, q: Queue, browse: bool) -> ConsumerLink:
        if q.locked:
            raise LinkError("amqp:resource-locked", f"queue {q.name!r} is not available on this broker")
        if q.options.exclusive and q.consumer_count > 0:
            raise LinkError("amqp:resource-locked", f"queue {q.name!r} is exclusive and already has a consumer")
        h = ConsumerLink(self.server, link, st, q, browse)
        link.source.distribution_mode = Terminus.DIST_MODE_COPY if browse else Terminus.DIST_MODE_MOVE
        self.server.consumers.setdefault(q, []).append(h)
        q.consumer_count += 1
        q.had_consumer = True
        self.server.auto_delete_timers.pop(q, None)
        return h

    def _subscribe_exchange(self, link: Any, st: ConnectionState, exchange: str) -> ConsumerLink:
        ex = self.wiring.exchange(exchange)
        key = binding_key_from_filter(link.remote_source.filter, exchange)
        if key is None:
            key = "#" if ex.type == "topic" else ""
        q = self._temp_queue(None)
        self.wiring.bind(exchange, q.name, key)
        return self.consumer(link, st, q, browse=False)

    def _temp_queue(self, properties: Any) -> Queue:
        args: dict[str, Any] = {"exclusive": True, "auto-delete": True}
        args.update(node_properties(properties))
        q, _ = self.wiring.declare_queue(f"temp.{uuidlib.uuid4()}", args, temporary=True)
        return q

    def _auto_create(self, address: str, properties: Any) -> Queue:
        if not self.server.config.auto_create_queues:
            raise LinkError("amqp:not-found", f"no queue or exchange named {address!r}")
        q, _ = self.wiring.declare_queue(address, node_properties(properties))
        return q

    def consumer_gone(self, h: ConsumerLink) -> None:
        server = self.server
        lst = server.consumers.get(h.queue)
        if lst is not None and h in lst:
            lst.remove(h)
            if not lst:
                del server.consumers[h.queue]
        q = h.queue
        q.consumer_count -= 1
        if q.consumer_count == 0 and q.options.auto_delete and q.had_consumer and not q.deleted:
            server.auto_delete_timers[q] = time.time() + q.options.auto_delete_timeout
            if q.options.auto_delete_timeout == 0:
                server.wake_call(lambda: server.auto_delete_now(q))


def _copy_terminus(link: Link) -> None:
    if link.is_receiver:
        link.target.copy(link.remote_target)
        link.source.copy(link.remote_source)
    else:
        link.source.copy(link.remote_source)
        link.target.copy(link.remote_target)
