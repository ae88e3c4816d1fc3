"""The broker: its lifecycle, the end of each event-loop pass, and settlement, on the engine's event loop.

Everything runs on the loop thread. A pass of the loop first hands each link its deliveries (publishers route and
enqueue as they read), then calls `quiesce` once: dispatch to consumers of the queues that changed, settle the
client deliveries nobody holds any more, run the links that asked for it, and let the extensions (HA) batch what
the pass gathered. The engine writes every connection's output right after.

Parts: broker.connections (the rare events of accepted connections: opens, attaches, closes), broker.router (where
messages go), broker.links (the hot path of each link), broker.extension (what the HA layer plugs in).
"""

from __future__ import annotations

import itertools
import resource
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from proton import Endpoint, SSLDomain

from broker import __version__
from broker.access import Access
from broker.attach import Attacher
from broker.auth import User
from broker.config import BrokerConfig
from broker.connections import Connections, ConnectionState
from broker.engine import Engine
from broker.extension import Extension
from broker.links import (
    AcceptCompletion,
    AcceptToken,
    Completion,
    ConsumerLink,
    EventsLink,
    LinkHandler,
    PublisherLink,
)
from broker.log import fast, get_logger
from broker.management import Management, Request, Response
from broker.memory import MemoryBound
from broker.queue import Queue
from broker.router import Router
from broker.store.store import Store
from broker.tls import ServerTls, TlsError, cert_subject
from broker.tls import config_problems as tls_config_problems
from broker.tls import domains as tls_domains
from broker.tls import from_config as tls_from_config
from broker.transactions import Transactions
from broker.wiring import Wiring, WiringEvent

log = get_logger("broker")

FAST_LOG_FLUSH = 0.2  # seconds between writes of batched event lines (lag samples, settle windows)
FENCE_RETRY = 0.05  # seconds between retries of what an extension holds back (may_settle, dispatch_fence)

_conn_ids = itertools.count(1)


