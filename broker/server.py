"""The broker's proton handler: connections, links, routing, dispatch, settlement.

Everything runs on the reactor thread. Work that touches other connections (dispatching to consumers, settling held
deliveries) is collected during a reactor pass and done once in `on_reactor_quiesced`.
"""

from __future__ import annotations

import functools
import itertools
import time
import uuid as uuidlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

from proton import Condition, Connection, Delivery, Endpoint, Link, Message, Terminus
from proton.reactor import ApplicationEvent, Container, EventInjector

from broker import __version__
from broker.auth import SaslSetup, User
from broker.client import KIND_PROPERTY  # connection property: client | admin | ha
from broker.config import BrokerConfig
from broker.links import (
    Completion,
    ConsumerLink,
    EventsLink,
    LinkError,
    LinkHandler,
    PublisherLink,
)
from broker.log import fast, get_logger
from broker.management import Management, Request, Response
from broker.management_link import ManagementLink
from broker.message import Payload, decode_payload
from broker.queue import Entry, Queue, QueueFull
from broker.terminus import binding_key_from_filter, node_properties
from broker.wiring import Wiring, WiringError, WiringEvent

log = get_logger("broker")

MANAGEMENT = "$management"
EVENTS = "$events"
FAST_LOG_FLUSH = 0.2  # seconds between writes of batched event lines (lag samples, settle windows)


class CompletionHolder(Protocol):
    """Delays the settlement of a client's delivery. Return True to hold it (and call `completion.release()`
    later, exactly once); False to let it go."""

    def hold(self, completion: Completion, routed: list[tuple[Queue, Entry]]) -> bool: ...


class Refusal(Exception):
    def __init__(self, condition: str, description: str, info: dict[str, Any] | None = None) -> None:
        super().__init__(description)
        self.condition = condition
        self.description = description
        self.info = info


# An address handler claims attaches to addresses with its prefix: (server, link, conn, address) -> LinkHandler.
AddressHandler = Callable[["Server", Link, "ConnectionState", str], LinkHandler]


_conn_ids = itertools.count(1)


@dataclass(eq=False)
class ConnectionState:
    connection: Connection
    id: int = field(default_factory=lambda: next(_conn_ids))
    remote: str = ""
    user: str | None = None
    admin: bool = False
    kind: str = "client"
    properties: dict[Any, Any] = field(default_factory=dict)
    links: set[LinkHandler] = field(default_factory=set)
    unsettled_returned: int = 0
    refused: bool = False


class _Timer:
    def __init__(self, fn: Callable[[], None]) -> None:
        self.fn = fn

    def on_timer_task(self, event: Any) -> None:
        try:
            self.fn()
        except Exception:
            log.error("broker.error", where="timer", exc_info=True)


F = TypeVar("F", bound=Callable[..., None])


def guarded(fn: F) -> F:
    """A bug in one event must not take the broker down: log it, close the link or connection involved."""

    @functools.wraps(fn)
    def wrapper(self: Server, event: Any) -> None:
        try:
            fn(self, event)
        except Exception as e:
            log.error("broker.error", where=fn.__name__, exc_info=True)
            cond = Condition("amqp:internal-error", f"{type(e).__name__}: {e}")
            link = getattr(event, "link", None)
            try:
                if link is not None and link.state & Endpoint.LOCAL_ACTIVE:
                    self._link_gone(link)
                    link.condition = cond
                    link.close()
                elif event.connection is not None and event.connection.state & Endpoint.LOCAL_ACTIVE:
                    event.connection.condition = cond
                    event.connection.close()
            except Exception:
                log.error("broker.error", where="cleanup", exc_info=True)

    return wrapper  # type: ignore[return-value]


