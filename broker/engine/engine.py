"""The broker's own event loop over proton-C: epoll, sockets, transports pumped by hand, events dispatched by type.

Why not proton's reactor: it wraps every event in Python objects and dispatches through two handler trees (~25 µs
per event), and writes output only one `select` round after it was produced. Here one *pass* is:

1. `epoll.poll`; each readable socket is read once and its bytes pushed into the transport (frames are decoded in C
   and events queue up in one collector); due timers, transport ticks and calls from other threads run;
2. the collector is drained: the hot events (a delivery or credit on a link in the fast table) go straight to the
   link's handler with the raw delivery pointer, output events only mark their connection, and the rare ones
   (opens, attaches, closes, errors) are wrapped in proton's `Event` and handed to the connection's handler by
   method name (`on_link_remote_open(event)` ...), as proton's reactor would;
3. the application's end-of-pass work runs (`on_pass`: dispatch to consumers, replication batches, settlements),
   and 2-3 repeat until nothing is left;
4. every connection with output writes it now (peek, send, pop), so a message that arrived in this pass leaves in
   this pass; a socket that cannot take it all waits for EPOLLOUT.

Single-threaded: everything runs on the loop thread; other threads use `call_soon_threadsafe`.
"""

from __future__ import annotations

import contextlib
import errno
import heapq
import itertools
import os
import resource
import select
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from cproton_ffi import ffi, lib
from proton import SSL, Condition, Connection, Event, SSLDomain, Transport
from proton._events import EventType

from broker.engine.refusal import MAX_OPEN as MAX_REFUSALS
from broker.engine.refusal import PlainRefusal
from broker.engine.timers import Calls, Timer, Timers
from broker.log import get_logger

log = get_logger("broker.engine")

NULL = ffi.NULL
EPOLLIN = select.EPOLLIN
EPOLLOUT = select.EPOLLOUT
EPOLLERRS = select.EPOLLERR | select.EPOLLHUP

READ_SIZE = 1 << 16
TLS_RECORD_HANDSHAKE = b"\x16"  # the first byte of a TLS ClientHello record
AMQP_TLS_HEADER = b"AMQP\x02\x01\x00\x00"  # AMQP's own "TLS follows" header (proton accepts it too)
CLOSE_GRACE = 2.0  # seconds a locally closed connection may wait for its peer before the socket is dropped
MAX_PASS_ROUNDS = 100  # event/end-of-pass rounds per pass (each round is cheap; this only bounds a bug)
ACCEPT_PAUSE = 0.1  # seconds a listener rests after the system refused a new socket; doubled up to the next
ACCEPT_PAUSE_MAX = 2.0
AFTER_FLUSH_ROUNDS = 8  # after-flush rounds per pass (a sync releases work, whose pass may journal and sync again)

_pn = lib
_PN_DELIVERY = lib.PN_DELIVERY
_PN_LINK_FLOW = lib.PN_LINK_FLOW
_PN_TRANSPORT = lib.PN_TRANSPORT
_PN_TRANSPORT_CLOSED = lib.PN_TRANSPORT_CLOSED
_PN_CONNECTION_LOCAL_CLOSE = lib.PN_CONNECTION_LOCAL_CLOSE
_PN_LINK_FINAL = lib.PN_LINK_FINAL

# Rare events handed to handlers (wrapped); every other event type is dropped without a Python object.
_SLOW = frozenset({
    lib.PN_CONNECTION_REMOTE_OPEN, lib.PN_CONNECTION_REMOTE_CLOSE,
    lib.PN_SESSION_REMOTE_OPEN, lib.PN_SESSION_REMOTE_CLOSE,
    lib.PN_LINK_REMOTE_OPEN, lib.PN_LINK_REMOTE_CLOSE, lib.PN_LINK_REMOTE_DETACH,
    lib.PN_LINK_FLOW, lib.PN_DELIVERY,
    lib.PN_TRANSPORT_ERROR, lib.PN_TRANSPORT_TAIL_CLOSED, lib.PN_TRANSPORT_CLOSED,
})


_METHODS = {t: EventType.TYPES[t].method for t in _SLOW}


