"""Helpers shared by the broker tests: stored-message snapshots, raw deliveries, a hand-pumped AMQP engine."""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Callable
from typing import Any

from proton import Connection, Delivery, Message, Transport
from proton.reactor import Copy
from proton.utils import BlockingConnection

from tests.support.amqp import connect, mgmt, send


def stored(url: str, queue: str) -> list[Any]:
    """Every message body on `queue`, in order, read by a browser (nothing is consumed)."""
    with mgmt(url) as client:
        depth = client.call("READ", "queue", queue).body["depth"]
    c = connect(url)
    try:
        r = c.create_receiver(queue, options=Copy(), credit=max(depth, 1))
        out = []
        for _ in range(depth):
            m = r.receive(timeout=10)  # keep the message alive while copying: a binary body is a view into it
            out.append(plain(m.body))
        return out
    finally:
        c.close()


def plain(body: Any) -> Any:
    """proton 0.40 decodes binary as a memoryview into the message; copy it out as bytes."""
    return bytes(body) if isinstance(body, memoryview) else body


class Sentinel:
    """A queue filled with known messages before the bad input; `check()` proves none was lost or changed."""

    def __init__(self, url: str, name: str, count: int = 20) -> None:
        self.url = url
        self.name = name
        self.bodies: list[Any] = [f"{name}-{i}" for i in range(count - 2)] + [{"n": count - 2}, b"\x00\x01binary"]
        with mgmt(url) as m:
            m.call("CREATE", "queue", name, {"arguments": {"max-count": 1000}})
        send(url, name, self.bodies)
        self.check()

    def check(self) -> None:
        with mgmt(self.url) as m:
            attrs = m.call("READ", "queue", self.name).body
        assert (attrs["depth"], attrs["acquired"]) == (len(self.bodies), 0)
        assert attrs["arguments"] == {"max-count": 1000}
        assert stored(self.url, self.name) == self.bodies


def send_raw(conn: BlockingConnection, address: str | None, data: bytes, timeout: float = 10.0) -> Delivery:
    """Send `data` as the payload of one transfer (no encoding); return the delivery once the broker settled it."""
    s = conn.create_sender(address, name=f"raw-{time.monotonic_ns()}")
    link = s.link
    d = link.delivery(f"raw-{time.monotonic_ns()}")
    if data:
        link.send(data)
    link.advance()
    conn.wait(lambda: d.remote_state != 0 or d.settled, timeout=timeout, msg="the broker's outcome")
    return d


class EngineClient:
    """An AMQP connection driven by hand over a plain socket, so a test can stop writing anywhere it likes
    (half a frame, the middle of a multi-frame transfer) and vanish."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.transport = Transport()
        self.transport.sasl().allowed_mechs("ANONYMOUS")
        self.conn = Connection()
        self.transport.bind(self.conn)
        self.conn.open()
        self.session = self.conn.session()
        self.session.open()

    def flush(self) -> None:
        while self.transport.pending() > 0:
            out = self.transport.peek(self.transport.pending()) or b""
            self.sock.sendall(out)
            self.transport.pop(len(out))

    def pump_until(self, pred: Callable[[], bool], timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while not pred():
            assert time.monotonic() < deadline, "timed out pumping the raw AMQP connection"
            self.flush()
            self.sock.settimeout(0.05)
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                continue
            assert data, "the broker closed the raw connection"
            self.transport.push(data)

    def sender(self, address: str) -> Any:
        s = self.session.sender(f"raw-{address}")
        s.target.address = address
        s.open()
        self.pump_until(lambda: s.credit > 0)
        return s

    def receiver(self, address: str, credit: int) -> Any:
        """Attach a consumer and wait until `credit` messages have arrived (none settled)."""
        r = self.session.receiver(f"raw-{address}")
        r.source.address = address
        r.open()
        r.flow(credit)
        self.pump_until(lambda: r.queued >= credit)
        return r

    def pending_bytes(self) -> bytes:
        """What proton would write next (not written yet)."""
        n = self.transport.pending()
        return bytes(self.transport.peek(n) or b"") if n > 0 else b""

    def write_and_vanish(self, data: bytes, reset: bool) -> None:
        """Write `data` and drop the socket: with `reset` an RST (SO_LINGER 0), else an orderly FIN."""
        self.sock.sendall(data)
        if reset:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.sock.close()


def big_message(size: int) -> Message:
    return Message(body=b"x" * size)


def outcome(d: Delivery) -> tuple[int, str | None]:
    cond = d.remote.condition
    return d.remote_state, cond.name if cond is not None else None


__all__ = ["EngineClient", "Sentinel", "big_message", "outcome", "plain", "send_raw", "stored"]
