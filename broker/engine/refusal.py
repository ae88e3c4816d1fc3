"""A plain (non-TLS) client on a TLS-only port, told why in AMQP before its socket is closed.

The engine's TLS-only check (`Conn._tls_handshake`) refuses a connection whose first bytes are not a TLS handshake
before proton's server transport sees them (that transport would answer a SASL header with its mechanisms, and a
PLAIN client would send its password in clear). The refused connection closes as before (logged `tls.refused`);
its socket is handed, duplicated, to a `PlainRefusal`: a separate proton transport that offers SASL ANONYMOUS only
(so no client is ever asked for a password), answers the client's open with a close carrying
`amqp:unauthorized-access` and the reason, and closes. A client that cannot use ANONYMOUS fails its SASL
negotiation instead; one that says nothing is dropped after `PATIENCE` seconds. Rare path: proton's Python objects.
"""

from __future__ import annotations

import contextlib
import select
import socket
from collections.abc import Callable
from select import EPOLLIN, EPOLLOUT
from typing import Protocol

from proton import Condition, Connection, Endpoint, Transport, TransportException

from broker.engine.timers import Timer


class Loop(Protocol):
    """What a refusal uses of the event loop (broker.engine.engine.Engine), which imports this module."""

    container_id: str
    epoll: select.epoll
    fds: dict[int, Callable[[int], None]]
    refusals: set[PlainRefusal]

    def schedule(self, delay: float, fn: Callable[[], None]) -> Timer: ...

CONDITION = "amqp:unauthorized-access"
DESCRIPTION = "this port takes TLS connections only: connect with TLS (amqps, and the broker's CA)"
PATIENCE = 5.0  # seconds a refused client has to open its connection
MAX_OPEN = 64  # refusals in progress at once; beyond, a plain client's socket is just closed


class PlainRefusal:
    def __init__(self, engine: Loop, sock: socket.socket, first: bytes) -> None:
        self.engine = engine
        self.sock = sock
        self.fd = sock.fileno()
        t = self.transport = Transport(Transport.SERVER)
        t.require_auth(False)  # a client without SASL is answered too
        t.sasl().allowed_mechs("ANONYMOUS")
        self.conn = Connection()
        self.conn.container = engine.container_id
        t.bind(self.conn)
        self.answered = False
        self.done = False
        self.timer: Timer | None = engine.schedule(PATIENCE, self.finish)
        self.mask = EPOLLIN
        engine.refusals.add(self)
        engine.fds[self.fd] = self.on_ready
        engine.epoll.register(self.fd, self.mask)
        self._input(first)

    def on_ready(self, mask: int) -> None:
        if mask & EPOLLIN:
            try:
                data = self.sock.recv(4096)
            except (BlockingIOError, InterruptedError):
                data = None
            except OSError:
                self.finish()
                return
            if data == b"":
                self.transport.close_tail()
                data = None
            self._input(data)
        else:
            self._output()

    def _input(self, data: bytes | None) -> None:
        try:
            if data:
                self.transport.push(data)
        except TransportException:
            self.finish()
            return
        c = self.conn
        if not self.answered and c.state & Endpoint.REMOTE_ACTIVE:
            self.answered = True
            c.open()
            c.condition = Condition(CONDITION, DESCRIPTION)
            c.close()
        self._output()

    def _output(self) -> None:
        t = self.transport
        while not self.done:
            n = t.pending()
            if n < 0:  # everything said (or the transport failed): done
                self.finish()
                return
            if n == 0:
                self._watch(EPOLLIN)
                return
            data = t.peek(n)
            if not data:
                self._watch(EPOLLIN)
                return
            try:
                sent = self.sock.send(data)
            except (BlockingIOError, InterruptedError):
                self._watch(EPOLLIN | EPOLLOUT)
                return
            except OSError:
                self.finish()
                return
            t.pop(sent)

    def _watch(self, mask: int) -> None:
        if mask != self.mask and not self.done:
            self.mask = mask
            self.engine.epoll.modify(self.fd, mask)

    def finish(self) -> None:
        if self.done:
            return
        self.done = True
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        e = self.engine
        e.refusals.discard(self)
        e.fds.pop(self.fd, None)
        with contextlib.suppress(OSError, ValueError):
            e.epoll.unregister(self.fd)
        with contextlib.suppress(OSError):
            self.sock.close()
        self.transport.unbind()
