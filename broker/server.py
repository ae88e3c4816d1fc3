"""The broker: connections, routing, dispatch to consumers and settlement, on the engine's event loop.

Everything runs on the loop thread. A pass of the loop first hands each link its deliveries (publishers route and
enqueue as they read), then calls `quiesce` once: dispatch to consumers of the queues that changed, settle the
client deliveries nobody holds any more, run the links that asked for it, and let the extensions (HA) batch what
the pass gathered. The engine writes every connection's output right after.
"""

from __future__ import annotations

import functools
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from proton import Condition, Endpoint, Link, Message, Terminus

from broker import __version__
from broker.attach import Attacher
from broker.auth import SaslSetup, User
from broker.client import KIND_PROPERTY  # connection property: client | admin | ha
from broker.config import BrokerConfig
from broker.engine import Conn, Engine, raw
from broker.errors import LinkError, NoRoute, QueueFull, Refusal, WiringError
from broker.extension import Extension
from broker.links import Completion, ConsumerLink, EventsLink, LinkHandler, PublisherLink
from broker.log import fast, get_logger
from broker.management import Management, Request, Response
from broker.message import current_properties, current_subject, current_to, decode
from broker.queue import Queue
from broker.wiring import Wiring, WiringEvent

log = get_logger("broker")

FAST_LOG_FLUSH = 0.2  # seconds between writes of batched event lines (lag samples, settle windows)
FENCE_RETRY = 0.05  # seconds between retries of settlements an extension holds back (may_settle)

_conn_ids = itertools.count(1)


