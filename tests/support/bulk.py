"""Fill a queue fast: a pipelined proton sender (many transfers in flight), confirmed by the broker's settlements."""

from __future__ import annotations

from typing import Any

from proton import Message
from proton.handlers import MessagingHandler
from proton.reactor import Container


class _Filler(MessagingHandler):  # type: ignore[misc]
    def __init__(self, url: str, queue: str, count: int, start: int, durable: bool = False, pad: int = 0) -> None:
        super().__init__(auto_settle=True)
        self.durable = durable
        self.pad = pad
        self.url = url
        self.queue = queue
        self.count = count
        self.next = start
        self.end = start + count
        self.confirmed = 0
        self.error: str | None = None

    def on_start(self, event: Any) -> None:
        conn = event.container.connect(self.url, reconnect=False)
        event.container.create_sender(conn, self.queue)

    def on_sendable(self, event: Any) -> None:
        s = event.sender
        while s.credit > 0 and self.next < self.end:
            s.send(Message(body=padded(self.next, self.pad), durable=self.durable))
            self.next += 1

    def on_accepted(self, event: Any) -> None:
        self.confirmed += 1
        if self.confirmed == self.count:
            event.connection.close()

    def on_rejected(self, event: Any) -> None:
        self._fail(event, f"rejected: {event.delivery.remote.condition}")

    def on_link_error(self, event: Any) -> None:
        self._fail(event, f"link error: {event.link.remote_condition}")

    def on_transport_error(self, event: Any) -> None:
        self._fail(event, f"transport error: {event.transport.condition}")

    def _fail(self, event: Any, why: str) -> None:
        self.error = self.error or why
        if event.connection is not None:
            event.connection.close()


def padded(n: int, pad: int) -> Any:
    """The body `fill` sends for number n: n itself, or with `pad` > 0 a string of about that many bytes that
    starts with n (`number_of` reads it back)."""
    return n if pad <= 0 else f"{n}:".ljust(pad, "x")


def number_of(body: Any) -> int:
    return body if isinstance(body, int) else int(str(body).split(":", 1)[0])


def fill(url: str, queue: str, count: int, start: int = 1, durable: bool = False, pad: int = 0) -> None:
    """Send bodies start, start+1, ... (count of them, see `padded`) to `queue`; return once the broker accepted
    every one."""
    h = _Filler(url, queue, count, start, durable, pad)
    Container(h).run()
    if h.error is not None or h.confirmed != count:
        raise AssertionError(f"fill {queue}: {h.confirmed}/{count} confirmed ({h.error})")


class _Taker(MessagingHandler):  # type: ignore[misc]
    def __init__(self, url: str, queue: str, count: int, credit: int) -> None:
        super().__init__(prefetch=credit, auto_accept=False)
        self.url = url
        self.queue = queue
        self.count = count
        self.taken = 0
        self.bodies: list[Any] = []
        self.error: str | None = None

    def on_start(self, event: Any) -> None:
        conn = event.container.connect(self.url, reconnect=False)
        event.container.create_receiver(conn, self.queue)

    def on_message(self, event: Any) -> None:
        if self.taken >= self.count:  # prefetched beyond what was asked: give it back
            self.release(event.delivery, delivered=False)
            return
        self.bodies.append(event.message.body)
        self.accept(event.delivery)
        self.taken += 1
        if self.taken == self.count:
            event.receiver.close()
            event.connection.close()

    def on_link_error(self, event: Any) -> None:
        self.error = self.error or f"link error: {event.link.remote_condition}"
        event.connection.close()

    def on_transport_error(self, event: Any) -> None:
        self.error = self.error or f"transport error: {event.transport.condition}"


def take(url: str, queue: str, count: int, credit: int = 500) -> list[Any]:
    """Consume (accept) `count` messages from `queue` with many in flight; return their bodies once all were
    taken."""
    h = _Taker(url, queue, count, credit)
    Container(h).run()
    if h.error is not None or h.taken < count:
        raise AssertionError(f"take {queue}: {h.taken}/{count} taken ({h.error})")
    return h.bodies