class Server:
    def __init__(self, config: BrokerConfig, broker_id: str, users: dict[str, User] | None = None) -> None:
        self.config = config
        self.id = broker_id
        self.users = users or {}
        self.started = time.time()
        self.wiring = Wiring()
        self.wiring.observers.append(self)
        self.management = Management(self.wiring, self.broker_attributes)
        self.container: Container | None = None
        self.injector = EventInjector()
        self.acceptor: Any = None
        self.port: int | None = None
        self.sasl_dir: Path | None = None
        self.conns: dict[Connection, ConnectionState] = {}
        self.links: dict[Link, LinkHandler] = {}
        self.consumers: dict[Queue, list[ConsumerLink]] = {}
        self.events_links: set[EventsLink] = set()
        self.dirty: set[Queue] = set()
        self.woken: set[LinkHandler] = set()
        self.to_settle: list[Completion] = []
        self.auto_delete_timers: dict[Queue, float] = {}
        # Hooks for the layers above (HA); broker/ never imports them.
        self.holders: list[CompletionHolder] = []
        self.connection_policy: Callable[[ConnectionState], None] | None = None  # raise Refusal to refuse
        self.address_handlers: dict[str, AddressHandler] = {}
        self.attribute_providers: list[Callable[[], dict[str, Any]]] = []
        self.role_epoch: Callable[[], tuple[str, int]] = lambda: ("standalone", 0)
        self.on_started: list[Callable[[], None]] = []
        self.on_connection_closed: list[Callable[[ConnectionState], None]] = []
        self.connection_properties: list[Callable[[], dict[str, Any]]] = []
        # Every fence must pass before client deliveries are settled (e.g. "I still hold the primary's lease");
        # while one fails, settlements wait (they are retried every 50 ms).
        self.settle_fences: list[Callable[[], bool]] = []
        self._fence_retry: Any = None
        self.on_quiesced: list[Callable[[], None]] = []
        self.on_quiesced_once: list[Callable[[], None]] = []
        # client.settled window
        self._settled_count = 0
        self._settled_first = 0.0
        self._settled_last = 0.0
        self._settled_as: tuple[str, int] = ("standalone", 0)
        self._msg_reject_log: dict[int, float] = {}
        self._stopping = False

    # ----- lifecycle --------------------------------------------------------------------------------------------
    def on_reactor_init(self, event: Any) -> None:
        self.container = event.container
        assert self.container is not None
        self.container.selectable(self.injector)
        self.acceptor = self.container.listen(f"{self.config.host}:{self.config.port}")
        self.port = self.acceptor._selectable._delegate.getsockname()[1]
        self.schedule(1.0, self._tick)
        self.schedule(FAST_LOG_FLUSH, self._flush_fast_log)
        log.info(
            "broker.started",
            address=f"{self.config.host}:{self.port}",
            version=__version__,
            ha_cluster=self.config.ha_cluster,
            data_dir=str(self.config.data_dir) if self.config.data_dir else None,
        )
        for fn in self.on_started:
            fn()

    def handle_management(self, req: Request) -> Response:
        """One management request, whatever carried it (`$management` link or the admin socket)."""
        try:
            resp = self.management.handle(req)
        except Exception as e:  # a bug must not take the broker down; answer 500 and log it
            log.error("management.error", operation=req.operation, type=req.type, name=req.name, exc_info=True)
            resp = Response(500, f"internal error: {type(e).__name__}: {e}")
        if req.operation.upper() not in ("READ", "QUERY"):
            log.info("management.request", operation=req.operation, type=req.type, name=req.name,
                     status=resp.status, user=req.user)
        return resp

    def schedule(self, delay: float, fn: Callable[[], None]) -> Any:
        assert self.container is not None
        return self.container.schedule(delay, _Timer(fn))  # type: ignore[arg-type]

    def call_soon_threadsafe(self, fn: Callable[[], None]) -> None:
        """Run `fn` on the reactor thread (from any thread, or a signal handler)."""
        self.injector.trigger(ApplicationEvent("call", subject=fn))

    @guarded
    def on_call(self, event: Any) -> None:
        event.subject()

    def shutdown(self, reason: str) -> None:
        self.call_soon_threadsafe(lambda: self._shutdown(reason))

    def _shutdown(self, reason: str) -> None:
        if self._stopping:
            return
        self._stopping = True
        log.info("broker.stopping", reason=reason)
        if self.acceptor is not None:
            self.acceptor.close()
        for c in list(self.conns):
            if c.state & Endpoint.LOCAL_ACTIVE:
                c.condition = Condition("amqp:connection:forced", f"broker shutting down ({reason})")
                c.close()
        self._flush_settled_log(force=True)
        fast.flush()
        self.injector.close()
        self._stop_when_flushed(time.monotonic() + 2.0)

    def _stop_when_flushed(self, deadline: float) -> None:
        """Stop the reactor once every client has been sent its close frame (or at the deadline): clients learn
        at once that the broker went away, instead of from a dropped socket."""
        unsent = [c for c in self.conns if c.transport is not None and c.transport.pending() > 0]
        if unsent and time.monotonic() < deadline:
            self.schedule(0.02, lambda: self._stop_when_flushed(deadline))
            return
        assert self.container is not None
        self.container.stop()

    def _flush_fast_log(self) -> None:
        fast.flush()
        if not self._stopping:
            self.schedule(FAST_LOG_FLUSH, self._flush_fast_log)

    def _tick(self) -> None:
        now = time.time()
        for q in list(self.wiring.queues.values()):
            n = q.expire(now)
            if n:
                log.info("queue.expired", queue=q.name, count=n)
        for q, due in list(self.auto_delete_timers.items()):
            if due <= now:
                del self.auto_delete_timers[q]
                if q.consumer_count == 0 and not q.deleted:
                    self._delete_queue(q)
        self._flush_settled_log()
        if not self._stopping:
            self.schedule(1.0, self._tick)

    # ----- connections ------------------------------------------------------------------------------------------
    @guarded
    def on_connection_bound(self, event: Any) -> None:
        t = event.transport
        sasl = t.sasl()
        sasl.allow_insecure_mechs = True
        if self.sasl_dir is not None:
            sasl.config_path(str(self.sasl_dir))
            sasl.config_name(SaslSetup.CONFIG_NAME)
        sasl.allowed_mechs(" ".join(self.config.sasl_mechanisms))

    @guarded
    def on_connection_remote_open(self, event: Any) -> None:
        c = event.connection
        if c in self.conns or c.state & Endpoint.LOCAL_ACTIVE:
            return  # an outgoing connection (its own handler deals with it)
        st = ConnectionState(c)
        try:
            st.remote = f"{c.url.host}:{c.url.port}" if getattr(c, "url", None) else ""
        except Exception:
            st.remote = ""
        st.user = event.transport.user if event.transport else None
        props = c.remote_properties or {}
        st.properties = dict(props)
        kind = props.get(KIND_PROPERTY, "client")
        st.kind = kind if kind in ("client", "admin", "ha") else "client"
        st.admin = self._is_admin(st.user)
        if st.kind == "ha" and self.config.ha_cluster:
            # Only replication connections are declared dead after two silent heartbeats; a client that is
            # busy in its own code for a while must not lose its connection.
            event.transport.idle_timeout = self.config.ha_heartbeat * 2
        self.conns[c] = st
        c.offered_capabilities = ["ANONYMOUS-RELAY"]
        props_out: dict[str, Any] = {"product": "understudy", "version": __version__, "x-understudy-broker": self.id}
        for provider in self.connection_properties:
            props_out.update(provider())
        c.properties = props_out
        if self.connection_policy is not None:
            try:
                self.connection_policy(st)
            except Refusal as r:
                st.refused = True
                c.condition = Condition(r.condition, r.description, r.info)  # type: ignore[arg-type]
                c.open()
                c.close()
                log.warning("connection.refused", remote=st.remote, condition=r.condition, description=r.description)
                return
        c.open()
        log.info("connection.opened", connection=st.id, remote=st.remote, user=st.user, kind=st.kind)

    def _is_admin(self, user: str | None) -> bool:
        if not self.users:
            return True
        if user is not None and user == self.config.ha_username:
            return True
        u = self.users.get(user or "")
        return bool(u and u.admin)

    @guarded
    def on_session_remote_open(self, event: Any) -> None:
        if event.connection in self.conns:
            event.session.open()

    @guarded
    def on_session_remote_close(self, event: Any) -> None:
        if event.connection in self.conns:
            for link in list(self.links):
                if link.session == event.session:
                    self._link_gone(link)
            event.session.close()

    @guarded
    def on_connection_remote_close(self, event: Any) -> None:
        c = event.connection
        if c in self.conns:
            self._connection_gone(c)
            c.close()

    @guarded
    def on_transport_tail_closed(self, event: Any) -> None:
        # When a read fails (connection reset by the peer) proton's Python IO handler closes only the input side
        # and never the output side, so the transport, its connection and every link on it would linger forever
        # (a vanished consumer's unsettled messages never coming back). Nothing more can arrive: close the output
        # side too, as proton itself does on a plain EOF; that ends in on_transport_closed.
        t = event.transport
        if t is not None and event.connection in self.conns and not t.closed:
            t.close_head()

    @guarded
    def on_transport_error(self, event: Any) -> None:
        # Failed logins end here, before any connection opens: say so (the client only sees its own error).
        c, t = event.connection, event.transport
        cond = t.condition if t is not None else None
        if cond is not None and cond.name == "amqp:unauthorized-access" and c is not None and c not in self.conns \
                and not c.state & Endpoint.LOCAL_ACTIVE:
            log.warning("connection.refused", remote=_remote(c), condition=cond.name, description=cond.description,
                        user=t.user if t is not None else None)

    @guarded
    def on_transport_closed(self, event: Any) -> None:
        c = event.connection
        if c is not None and c in self.conns:
            self._connection_gone(c)

    def _connection_gone(self, c: Connection) -> None:
        st = self.conns.pop(c, None)
        if st is None:
            return
        for link in [lk for lk, h in self.links.items() if h.conn is st]:
            self._link_gone(link)
        for fn in self.on_connection_closed:
            fn(st)
        if not st.refused:
            err = c.remote_condition.name if c.remote_condition else None
            log.info("connection.closed", connection=st.id, error=err, unsettled_returned=st.unsettled_returned)

    # ----- links ------------------------------------------------------------------------------------------------
    @guarded
    def on_link_remote_open(self, event: Any) -> None:
        link = event.link
        st = self.conns.get(event.connection)
        if st is None or link in self.links:
            return
        try:
            handler = self._attach(link, st)
        except (LinkError, WiringError) as e:
            cond = e.condition if isinstance(e, LinkError) else type(e).condition
            desc = e.description if isinstance(e, LinkError) else str(e)
            self._refuse_link(link, st, cond, desc)
            return
        self.links[link] = handler
        st.links.add(handler)
        if link.state & Endpoint.LOCAL_UNINIT:
            link.open()
        if link.is_receiver and isinstance(handler, PublisherLink):
            handler.top_up()
        handler.on_flow()

    def _refuse_link(self, link: Link, st: ConnectionState, condition: str, description: str) -> None:
        addr = (link.remote_target if link.is_receiver else link.remote_source).address
        log.warning("link.refused", connection=st.id, address=addr, condition=condition, description=description)
        # Attach with a null terminus then detach with the error, as the spec asks.
        if link.is_receiver:
            link.target.type = Terminus.UNSPECIFIED
        else:
            link.source.type = Terminus.UNSPECIFIED
        link.open()
        link.condition = Condition(condition, description)
        link.close()

    def _attach(self, link: Link, st: ConnectionState) -> LinkHandler:
        if link.is_receiver:
            return self._attach_receiver(link, st)
        return self._attach_sender(link, st)

    def _copy_terminus(self, link: Link) -> None:
        if link.is_receiver:
            link.target.copy(link.remote_target)
            link.source.copy(link.remote_source)
        else:
            link.source.copy(link.remote_source)
            link.target.copy(link.remote_target)

    def _prefix_handler(self, address: str | None) -> AddressHandler | None:
        if not address:
            return None
        for prefix, h in self.address_handlers.items():
            if address.startswith(prefix):
                return h
        return None

    def _attach_receiver(self, link: Any, st: ConnectionState) -> LinkHandler:
        """The peer sends to us."""
        target = link.remote_target
        self._copy_terminus(link)
        link.max_message_size = self.config.max_message_size
        address = target.address
        ph = self._prefix_handler(address)
        if ph is not None:
            return ph(self, link, st, address or "")
        if address == MANAGEMENT:
            return ManagementLink(self, link, st)
        if target.dynamic:
            q = self._temp_queue(target.properties)
            link.target.address = q.name
            link.target.dynamic = True
            return PublisherLink(self, link, st, q.name)
        if address is None:
            return PublisherLink(self, link, st, None)  # anonymous relay
        if address not in self.wiring.queues and address not in self.wiring.exchanges:
            self._auto_create(address, target.properties)
        return PublisherLink(self, link, st, address)

    def _attach_sender(self, link: Any, st: ConnectionState) -> LinkHandler:
        """The peer receives from us."""
        source = link.remote_source
        self._copy_terminus(link)
        address = source.address
        ph = self._prefix_handler(address)
        if ph is not None:
            return ph(self, link, st, address or "")
        if address == EVENTS:
            h = EventsLink(self, link, st)
            self.events_links.add(h)
            return h
        if source.dynamic:
            q = self._temp_queue(source.properties)
            link.source.address = q.name
            return self._consumer(link, st, q, browse=False)
        if address is None:
            raise LinkError("amqp:invalid-field", "a receiving link needs a source address")
        if address in self.wiring.exchanges:
            return self._subscribe_exchange(link, st, address)
        found = self.wiring.queues.get(address)
        if found is None:  # (a Queue is falsy when empty: never `or` it)
            found = self._auto_create(address, source.properties)
        browse = source.distribution_mode == Terminus.DIST_MODE_COPY
        return self._consumer(link, st, found, browse)

    def _consumer(self, link: Any, st: ConnectionState, q: Queue, browse: bool) -> ConsumerLink:
        if q.locked:
            raise LinkError("amqp:resource-locked", f"queue {q.name!r} is not available on this broker")
        if q.options.exclusive and q.consumer_count > 0:
            raise LinkError("amqp:resource-locked", f"queue {q.name!r} is exclusive and already has a consumer")
        h = ConsumerLink(self, link, st, q, browse)
        link.source.distribution_mode = Terminus.DIST_MODE_COPY if browse else Terminus.DIST_MODE_MOVE
        self.consumers.setdefault(q, []).append(h)
        q.consumer_count += 1
        q.had_consumer = True
        self.auto_delete_timers.pop(q, None)
        return h

    def _subscribe_exchange(self, link: Any, st: ConnectionState, exchange: str) -> ConsumerLink:
        ex = self.wiring.exchange(exchange)
        key = binding_key_from_filter(link.remote_source.filter)
        if key is None:
            key = "#" if ex.type == "topic" else ""
        q = self._temp_queue(None)
        self.wiring.bind(exchange, q.name, key)
        return self._consumer(link, st, q, browse=False)

    def _temp_queue(self, properties: Any) -> Queue:
        args: dict[str, Any] = {"exclusive": True, "auto-delete": True}
        args.update(node_properties(properties))
        q, _ = self.wiring.declare_queue(f"temp.{uuidlib.uuid4()}", args, temporary=True)
        return q

    def _auto_create(self, address: str, properties: Any) -> Queue:
        if not self.config.auto_create_queues:
            raise LinkError("amqp:not-found", f"no queue or exchange named {address!r}")
        q, _ = self.wiring.declare_queue(address, node_properties(properties))
        return q

    @guarded
    def on_link_flow(self, event: Any) -> None:
        h = self.links.get(event.link)
        if h is not None:
            h.on_flow()

    @guarded
    def on_delivery(self, event: Any) -> None:
        h = self.links.get(event.link)
        if h is not None:
            h.on_delivery(event.delivery)

    @guarded
    def on_link_remote_close(self, event: Any) -> None:
        self._remote_detach(event.link)

    @guarded
    def on_link_remote_detach(self, event: Any) -> None:
        self._remote_detach(event.link)

    def _remote_detach(self, link: Link) -> None:
        if link in self.links:
            self._link_gone(link)
        if link.state & Endpoint.LOCAL_ACTIVE and link.connection in self.conns:
            link.close()

    def _link_gone(self, link: Link) -> None:
        h = self.links.pop(link, None)
        if h is None or h.closed:
            return
        h.closed = True
        h.conn.links.discard(h)
        self.woken.discard(h)
        h.on_detached()
        if isinstance(h, ConsumerLink):
            lst = self.consumers.get(h.queue)
            if lst is not None and h in lst:
                lst.remove(h)
                if not lst:
                    del self.consumers[h.queue]
            q = h.queue
            q.consumer_count -= 1
            if q.consumer_count == 0 and q.options.auto_delete and q.had_consumer and not q.deleted:
                self.auto_delete_timers[q] = time.time() + q.options.auto_delete_timeout
                if q.options.auto_delete_timeout == 0:
                    self.wake_call(lambda: self._auto_delete_now(q))

    def _auto_delete_now(self, q: Queue) -> None:
        if self.auto_delete_timers.get(q, 1e18) <= time.time() and q.consumer_count == 0 and not q.deleted:
            del self.auto_delete_timers[q]
            self._delete_queue(q)

    def _delete_queue(self, q: Queue) -> None:
        if q.name in self.wiring.queues and self.wiring.queues[q.name] is q:
            self.wiring.delete_queue(q.name)

    def close_link(self, link: Link, condition: str, description: str) -> None:
        self._link_gone(link)
        if link.state & Endpoint.LOCAL_ACTIVE:
            link.condition = Condition(condition, description)
            link.close()

    # ----- wiring events ----------------------------------------------------------------------------------------
    def wiring_changed(self, event: WiringEvent) -> None:
        if event.kind in ("declared", "deleted"):
            # Temporary (reply) queues come and go with every management client: debug level.
            temp = event.type == "queue" and event.name.startswith("temp.")
            (log.debug if temp else log.info)(f"wiring.{event.kind}", type=event.type, name=event.name,
                                               seq=event.seq, arguments=event.attributes.get("arguments"))
        else:
            a = event.attributes
            log.info(f"wiring.{event.kind}", exchange=a.get("source"), queue=a.get("destination"),
                     key=a.get("binding-key"), seq=event.seq, arguments=a.get("arguments"))
        if event.kind == "deleted" and event.type == "queue":
            for q in [q for q in self.consumers if q.name == event.name and q.deleted]:
                for c in list(self.consumers.get(q, [])):
                    self.close_link(c.link, "amqp:resource-deleted", f"queue {q.name!r} was deleted")
                self.consumers.pop(q, None)
                self.auto_delete_timers.pop(q, None)
                self.dirty.discard(q)
        for h in list(self.events_links):
            h.push(event)

    # ----- message flow -----------------------------------------------------------------------------------------
    def route_exchange(self, exchange: str, subject: str | None) -> list[Queue]:
        ex = self.wiring.exchanges[exchange]
        names = ex.route(subject)
        if names:
            ex.routed += 1
        else:
            ex.unrouted += 1
        qs = self.wiring.queues
        return [qs[n] for n in names if n in qs]

    def route_and_hold(self, pub: PublisherLink, delivery: Delivery, data: bytes) -> None:
        msg = decode_payload(data)
        address = pub.address
        if address is None:
            address = msg.to
            if not address:
                raise LinkError("amqp:precondition-failed", "anonymous relay needs a 'to' address on each message")
        targets = self.targets(address, msg)
        for q in targets:
            if not q.has_room(msg):
                raise QueueFull(f"queue {q.name} is full (max-count/max-size, policy reject)")
        routed = [(q, q.enqueue(msg)) for q in targets]
        for q, _ in routed:
            if q in self.consumers:
                self.dirty.add(q)
        if delivery.settled:  # pre-settled by the sender: at most once, nothing to hold
            pub.unsettled -= 1
            delivery.settle()
            return
        c = Completion(pub, delivery)
        if routed:
            for h in self.holders:
                if h.hold(c, routed):
                    c.pending += 1
        c.release()

    def targets(self, address: str, msg: Payload) -> list[Queue]:
        q = self.wiring.queues.get(address)
        if q is not None:
            return [q]
        if address in self.wiring.exchanges:
            return self.route_exchange(address, msg.subject)
        raise LinkError("amqp:not-found", f"no queue or exchange named {address!r}")

    def dead_letter(self, q: Queue, entry: Entry) -> None:
        alt = q.options.alternate_exchange
        if alt is None or alt not in self.wiring.exchanges:
            return
        for target in self.route_exchange(alt, entry.msg.subject):
            if target is not q and target.has_room(entry.msg):
                target.enqueue(entry.msg)
                if target in self.consumers:
                    self.dirty.add(target)

    def settle_later(self, c: Completion) -> None:
        self.to_settle.append(c)

    def wake_queue(self, q: Queue) -> None:
        self.dirty.add(q)

    def wake(self, h: LinkHandler) -> None:
        self.woken.add(h)

    def wake_call(self, fn: Callable[[], None]) -> None:
        self.on_quiesced_once.append(fn)

    @guarded
    def on_reactor_quiesced(self, event: Any) -> None:
        self.quiesce()

    def quiesce(self) -> None:
        """Once per reactor pass: dispatch, settle, deferred link work."""
        # Repeat until nothing is left: dispatching can settle, settling can free credit.
        for _ in range(100):
            if not (self.dirty or (self.to_settle and self._fences_pass()) or self.woken
                    or self.on_quiesced_once):
                break
            if self.to_settle and self._fences_pass():
                batch, self.to_settle = self.to_settle, []
                self._settle(batch)
            if self.dirty:
                dirty, self.dirty = self.dirty, set()
                for q in dirty:
                    if not q.deleted:
                        self.dispatch(q)
            if self.woken:
                woken, self.woken = self.woken, set()
                for h in woken:
                    if not h.closed:
                        h.run()
            if self.on_quiesced_once:
                calls, self.on_quiesced_once = self.on_quiesced_once, []
                for fn in calls:
                    fn()
        for fn in self.on_quiesced:
            fn()

    def _fences_pass(self) -> bool:
        if all(f() for f in self.settle_fences):
            return True
        if self._fence_retry is None and not self._stopping:
            self._fence_retry = self.schedule(0.05, self._retry_fenced)
        return False

    def _retry_fenced(self) -> None:
        self._fence_retry = None
        self.quiesce()

    def _settle(self, batch: list[Completion]) -> None:
        n = 0
        publishers = set()
        for c in batch:
            pub = c.publisher
            if pub.closed:
                continue
            pub.settled(c.delivery)
            publishers.add(pub)
            n += 1
        for pub in publishers:  # credit once per link and batch, not per message
            pub.top_up()
        if n:
            now = time.time()
            role_epoch = self.role_epoch()
            if self._settled_count and role_epoch != self._settled_as:
                self._flush_settled_log()  # a window never spans a role or epoch change
            if self._settled_count == 0:
                self._settled_first = now
                self._settled_as = role_epoch
            self._settled_count += n
            self._settled_last = now

    def _flush_settled_log(self, force: bool = False) -> None:
        if self._settled_count:
            role, epoch = self._settled_as  # as they were when these deliveries were settled
            fast.info("client.settled", {"count": self._settled_count, "first_ts": self._settled_first,
                                         "last_ts": self._settled_last, "epoch": epoch, "role": role})
            self._settled_count = 0

    def dispatch(self, q: Queue) -> None:
        consumers = self.consumers.get(q)
        if not consumers:
            return
        movers = [c for c in consumers if not c.browse and c.sender.credit > 0]
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
                if c.sender.credit <= 0:
                    movers.remove(c)
                else:
                    i += 1
            consumers.append(consumers.pop(0))
        for b in consumers:
            if b.browse:
                while b.sender.credit > 0:
                    e = q.browse_after(b.cursor)
                    if e is None:
                        break
                    b.cursor = e.position
                    b.send(e)
        for c in consumers:
            if c.sender.drain_mode and c.sender.credit > 0:
                c.sender.drained()

    # ----- management -------------------------------------------------------------------------------------------
    def broker_attributes(self) -> dict[str, Any]:
        role, epoch = self.role_epoch()
        attrs: dict[str, Any] = {
            "name": self.id,
            "type": "broker",
            "product": "understudy",
            "version": __version__,
            "address": f"{self.config.host}:{self.port}",
            "uptime": round(time.time() - self.started, 3),
            "connections": len(self.conns),
            "queues": len(self.wiring.queues),
            "exchanges": len(self.wiring.exchanges),
            "role": role,
            "epoch": epoch,
            "seq": self.wiring.seq,
        }
        for p in self.attribute_providers:
            attrs.update(p())
        return attrs

    def deliver_reply(self, reply_to: str, msg: Message, conn: ConnectionState | None = None) -> bool:
        """Put a reply on the queue named `reply_to` (dynamic reply queues are ordinary temporary queues)."""
        q = self.wiring.queues.get(reply_to)
        if q is None:
            return False
        data = msg.encode()
        try:
            q.enqueue(decode_payload(data))
        except QueueFull:
            return False
        if q in self.consumers:
            self.dirty.add(q)
        return True

    # ----- logging helpers (rate limited; never per message) ----------------------------------------------------
    def log_link_refused(self, h: LinkHandler, condition: str, description: str) -> None:
        addr = getattr(h, "address", None)
        log.warning("link.refused", connection=h.conn.id, address=addr, condition=condition, description=description)

    def log_message_rejected(self, h: PublisherLink, condition: str, description: str) -> None:
        now = time.time()
        key = id(h)
        if now - self._msg_reject_log.get(key, 0.0) >= 1.0:
            self._msg_reject_log[key] = now
            log.warning(
                "message.rejected",
                connection=h.conn.id,
                address=h.address,
                condition=condition,
                description=description,
                count=h.rejected_since_log,
            )
            h.rejected_since_log = 0


def _remote(c: Connection) -> str:
    try:
        return f"{c.url.host}:{c.url.port}"  # type: ignore[attr-defined]
    except Exception:
        return ""