class Server:
    def __init__(self, config: BrokerConfig, broker_id: str, users: dict[str, User] | None = None) -> None:
        self.config = config
        self.id = broker_id
        self.users = users or {}
        self.started = time.time()
        self.wiring = Wiring()
        self.wiring.observers.append(self)
        self.management = Management(self.wiring, self.broker_attributes)
        # TLS (broker.tls): the listener's domain, and the one this broker connects to the others with.
        self.tls: ServerTls | None = tls_from_config(config)
        self.ssl_server: SSLDomain | None = None
        self.ssl_client: SSLDomain | None = None
        if self.tls is not None:
            self.ssl_server, self.ssl_client = tls_domains(self.tls)
        self.engine = Engine(broker_id)
        self.engine.on_pass = self.quiesce
        self.engine.on_failure = self._handler_failed
        self.extensions: list[Extension] = []
        self.port: int | None = None
        self.sasl_dir: Path | None = None
        self.consumers: dict[Queue, list[ConsumerLink]] = {}
        self.events_links: set[EventsLink] = set()
        self.dirty: set[Queue] = set()
        self.woken: set[LinkHandler] = set()
        self.to_settle: list[Completion] = []
        self.accepts_to_settle: list[AcceptCompletion] = []  # consumer accepts whose holders released them
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
        # The durable store (a journal under --data-dir), first of the extensions: its commit at the end of a pass
        # comes before the HA layer's work, which may wait for it (a backup acknowledges what is on disk).
        self.store: Store | None = None
        if config.data_dir is not None and config.journal:
            self.store = Store(self, config.data_dir / "journal", config.journal_segment_bytes, config.max_memory,
                               config.journal_stall_halt, config.min_disk_free)
            self.extensions.append(self.store)
        # --max-memory: flow to disk and refusals beyond it (after the store's commit: it pages what was written).
        self.memory: MemoryBound | None = None
        if config.max_memory:
            self.memory = MemoryBound(self, config.max_memory)
            self.extensions.append(self.memory)
        self.refusing = False  # the router checks each message (journal failed, or memory over the bound)
        self.attacher = Attacher(self)
        self.access = Access(self)  # --acl-file (broker.access): installed by the command before start
        self.transactions = Transactions(self)
        self.connections = Connections(self)
        self.router = Router(self)
        # The hot path calls these through the server: bound once.
        self.route = self.router.route
        self.dead_letter = self.router.dead_letter
        self.dispatch = self.router.dispatch
        self.deliver_reply = self.router.deliver_reply
        self.close_link = self.connections.close_link

    # ----- lifecycle --------------------------------------------------------------------------------------------
    def add_extension(self, ext: Extension) -> None:
        self.extensions.append(ext)

    def start(self) -> None:
        """Recover the durable store, listen (raises OSError when the address is taken), tell the extensions."""
        if self.store is not None:
            report = self.store.recover()
            if report.cut:
                log.warning("journal.torn_tail", bytes=report.cut, description=report.cut_reason)
            log.info("journal.recovered", segments=report.segments, queues=report.queues, messages=report.messages,
                     bytes=report.bytes, exchanges=report.exchanges, bindings=report.bindings,
                     seconds=report.seconds)
        self.port = self.engine.listen(self.config.host, self.config.port, self.connections.accepted,
                                       self.ssl_server, tls_only=self.tls is not None and not self.tls.allow_plain)
        self.schedule(1.0, self._tick)
        self.schedule(FAST_LOG_FLUSH, self._flush_fast_log)
        log.info(
            "broker.started",
            address=f"{self.config.host}:{self.port}",
            version=__version__,
            ha_cluster=self.config.ha_cluster,
            data_dir=str(self.config.data_dir) if self.config.data_dir else None,
            max_open_files=resource.getrlimit(resource.RLIMIT_NOFILE)[0],
        )
        if self.tls is not None:
            log.info("tls.enabled", address=f"{self.config.host}:{self.port}", tls=self.tls.mode,
                     client_cert=self.tls.require_client_cert, subject=cert_subject(self.tls.cert),
                     path=str(self.tls.cert))
        for ext in self.extensions:
            ext.started(self)

    def run(self) -> None:
        self.start()
        try:
            self.engine.run()
        finally:
            if self.store is not None:
                self.store.close()
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
            refusal = next((r for ext in self.extensions if (r := ext.management_refusal(req)) is not None), None)
            if refusal is not None:
                log.warning("management.refused", operation=req.operation, type=req.type, name=req.name,
                            status=refusal.status, description=refusal.description, user=req.user)
                return refusal
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
        for st in self.connections.states():
            self.connections.close(st, "amqp:connection:forced", f"broker shutting down ({reason})")
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

    def auto_delete_now(self, q: Queue) -> None:
        if self.auto_delete_timers.get(q, 1e18) <= time.time() and q.consumer_count == 0 and not q.deleted:
            del self.auto_delete_timers[q]
            self._delete_queue(q)

    def _delete_queue(self, q: Queue) -> None:
        if self.wiring.queues.get(q.name) is q:
            self.wiring.delete_queue(q.name)

    @property
    def conns(self) -> dict[Any, ConnectionState]:
        return self.connections.conns

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

    def refresh_refusing(self) -> None:
        self.refusing = (self.store is not None and self.store.refusing() is not None) or (
            self.memory is not None and self.memory.over)

    def wake_queue(self, q: Queue) -> None:
        self.dirty.add(q)

    def wake(self, h: LinkHandler) -> None:
        self.woken.add(h)

    def wake_call(self, fn: Callable[[], None]) -> None:
        """Run `fn` at the end of this pass (or the next one, when called outside a pass)."""
        self._on_pass_once.append(fn)

    def reload_tls(self) -> None:
        """SIGHUP (on the loop thread): read the certificate, key, CA and passphrase files again, with the start-up
        checks; connections accepted from now on use them. A bad file keeps the ones in use (certificate rotation
        without a restart)."""
        if self.tls is None:
            return
        problems = tls_config_problems(self.config)
        try:
            if problems:
                raise TlsError("; ".join(problems))
            tls = tls_from_config(self.config)
            assert tls is not None
            ssl_server, ssl_client = tls_domains(tls)
        except TlsError as e:
            log.error("tls.reload_failed", description=f"{e}; the certificates in use stay")
            return
        self.tls, self.ssl_server, self.ssl_client = tls, ssl_server, ssl_client
        self.engine.set_listener_ssl(ssl_server)
        log.info("tls.reloaded", subject=cert_subject(tls.cert), path=str(tls.cert))

    def quiesce(self) -> None:
        """Once per pass: dispatch, deferred link work, the extensions' end-of-pass work, settlement; repeated
        until nothing is left (dispatching can settle, settling can free credit, replication can release)."""
        exts = self.extensions
        router = self.router
        for _ in range(100):
            did = False
            if router.groups:  # first: the pass's deliveries are held before anything can dequeue or settle them
                router.hold_groups()
                did = True
            if self.dirty:
                dirty, self.dirty = self.dirty, set()
                for ext in exts:
                    held = ext.dispatch_fence()
                    if held is not None:
                        dirty = self._hold_dispatch(dirty, held)
                for q in dirty:
                    if not q.deleted:
                        self.dispatch(q)
                if dirty:
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
            if self.accepts_to_settle and self._fences_pass():
                accepts, self.accepts_to_settle = self.accepts_to_settle, []
                for a in accepts:
                    if not a.consumer.closed:
                        a.consumer.answer(a)
                did = True
            if not did:
                return

    def hold_accept(self, token: AcceptToken, queue: Queue) -> bool:
        """A consumer waiting for our settlement accepted a message of `queue`, or a commit dequeued messages of
        `queue`: may an extension hold the answer?"""
        held = False
        for ext in self.extensions:
            if ext.hold_accept(token, queue):
                if held:
                    raise RuntimeError("two extensions hold one accept")  # one token, one release
                held = True
        return held

    def _hold_dispatch(self, dirty: set[Queue], held: Callable[[Queue], bool]) -> set[Queue]:
        """Keep the queues an extension's dispatch fence holds dirty (retried in FENCE_RETRY); the rest go now."""
        keep = {q for q in dirty if held(q)}
        if not keep:
            return dirty
        self.dirty |= keep
        self._retry_fenced_later()
        return dirty - keep

    def _fences_pass(self) -> bool:
        if all(ext.may_settle() for ext in self.extensions):
            return True
        self._retry_fenced_later()
        return False

    def _retry_fenced_later(self) -> None:
        """An extension's fence (settling, dispatching) held work back: the pass is retried in FENCE_RETRY."""
        if self._fence_retry is None and not self._stopping:
            self._fence_retry = self.schedule(FENCE_RETRY, self._retry_fenced)

    def _retry_fenced(self) -> None:
        self._fence_retry = None
        self.quiesce()

    def _settle(self, batch: list[Completion]) -> None:
        n = 0
        publishers = set()
        for c in batch:
            if c.keys is not None or c.followers is not None:
                self._answered(c)
            pub = c.publisher
            if pub.closed:
                continue
            if c.error is not None:
                pub.settle_rejected(c.delivery, *c.error)
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

    def _answered(self, c: Completion) -> None:
        """A windowed message is answered: forget it, and answer the resends that waited for it the same way."""
        if c.keys is not None:
            unconfirmed = self.router.unconfirmed
            for k in c.keys:
                if unconfirmed.get(k) is c:
                    del unconfirmed[k]
        for f in c.followers or ():
            if c.error is not None:
                f.fail(*c.error)
            else:
                f.release()

    def _flush_settled_log(self, force: bool = False) -> None:
        if self._settled_count:
            role, epoch = self._settled_as  # as they were when these deliveries were settled
            fast.info("client.settled", {"count": self._settled_count, "first_ts": self._settled_first,
                                         "last_ts": self._settled_last, "epoch": epoch, "role": role})
            self._settled_count = 0

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
            "connections": len(self.connections),
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