@dataclass(eq=False)
class ConnectionState:
    conn: Conn
    id: int = field(default_factory=lambda: next(_conn_ids))
    remote: str = ""
    user: str | None = None
    admin: bool = False
    kind: str = "client"
    properties: dict[Any, Any] = field(default_factory=dict)
    links: set[LinkHandler] = field(default_factory=set)
    unsettled_returned: int = 0
    refused: bool = False

    @property
    def connection(self) -> Any:
        return self.conn.connection


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
        self.engine = Engine(broker_id)
        self.engine.on_pass = self.quiesce
        self.engine.on_failure = self._handler_failed
        self.attacher = Attacher(self)
        self.extensions: list[Extension] = []
        self.port: int | None = None
        self.sasl_dir: Path | None = None
        self.conns: dict[Any, ConnectionState] = {}  # pn_connection_t* -> state
        self.links: dict[Any, LinkHandler] = {}  # pn_link_t* -> handler
        self.consumers: dict[Queue, list[ConsumerLink]] = {}
        self.events_links: set[EventsLink] = set()
        self.dirty: set[Queue] = set()
        self.woken: set[LinkHandler] = set()
        self.to_settle: list[Completion] = []
        self.auto_delete_timers: dict[Queue, float] = {}
        self._on_pass_once: list[Callable[[], None]] = []
        self._fence_retry: Any = None
        # client.settled window
        self._settled_count = 0
        self._settled_first = 0.0
        self._settled_last = 0.0
        self._settled_as: tuple[str, int] = ("standalone", 0)
        self._msg_reject_log: dict[int, float] = {}
        self._stopping = False

    # ----- lifecycle --------------------------------------------------------------------------------------------
    def add_extension(self, ext: Extension) -> None:
        self.extensions.append(ext)

    def start(self) -> None:
        """Listen (raises OSError when the address is taken) and tell the extensions."""
        self.port = self.engine.listen(self.config.host, self.config.port, self._accepted)
        self.schedule(1.0, self._tick)
        self.schedule(FAST_LOG_FLUSH, self._flush_fast_log)
        log.info(
            "broker.started",
            address=f"{self.config.host}:{self.port}",
            version=__version__,
            ha_cluster=self.config.ha_cluster,
            data_dir=str(self.config.data_dir) if self.config.data_dir else None,
        )
        for ext in self.extensions:
            ext.started(self)

    def run(self) -> None:
        self.start()
        try:
            self.engine.run()
        finally:
            self.engine.close()

    def role_epoch(self) -> tuple[str, int]:
        for ext in self.extensions:
            r = ext.role_epoch()
            if r is not None:
                return r
        return ("standalone", 0)

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
        return self.engine.schedule(delay, fn)

    def call_soon_threadsafe(self, fn: Callable[[], None]) -> None:
        """Run `fn` on the loop thread (from any thread, or a signal handler)."""
        self.engine.call_soon_threadsafe(fn)

    def shutdown(self, reason: str) -> None:
        self.call_soon_threadsafe(lambda: self._shutdown(reason))

    def _shutdown(self, reason: str) -> None:
        if self._stopping:
            return
        self._stopping = True
        log.info("broker.stopping", reason=reason)
        for ext in self.extensions:
            ext.stopping()
        self.engine.close_listeners()
        for st in list(self.conns.values()):
            c = st.connection
            if c.state & Endpoint.LOCAL_ACTIVE:
                c.condition = Condition("amqp:connection:forced", f"broker shutting down ({reason})")
                c.close()
        for conn in list(self.engine.conns.values()):  # outgoing ones (a backup's link to its primary)
            if conn.connection.state & Endpoint.LOCAL_ACTIVE:
                conn.connection.close()
        self._flush_settled_log(force=True)
        fast.flush()
        self._stop_when_flushed(time.monotonic() + 2.0)

    def _stop_when_flushed(self, deadline: float) -> None:
        """Stop the loop once every client has been sent its close frame (or at the deadline): clients learn at
        once that the broker went away, instead of from a dropped socket."""
        if self.engine.pending_output() and time.monotonic() < deadline:
            self.schedule(0.02, lambda: self._stop_when_flushed(deadline))
            return
        self.engine.stop()

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
                if q in self.consumers:
                    self.dirty.add(q)
        for q, due in list(self.auto_delete_timers.items()):
            if due <= now:
                del self.auto_delete_timers[q]
                if q.consumer_count == 0 and not q.deleted:
                    self._delete_queue(q)
        self._flush_settled_log()
        if not self._stopping:
            self.schedule(1.0, self._tick)

    def _handler_failed(self, handler: Any, where: str, exc: BaseException) -> None:
        log.error("broker.error", where=where, handler=type(handler).__name__, exc_info=exc)
        if isinstance(handler, LinkHandler) and not handler.closed:
            try:
                self.close_link(handler.link, "amqp:internal-error", f"{type(exc).__name__}: {exc}")
            except Exception:
                log.error("broker.error", where="cleanup", exc_info=True)

    # ----- connections ------------------------------------------------------------------------------------------
    def _accepted(self, conn: Conn) -> Server:
        """A new socket: set up SASL before the first byte is read. This server handles its events."""
        sasl = conn.transport.sasl()
        sasl.allow_insecure_mechs = True
        if self.sasl_dir is not None:
            sasl.config_path(str(self.sasl_dir))
            sasl.config_name(SaslSetup.CONFIG_NAME)
        sasl.allowed_mechs(" ".join(self.config.sasl_mechanisms))
        return self

    @guarded
    def on_connection_remote_open(self, event: Any) -> None:
        c = event.connection
        conn = self.engine.conn_of(c)
        if conn is None or c._impl in self.conns:
            return
        st = ConnectionState(conn)
        conn.state = st
        st.remote = conn.remote
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
        self.conns[c._impl] = st
        c.offered_capabilities = ["ANONYMOUS-RELAY"]
        props_out: dict[str, Any] = {"product": "understudy", "version": __version__, "x-understudy-broker": self.id}
        for ext in self.extensions:
            props_out.update(ext.connection_properties())
        c.properties = props_out
        try:
            for ext in self.extensions:
                ext.admit(st)
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
        if event.connection._impl in self.conns:
            event.session.open()

    @guarded
    def on_session_remote_close(self, event: Any) -> None:
        if event.connection._impl in self.conns:
            ssn = event.session
            for h in list(self.links.values()):
                if h.link.session == ssn:
                    self._link_gone(h.link)
            ssn.close()

    @guarded
    def on_connection_remote_close(self, event: Any) -> None:
        c = event.connection
        if c._impl in self.conns:
            self._connection_gone(c)
            c.close()

    @guarded
    def on_transport_error(self, event: Any) -> None:
        # Failed logins end here, before any connection opens: say so (the client only sees its own error).
        c, t = event.connection, event.transport
        cond = t.condition if t is not None else None
        if cond is not None and cond.name == "amqp:unauthorized-access" and c is not None \
                and c._impl not in self.conns:
            conn = self.engine.conn_of(c)
            log.warning("connection.refused", remote=conn.remote if conn else "", condition=cond.name,
                        description=cond.description, user=t.user if t is not None else None)

    @guarded
    def on_transport_closed(self, event: Any) -> None:
        c = event.connection
        if c is not None and c._impl in self.conns:
            self._connection_gone(c)

    def _connection_gone(self, c: Any) -> None:
        st = self.conns.pop(c._impl, None)
        if st is None:
            return
        for h in [h for h in self.links.values() if h.conn is st]:
            self._link_gone(h.link)
        for ext in self.extensions:
            ext.connection_closed(st)
        if not st.refused:
            err = c.remote_condition.name if c.remote_condition else None
            log.info("connection.closed", connection=st.id, error=err, unsettled_returned=st.unsettled_returned)

    # ----- links ------------------------------------------------------------------------------------------------
    @guarded
    def on_link_remote_open(self, event: Any) -> None:
        link = event.link
        st = self.conns.get(event.connection._impl)
        if st is None or link._impl in self.links:
            return
        try:
            handler = self.attacher.attach(link, st)
        except (LinkError, WiringError) as e:
            self._refuse_link(link, st, e.condition, e.description)
            return
        self.links[link._impl] = handler
        self.engine.add_fast(link, handler)
        st.links.add(handler)
        if link.state & Endpoint.LOCAL_UNINIT:
            link.open()
        if isinstance(handler, PublisherLink):
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

    @guarded
    def on_link_remote_close(self, event: Any) -> None:
        self._remote_detach(event.link)

    @guarded
    def on_link_remote_detach(self, event: Any) -> None:
        self._remote_detach(event.link)

    def _remote_detach(self, link: Link) -> None:
        if link._impl in self.links:
            self._link_gone(link)
        if link.state & Endpoint.LOCAL_ACTIVE and link.connection._impl in self.conns:
            link.close()

    def _link_gone(self, link: Link) -> None:
        h = self.links.pop(link._impl, None)
        self.engine.remove_fast(link)
        if h is None or h.closed:
            return
        h.closed = True
        h.conn.links.discard(h)
        self.woken.discard(h)
        h.on_detached()
        if isinstance(h, ConsumerLink):
            self.attacher.consumer_gone(h)

    def auto_delete_now(self, q: Queue) -> None:
        if self.auto_delete_timers.get(q, 1e18) <= time.time() and q.consumer_count == 0 and not q.deleted:
            del self.auto_delete_timers[q]
            self._delete_queue(q)

    def _delete_queue(self, q: Queue) -> None:
        if self.wiring.queues.get(q.name) is q:
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

    def route(self, pub: PublisherLink, d: Any, data: bytes) -> None:
        """Route one received message (raises MessageRefused), then settle it or hold it for the extensions."""
        meta = decode(data)
        address = pub.address
        if address is None:
            address = current_to()
            if not address:
                raise NoRoute("amqp:precondition-failed", "anonymous relay needs a 'to' address on each message")
        q = self.wiring.queues.get(address)
        if q is not None:
            targets: list[Queue] = [q]
        elif address in self.wiring.exchanges:
            targets = self.route_exchange(address, current_subject())
        else:
            raise NoRoute("amqp:not-found", f"no queue or exchange named {address!r}")
        size = len(data)
        for q in targets:
            if not q.has_room(size):
                raise QueueFull(f"queue {q.name} is full (max-count/max-size, policy reject)")
        routed = []
        consumers = self.consumers
        for q in targets:
            key = None
            lvq = q.options.lvq_key
            if lvq is not None:
                props = current_properties()
                key = props.get(lvq) if props else None
            routed.append((q, q.enqueue(data, meta.priority, meta.expires, meta.durable, key)))
            if q in consumers:
                self.dirty.add(q)
        if raw.delivery_settled(d):  # pre-settled by the sender: at most once, nothing to hold
            pub.unsettled -= 1
            raw.delivery_settle(d)
            self.woken.add(pub)
            return
        c = Completion(pub, d)
        if routed and self.extensions:
            for ext in self.extensions:
                if ext.hold(c, routed):
                    c.pending += 1
        c.release()

    def dead_letter(self, q: Queue, data: bytes) -> None:
        """A message `q`'s consumer rejected goes to the queue's alternate exchange, if it has one."""
        alt = q.options.alternate_exchange
        if alt is None or alt not in self.wiring.exchanges or not data:
            return
        meta = decode(data, trusted=True)
        for target in self.route_exchange(alt, current_subject()):
            if target is not q and target.has_room(len(data)):
                target.enqueue(data, meta.priority, meta.expires, meta.durable)
                if target in self.consumers:
                    self.dirty.add(target)

    def wake_queue(self, q: Queue) -> None:
        self.dirty.add(q)

    def wake(self, h: LinkHandler) -> None:
        self.woken.add(h)

    def wake_call(self, fn: Callable[[], None]) -> None:
        """Run `fn` at the end of this pass (or the next one, when called outside a pass)."""
        self._on_pass_once.append(fn)

    def quiesce(self) -> None:
        """Once per pass: dispatch, deferred link work, the extensions' end-of-pass work, settlement; repeated
        until nothing is left (dispatching can settle, settling can free credit, replication can release)."""
        exts = self.extensions
        for _ in range(100):
            did = False
            if self.dirty:
                dirty, self.dirty = self.dirty, set()
                for q in dirty:
                    if not q.deleted:
                        self.dispatch(q)
                did = True
            if self.woken:
                woken, self.woken = self.woken, set()
                for h in woken:
                    if not h.closed:
                        h.run()
                did = True
            if self._on_pass_once:
                calls, self._on_pass_once = self._on_pass_once, []
                for fn in calls:
                    fn()
                did = True
            for ext in exts:
                if ext.end_of_pass():
                    did = True
            if self.to_settle and self._fences_pass():
                batch, self.to_settle = self.to_settle, []
                self._settle(batch)
                did = True
            if not did:
                return

    def _fences_pass(self) -> bool:
        if all(ext.may_settle() for ext in self.extensions):
            return True
        if self._fence_retry is None and not self._stopping:
            self._fence_retry = self.schedule(FENCE_RETRY, self._retry_fenced)
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
            pub.settle(c.delivery)
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
            "loop-passes": self.engine.passes,
        }
        for ext in self.extensions:
            attrs.update(ext.attributes())
        return attrs

    def deliver_reply(self, reply_to: str, msg: Message, conn: ConnectionState | None = None) -> bool:
        """Put a reply on the queue named `reply_to` (dynamic reply queues are ordinary temporary queues)."""
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
