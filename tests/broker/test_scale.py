"""Many connections and links at once: the event loop serves each, whatever the others do."""

from __future__ import annotations

import time
from typing import Any

from proton import Message
from proton.handlers import MessagingHandler
from proton.reactor import Container

from tests.support.procs import BrokerProcess


class ManyLinks(MessagingHandler):  # type: ignore[misc]
    """`conns` connections, each with `pairs` queues: a sender and a receiver per queue (2 * pairs links each).
    Every sender sends `per_link` messages; done when every receiver got its own queue's messages in order."""

    def __init__(self, url: str, conns: int, pairs: int, per_link: int, deadline: float) -> None:
        super().__init__(prefetch=50)
        self.url, self.conns, self.pairs, self.per_link = url, conns, pairs, per_link
        self.deadline = deadline
        self.received: dict[str, list[int]] = {}
        self.sent: dict[Any, int] = {}
        self.links_open = 0
        self.error: str | None = None
        self.connections: list[Any] = []

    def on_start(self, event: Any) -> None:
        self.container = event.container
        for c in range(self.conns):
            conn = event.container.connect(self.url, reconnect=False)
            self.connections.append(conn)
            for p in range(self.pairs):
                q = f"scale-{c}-{p}"
                self.received[q] = []
                s = event.container.create_sender(conn, q)
                self.sent[s] = 0
                event.container.create_receiver(conn, q)
        self.timer = event.container.schedule(max(self.deadline - time.monotonic(), 0.1), self)

    def on_timer_task(self, event: Any) -> None:
        self.error = self.error or "deadline passed"
        self._stop()

    def on_link_opened(self, event: Any) -> None:
        self.links_open += 1

    def on_sendable(self, event: Any) -> None:
        s = event.sender
        while s.credit and self.sent[s] < self.per_link:
            self.sent[s] += 1
            s.send(Message(body=self.sent[s]))

    def on_message(self, event: Any) -> None:
        self.received[event.receiver.source.address].append(event.message.body)
        if all(len(v) == self.per_link for v in self.received.values()):
            self._stop()

    def on_link_error(self, event: Any) -> None:
        self.error = f"link error: {event.link.remote_condition}"
        self._stop()

    def on_transport_error(self, event: Any) -> None:
        self.error = f"transport error: {event.transport.condition}"
        self._stop()

    def _stop(self) -> None:
        self.timer.cancel()
        for c in self.connections:
            c.close()


def test_a_thousand_links_on_a_hundred_connections_all_flow(brokers: Any) -> None:
    b: BrokerProcess = brokers("--auto-create-queues")
    h = ManyLinks(b.url, conns=100, pairs=5, per_link=20, deadline=time.monotonic() + 120)
    Container(h).run()
    assert h.error is None, h.error
    assert h.links_open == 1000
    assert all(v == list(range(1, 21)) for v in h.received.values()), "every queue got its messages, in order"
    assert b.alive
    opened = [e for e in b.events() if e["event"] == "connection.opened"]
    assert len(opened) == 100