class FastLink(Protocol):
    """A link on the hot path: its deliveries and credit changes arrive raw (see broker.engine.raw)."""

    def on_delivery(self, delivery: Any) -> None: ...
    def on_flow(self) -> None: ...


@dataclass
class Resting:
    """A listener that cannot accept (out of descriptors): since when, how many tries failed."""

    since: float
    failures: int = 0


class HandlerFailed(Protocol):
    def __call__(self, handler: Any, where: str, exc: BaseException) -> None: ...


def _now_ms() -> int:
    return int(time.monotonic() * 1000)


class Conn:
    """One AMQP connection: a socket, a proton transport and connection, and the handler of its rare events."""

    __slots__ = ("c", "closed", "closing", "connecting", "connection", "engine", "fd", "handler", "heap_due", "mask",
                 "outgoing", "remote", "sniff", "sock", "state", "t", "tick_due", "tls", "transport")

    def __init__(self, engine: Engine, sock: socket.socket, transport: Transport, connection: Connection,
                 handler: Any, remote: str, outgoing: bool) -> None:
        self.engine = engine
        self.sock = sock
        self.fd = sock.fileno()
        self.transport = transport
        self.connection = connection
        self.t = transport._impl
        self.c = connection._impl
        self.handler = handler
        self.remote = remote
        self.outgoing = outgoing
        self.connecting = False
        self.closed = False
        self.closing: Timer | None = None
        self.mask = 0
        self.tick_due = 0  # the transport's next deadline (ms), as its last tick said; 0 = none
        self.heap_due = 0  # when this connection is in the engine's tick heap (ms); 0 = not
        self.state: Any = None  # the application's per-connection state (e.g. broker.server.ConnectionState)
        self.tls: SSL | None = None  # proton's SSL layer of this transport (broker.tls), None for a plain socket
        self.sniff: bytes | None = None  # TLS only: the first bytes so far, until they prove a TLS handshake

    # ----- socket readiness -------------------------------------------------------------------------------------
    def on_ready(self, mask: int) -> None:
        if self.connecting:
            self._connected()
            return
        if mask & EPOLLOUT:
            self.engine.to_write.add(self)
        if mask & (EPOLLIN | EPOLLERRS):
            self.read()

    def read(self) -> None:
        t = self.t
        cap = _pn.pn_transport_capacity(t)
        if cap <= 0:
            # < 0: the input side is closed; 0: proton's input buffer is full (it drains as we process). Stop
            # watching for input; the next write re-arms it.
            self._watch(read=False)
            return
        e = self.engine
        try:
            n = self.sock.recv_into(e.in_buf, min(cap, READ_SIZE))
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self.io_error(f"read failed: {exc.strerror or exc}")
            return
        if n == 0:  # EOF: nothing more will come, and the peer reads nothing more either (proton does the same)
            _pn.pn_transport_close_tail(t)
            _pn.pn_transport_close_head(t)
        else:
            if self.sniff is not None:
                held = self._tls_handshake(n)
                if held is None:
                    return
                if held:
                    _pn.pn_transport_push(t, held, len(held))
            _pn.pn_transport_push(t, e.in_c, n)
        e.to_write.add(self)

    def _tls_handshake(self, n: int) -> bytes | None:
        """A TLS-only listener: do the first bytes start a TLS handshake? proton's server transport detects the
        protocol itself and would answer a plain AMQP/SASL header (asking a PLAIN client for its password in
        clear), so anything else is refused here, before proton sees a byte. Returns the bytes held back from
        earlier reads to push before this read's (b"" if none), or None: push nothing (yet)."""
        held = self.sniff or b""
        head = held + bytes(self.engine.in_buf[:min(n, 8)])
        if head[:1] == TLS_RECORD_HANDSHAKE or head.startswith(AMQP_TLS_HEADER):
            self.sniff = None
            return held
        if len(head) < len(AMQP_TLS_HEADER) and AMQP_TLS_HEADER.startswith(head):
            self.sniff = held + bytes(self.engine.in_buf[:n])  # too short to tell: held back until it is
            return None
        self.sniff = None
        self.transport.condition = Condition(
            "amqp:connection:framing-error",
            f"SSL Failure: not a TLS handshake (plain connection on a TLS-only port): first bytes {head!r}")
        if len(self.engine.refusals) < MAX_REFUSALS:  # told why in AMQP on a copy of the socket (refusal.py)
            with contextlib.suppress(OSError):
                PlainRefusal(self.engine, self.sock.dup(), held + bytes(self.engine.in_buf[:n]))
        _pn.pn_transport_close_tail(self.t)
        _pn.pn_transport_close_head(self.t)
        self.engine.to_write.add(self)
        return None

    def write(self, now_ms: int) -> None:
        """Tick the transport (heartbeats, idle timeout) and write whatever it has to say."""
        if self.closed or self.connecting:
            return
        t = self.t
        due = self.tick_due = _pn.pn_transport_tick(t, now_ms)
        if due and (not self.heap_due or due < self.heap_due):
            self.heap_due = due
            self.engine.add_tick(due, self)
        e = self.engine
        while True:
            n = _pn.pn_transport_pending(t)
            if n <= 0:
                self._watch(write=False)
                return
            if n > len(e.out_buf):
                e.grow_out(n)
            n = _pn.pn_transport_peek(t, e.out_c, n)
            if n <= 0:
                self._watch(write=False)
                return
            try:
                sent = self.sock.send(e.out_mv[:n])
            except (BlockingIOError, InterruptedError):
                sent = 0
            except OSError as exc:
                self.io_error(f"write failed: {exc.strerror or exc}")
                return
            if sent:
                _pn.pn_transport_pop(t, sent)
            if sent < n:
                self._watch(write=True)
                return

    def io_error(self, description: str) -> None:
        t = self.t
        if not _pn.pn_transport_closed(t):
            cond = self.transport.condition
            if cond is None:
                self.transport.condition = Condition("proton:io", description)
            _pn.pn_transport_close_tail(t)
            _pn.pn_transport_close_head(t)
        self._watch(read=False, write=False)

    def _watch(self, read: bool | None = None, write: bool | None = None) -> None:
        mask = self.mask
        if read is not None:
            mask = (mask | EPOLLIN) if read else (mask & ~EPOLLIN)
        if write is not None:
            mask = (mask | EPOLLOUT) if write else (mask & ~EPOLLOUT)
            if write is False and not mask & EPOLLIN and _pn.pn_transport_capacity(self.t) > 0:
                mask |= EPOLLIN  # input had paused on a full buffer: listen again
        if mask != self.mask and not self.closed:
            self.mask = mask
            self.engine.epoll.modify(self.fd, mask)

    # ----- outgoing connect -------------------------------------------------------------------------------------
    def _connected(self) -> None:
        err = self.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        self.connecting = False
        if err:
            self.io_error(f"connect to {self.remote} failed: {os.strerror(err)}")
            return
        self.mask = EPOLLIN
        self.engine.epoll.modify(self.fd, EPOLLIN)
        self.engine.to_write.add(self)

    def abort(self, description: str) -> None:
        """Give up on this connection now (e.g. a connect that takes too long): the handler hears a transport
        error and a close, as for any I/O failure."""
        if not self.closed:
            self.connecting = False
            self.io_error(description)

    def pending_output(self) -> int:
        if self.closed:
            return 0
        n = _pn.pn_transport_pending(self.t)
        return n if n > 0 else 0

    # ----- end --------------------------------------------------------------------------------------------------
    def finish(self) -> None:
        """The transport is closed both ways: drop the socket and forget the connection."""
        if self.closed:
            return
        self.closed = True
        e = self.engine
        if self.closing is not None:
            self.closing.cancel()
        e.fds.pop(self.fd, None)
        with contextlib.suppress(OSError, ValueError):
            e.epoll.unregister(self.fd)
        with contextlib.suppress(OSError):
            self.sock.close()
        e.conns.pop(self.c, None)
        e.by_transport.pop(self.t, None)
        e.to_write.discard(self)
        self.transport.unbind()


class Engine:
    """The event loop. `on_pass` is the application's end-of-pass work; `after_flush` runs once the pass's output is
    written to the sockets and returns True if it released work (the loop then runs another pass: the journal's
    inline sync, `Journal.sync_deferred`); `on_failure` is told when a handler raised (the handler's link or
    connection should be closed; the loop itself carries on)."""

    def __init__(self, container_id: str) -> None:
        self.container_id = container_id
        self.epoll = select.epoll()
        self.collector = lib.pn_collector()
        self.fds: dict[int, Callable[[int], None]] = {}
        self.conns: dict[Any, Conn] = {}  # pn_connection_t* -> Conn
        self.by_transport: dict[Any, Conn] = {}  # pn_transport_t* -> Conn
        self.fast: dict[Any, FastLink] = {}  # pn_link_t* -> hot-path handler
        self.link_handlers: dict[Any, Any] = {}  # pn_link_t* -> handler of the link's rare events
        self.to_write: set[Conn] = set()
        self.timers = Timers()
        self._ticks: list[tuple[int, int, Conn]] = []
        self._tick_seq = itertools.count()
        self._wake_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self.calls = Calls(self._wake)
        self.fds[self._wake_fd] = self._woken
        self.epoll.register(self._wake_fd, EPOLLIN)
        self.listeners: list[socket.socket] = []
        self.listener_ssl: dict[int, SSLDomain | None] = {}  # listening fd -> the TLS settings for what it accepts
        self.resting: dict[int, Resting] = {}  # listening fd -> since when it cannot accept (`_rest`)
        self.refusals: set[PlainRefusal] = set()  # plain clients of a TLS-only port being told why (refusal.py)
        self.on_pass: Callable[[], None] = lambda: None
        self.after_flush: Callable[[], bool] | None = None
        self._owed = False  # `after_flush` had more work when `_after_flush` stopped: do not sleep
        self.on_failure: HandlerFailed = _log_failure
        self.running = False
        self.passes = 0
        self.in_buf = bytearray(READ_SIZE)
        self.in_c = ffi.from_buffer(self.in_buf)
        self.out_buf = bytearray(READ_SIZE)
        self.out_c = ffi.from_buffer(self.out_buf)
        self.out_mv = memoryview(self.out_buf)

    # ----- sockets ----------------------------------------------------------------------------------------------
    def listen(self, host: str, port: int, on_accept: Callable[[Conn], Any],
               ssl_domain: SSLDomain | None = None, tls_only: bool = False) -> int:
        """Accept AMQP connections on host:port; `on_accept(conn)` configures the new transport (SASL) and returns
        the handler of the connection's rare events. With `ssl_domain` every transport gets proton's TLS layer
        (broker.tls); `tls_only` refuses a connection whose first bytes are not a TLS handshake. Returns the
        bound port (useful with port 0)."""
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
            sock.listen(1024)
        except OSError:
            sock.close()
            raise
        sock.setblocking(False)
        self.listeners.append(sock)
        self.listener_ssl[sock.fileno()] = ssl_domain
        self.fds[sock.fileno()] = lambda _mask: self._accept(sock, on_accept, self.listener_ssl[sock.fileno()],
                                                             tls_only)
        self.epoll.register(sock.fileno(), EPOLLIN)
        return int(sock.getsockname()[1])

    def set_listener_ssl(self, ssl_domain: SSLDomain) -> None:
        """Connections accepted from now on get `ssl_domain` (a certificate reload; open ones keep theirs)."""
        for fd, old in self.listener_ssl.items():
            if old is not None:
                self.listener_ssl[fd] = ssl_domain

    def close_listeners(self) -> None:
        for sock in self.listeners:
            self.fds.pop(sock.fileno(), None)
            with contextlib.suppress(OSError, ValueError):
                self.epoll.unregister(sock.fileno())
            sock.close()
        self.listeners.clear()
        self.resting.clear()

    def _accept(self, lsock: socket.socket, on_accept: Callable[[Conn], Any], ssl_domain: SSLDomain | None,
                tls_only: bool) -> None:
        for _ in range(64):
            try:
                sock, addr = lsock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionAbortedError:  # the peer gave up before we took it: nothing to take
                continue
            except OSError as e:  # out of file descriptors (EMFILE, ENFILE) or of kernel memory
                self._rest(lsock, e)
                return
            resting = self.resting.pop(lsock.fileno(), None)
            if resting is not None:
                log.info("connection.accept_resumed", failures=resting.failures,
                         seconds=round(time.monotonic() - resting.since, 3))
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            transport = Transport(Transport.SERVER)
            connection = Connection()
            tls = SSL(transport, ssl_domain) if ssl_domain is not None else None  # before the transport is bound
            conn = self._adopt(sock, transport, connection, None, f"{addr[0]}:{addr[1]}", outgoing=False)
            conn.tls = tls
            if tls is not None and tls_only:
                conn.sniff = b""
            try:
                conn.handler = on_accept(conn)
            except Exception as e:
                self.on_failure(None, "accept", e)
                conn.io_error("refused")
                continue
            conn.mask = EPOLLIN
            self.epoll.register(conn.fd, EPOLLIN)

    def _rest(self, lsock: socket.socket, e: OSError) -> None:
        """The system would not give a new connection a socket (out of descriptors): the listener stays readable,
        so it would be tried again at every pass, a busy loop logging as fast as it can. It rests instead (not
        watched for a while, twice as long after each failure up to ACCEPT_PAUSE_MAX; logged once per episode) and
        the peers wait in the listen backlog until descriptors are free."""
        fd = lsock.fileno()
        resting = self.resting.get(fd)
        if resting is None:
            resting = self.resting[fd] = Resting(time.monotonic())
            log.error("connection.accept_failed", description=f"{e.strerror or e}: not accepting for "
                      f"{ACCEPT_PAUSE:g}-{ACCEPT_PAUSE_MAX:g} s at a time until it works again; {len(self.conns)} "
                      f"connections open, limit of open files {resource.getrlimit(resource.RLIMIT_NOFILE)[0]}")
        resting.failures += 1
        pause = min(ACCEPT_PAUSE * 2 ** (resting.failures - 1), ACCEPT_PAUSE_MAX)
        with contextlib.suppress(OSError, ValueError):
            self.epoll.modify(fd, 0)
        self.schedule(pause, lambda: self._watch_listener(fd))

    def _watch_listener(self, fd: int) -> None:
        if fd in self.fds and fd in self.resting:  # still listening (close_listeners forgets it)
            with contextlib.suppress(OSError, ValueError):
                self.epoll.modify(fd, EPOLLIN)

    def connect(self, host: str, port: int, handler: Any, *, properties: dict[Any, Any] | None = None,
                user: str | None = None, password: str | None = None, mechanisms: str | None = None,
                heartbeat: float | None = None, ssl_domain: SSLDomain | None = None) -> Conn:
        """Open an AMQP connection to host:port (non-blocking); `handler` gets its rare events. A failed connect
        arrives as a transport error and a transport close, like any other I/O failure. With `ssl_domain` the
        connection is TLS, and the server's certificate is checked for `host` (SNI and the name check)."""
        connection = Connection()
        connection.container = self.container_id
        connection.hostname = host
        if properties:
            connection.properties = properties
        transport = Transport()
        sasl = transport.sasl()
        sasl.allow_insecure_mechs = True
        if user is not None:
            connection.user = user
            if password is not None:
                connection.password = password
        if mechanisms:
            sasl.allowed_mechs(mechanisms)
        if heartbeat:
            transport.idle_timeout = heartbeat
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn = self._adopt(sock, transport, connection, handler, f"{host}:{port}", outgoing=True)
        if ssl_domain is not None:
            conn.tls = SSL(transport, ssl_domain)
            conn.tls.peer_hostname = host
        connection.open()
        conn.connecting = True
        conn.mask = EPOLLOUT
        self.epoll.register(conn.fd, EPOLLOUT)
        try:
            err = sock.connect_ex((host, port))
        except OSError as e:  # e.g. an unresolvable name
            err = e.errno or errno.EINVAL
        if err not in (0, errno.EINPROGRESS):
            conn.connecting = False
            conn.io_error(f"connect to {host}:{port} failed: {os.strerror(err)}")
        return conn

    def _adopt(self, sock: socket.socket, transport: Transport, connection: Connection, handler: Any, remote: str,
               outgoing: bool) -> Conn:
        conn = Conn(self, sock, transport, connection, handler, remote, outgoing)
        lib.pn_connection_collect(conn.c, self.collector)
        transport.bind(connection)
        self.conns[conn.c] = conn
        self.by_transport[conn.t] = conn
        self.fds[conn.fd] = conn.on_ready
        return conn

    def conn_of(self, connection: Any) -> Conn | None:
        """The Conn of a proton Connection (wrapper or pointer)."""
        return self.conns.get(getattr(connection, "_impl", connection))

    # ----- links ------------------------------------------------------------------------------------------------
    def add_fast(self, link: Any, handler: FastLink) -> None:
        self.fast[getattr(link, "_impl", link)] = handler

    def remove_fast(self, link: Any) -> None:
        self.fast.pop(getattr(link, "_impl", link), None)

    def set_link_handler(self, link: Any, handler: Any) -> None:
        self.link_handlers[getattr(link, "_impl", link)] = handler

    # ----- timers and other threads -----------------------------------------------------------------------------
    def schedule(self, delay: float, fn: Callable[[], None]) -> Timer:
        return self.timers.add(time.monotonic() + delay, fn)

    def call_soon_threadsafe(self, fn: Callable[[], None]) -> None:
        self.calls.push(fn)

    def add_reader(self, fd: int, fn: Callable[[int], None]) -> None:
        """Call `fn(mask)` on the loop whenever `fd` is readable (or hung up); an exception it raises is logged."""
        self.fds[fd] = lambda mask: self._call(lambda: fn(mask), "reader")
        self.epoll.register(fd, EPOLLIN)

    def remove_reader(self, fd: int) -> None:
        if self.fds.pop(fd, None) is not None:
            with contextlib.suppress(OSError, ValueError):  # the fd or the epoll is already closed
                self.epoll.unregister(fd)

    def _wake(self) -> None:
        with contextlib.suppress(OSError):  # EAGAIN: already signalled
            os.eventfd_write(self._wake_fd, 1)

    def _woken(self, _mask: int) -> None:
        with contextlib.suppress(BlockingIOError, OSError):
            os.eventfd_read(self._wake_fd)

    def add_tick(self, due_ms: int, conn: Conn) -> None:
        heapq.heappush(self._ticks, (due_ms, next(self._tick_seq), conn))

    # ----- the loop ---------------------------------------------------------------------------------------------
    def stop(self) -> None:
        self.running = False
        self._wake()

    def run(self) -> None:
        self.running = True
        while self.running:
            self.run_once()
        self.close_listeners()

    def run_once(self, max_wait: float = 60.0) -> None:
        timeout = self._timeout(max_wait)
        try:
            ready = self.epoll.poll(timeout)
        except InterruptedError:
            ready = []
        self.passes += 1
        fds = self.fds
        for fd, mask in ready:
            h = fds.get(fd)
            if h is not None:
                h(mask)
        now = time.monotonic()
        for timer in self.timers.due(now):
            self._call(timer.fn, "timer")
        if self._ticks:
            self._due_ticks(int(now * 1000))
        if self.calls:
            for fn in self.calls.take():
                self._call(fn, "call")
        self.process()
        self.flush()
        self._after_flush()
        # Writing makes proton post a few events (a sender's credit is spent: PN_LINK_FLOW): handle them now
        # rather than in a pass of their own.
        for _ in range(3):
            if lib.pn_collector_peek(self.collector) == NULL:
                break
            self.process()
            self.flush()
            self._after_flush()

    def _after_flush(self) -> None:
        hook = self.after_flush
        self._owed = False
        if hook is None:
            return
        for _ in range(AFTER_FLUSH_ROUNDS):
            if not hook():
                return
            self.process()
            self.flush()
        self._owed = True

    def _due_ticks(self, now_ms: int) -> None:
        """Connections whose transport deadline (heartbeat to send, idle peer to detect) has come: tick them in
        this pass's writes. One heap entry per connection: a deadline that moved later is put back."""
        ticks = self._ticks
        while ticks and ticks[0][0] <= now_ms:
            due, _, conn = heapq.heappop(ticks)
            if conn.closed or due != conn.heap_due:
                continue
            conn.heap_due = 0
            if conn.tick_due > now_ms:
                conn.heap_due = conn.tick_due
                self.add_tick(conn.tick_due, conn)
            else:
                self.to_write.add(conn)

    def _timeout(self, max_wait: float) -> float:
        if lib.pn_collector_peek(self.collector) != NULL or self.calls or self.to_write or self._owed:
            return 0.0
        wait = max_wait
        now = time.monotonic()
        due = self.timers.next_due()
        if due is not None:
            wait = min(wait, due - now)
        if self._ticks:
            wait = min(wait, self._ticks[0][0] / 1000.0 - now)
        return max(wait, 0.0)

    def process(self) -> None:
        """Drain the collector and run the end-of-pass work until neither has anything left."""
        col = self.collector
        for _ in range(MAX_PASS_ROUNDS):
            self.dispatch()
            self._call(self.on_pass, "end of pass")
            if lib.pn_collector_peek(col) == NULL:
                return

    def flush(self) -> None:
        """Write every connection's pending output (and tick its transport)."""
        if self.to_write:
            now_ms = _now_ms()
            conns, self.to_write = self.to_write, set()
            for conn in conns:
                conn.write(now_ms)

    def dispatch(self) -> None:
        col = self.collector
        peek, pop, etype = lib.pn_collector_peek, lib.pn_collector_pop, lib.pn_event_type
        event_delivery, delivery_link, event_link = lib.pn_event_delivery, lib.pn_delivery_link, lib.pn_event_link
        fast = self.fast
        while True:
            ev = peek(col)
            if ev == NULL:
                return
            t = etype(ev)
            if t == _PN_DELIVERY:
                d = event_delivery(ev)
                h = fast.get(delivery_link(d))
                if h is not None:
                    try:
                        h.on_delivery(d)
                    except Exception as e:
                        self.on_failure(h, "delivery", e)
                    pop(col)
                    continue
            elif t == _PN_TRANSPORT:
                conn = self.by_transport.get(lib.pn_event_transport(ev))
                if conn is not None:
                    self.to_write.add(conn)
                pop(col)
                continue
            elif t == _PN_LINK_FLOW:
                h = fast.get(event_link(ev))
                if h is not None:
                    try:
                        h.on_flow()
                    except Exception as e:
                        self.on_failure(h, "flow", e)
                    pop(col)
                    continue
            if t in _SLOW:
                self._slow(ev, t)
            elif t == _PN_CONNECTION_LOCAL_CLOSE:
                self._closing(lib.pn_event_connection(ev))
            elif t == _PN_LINK_FINAL:
                link = event_link(ev)
                fast.pop(link, None)
                self.link_handlers.pop(link, None)
            pop(col)

    def _slow(self, ev: Any, t: int) -> None:
        method = _METHODS[t]
        conn = self.conns.get(lib.pn_event_connection(ev))
        link = lib.pn_event_link(ev)
        handler = self.link_handlers.get(link) if link != NULL else None
        fn = getattr(handler, method, None) if handler is not None else None
        if fn is None and conn is not None:
            handler = conn.handler
            fn = getattr(handler, method, None)
        if fn is not None:  # only now the proton objects (~15-25 µs): most handlers ignore most event types
            try:
                fn(Event.wrap(ev))
            except Exception as e:
                self.on_failure(handler, method, e)
        if t == _PN_TRANSPORT_CLOSED and conn is not None:
            conn.finish()

    def _closing(self, c: Any) -> None:
        conn = self.conns.get(c)
        if conn is None or conn.closing is not None:
            return
        conn.closing = self.schedule(CLOSE_GRACE, lambda: conn.abort("peer did not close in time"))

    def _call(self, fn: Callable[[], None], where: str) -> None:
        try:
            fn()
        except Exception as e:
            self.on_failure(None, where, e)

    def grow_out(self, n: int) -> None:
        size = max(n, 2 * len(self.out_buf))
        self.out_buf = bytearray(size)
        self.out_c = ffi.from_buffer(self.out_buf)
        self.out_mv = memoryview(self.out_buf)

    def pending_output(self) -> int:
        return sum(c.pending_output() for c in self.conns.values())

    def close(self) -> None:
        for conn in list(self.conns.values()):
            conn.finish()
        for r in list(self.refusals):
            r.finish()
        self.close_listeners()
        with contextlib.suppress(OSError, ValueError):
            self.epoll.unregister(self._wake_fd)
        os.close(self._wake_fd)
        self.epoll.close()


def _log_failure(handler: Any, where: str, exc: BaseException) -> None:
    log.error("broker.error", where=where, handler=type(handler).__name__, exc_info=exc)
