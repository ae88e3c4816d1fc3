"""Lean proton client loops for load generation (raw `Container` + plain handler, no MessagingHandler layers).

A message is encoded once and streamed as bytes for every transfer, consumers read and accept without decoding:
per-message client cost stays small so that a few client processes can saturate a broker. Each loop signals
readiness through `on_ready` (which may block until the run's common start), then measures from that point on.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from proton import Delivery, Message
from proton.reactor import Container

from bench.targets import ClientSpec


def encode_message(size: int, durable: bool) -> bytes:
    return bytes(Message(body=b"x" * size, durable=durable).encode())


def cpu_now() -> float:
    t = os.times()
    return t.user + t.system


@dataclass
class LoopResult:
    sent: int = 0
    accepted: int = 0
    other_outcomes: int = 0  # rejected/released/modified: not counted as published
    received: int = 0
    start: float = 0.0  # time.monotonic(), system-wide: comparable across processes
    end: float = 0.0
    cpu_seconds: float = 0.0
    latencies: list[float] = field(default_factory=list)  # seconds, sync mode only
    error: str | None = None


class _Base:
    def __init__(self, spec: ClientSpec, on_ready: Callable[[], None], give_up_after: float) -> None:
        self.spec = spec
        self.on_ready = on_ready
        self.give_up_after = give_up_after
        self.result = LoopResult()
        self.conn: Any = None
        self.container: Any = None
        self.done = False
        self._cpu0 = 0.0
        self.give_up: Any = None

    def _begin(self) -> None:
        self.on_ready()
        self.result.start = time.monotonic()
        self._cpu0 = cpu_now()

    def _finish(self, error: str | None = None) -> None:
        if self.done:
            return
        self.done = True
        self.result.end = time.monotonic()
        self.result.cpu_seconds = cpu_now() - self._cpu0 if self._cpu0 else 0.0
        if error and not self.result.error:
            self.result.error = error
        if self.give_up is not None:
            self.give_up.cancel()
        if self.conn is not None:
            self.conn.close()  # the container returns once the close handshake is done
        if error and self.container is not None:
            self.container.stop()

    def on_reactor_init(self, event: Any) -> None:
        self.container = event.container
        self.conn = event.container.connect(self.spec.url, **self.spec.connect_kwargs())
        self.give_up = self.container.schedule(self.give_up_after,
                                               _Call(lambda: self._finish("gave up: run took too long")))

    def on_link_remote_close(self, event: Any) -> None:
        cond = event.link.remote_condition
        self._finish(f"link closed by peer: {cond.name if cond else ''} {cond.description if cond else ''}")

    def on_connection_remote_close(self, event: Any) -> None:
        if not self.done:
            cond = event.connection.remote_condition
            self._finish(f"connection closed by peer: {cond.name if cond else ''}")

    def on_transport_error(self, event: Any) -> None:
        cond = event.transport.condition
        self._finish(f"transport error: {cond.name if cond else ''} {cond.description if cond else ''}")

    def run(self) -> LoopResult:
        Container(self).run()
        return self.result


class _Call:
    def __init__(self, fn: Callable[[], None]) -> None:
        self.fn = fn

    def on_timer_task(self, event: Any) -> None:
        self.fn()


class PublishLoop(_Base):
    """Send `count` messages (or until `duration` elapses) with at most `window` unsettled; window=1 is sync."""

    def __init__(self, spec: ClientSpec, address: str, payload: bytes, count: int, duration: float | None,
                 window: int, on_ready: Callable[[], None], give_up_after: float = 600.0) -> None:
        super().__init__(spec, on_ready, give_up_after)
        self.address = address
        self.payload = payload
        self.count = count
        self.duration = duration
        self.window = window
        self.sync = window == 1
        self.inflight = 0
        self.deadline = 0.0
        self.started = False
        self.sender: Any = None
        self.t_sent = 0.0

    def on_reactor_init(self, event: Any) -> None:
        super().on_reactor_init(event)
        self.sender = event.container.create_sender(self.conn, self.address)

    def on_link_flow(self, event: Any) -> None:
        if not self.started:
            if self.sender.credit <= 0:
                return
            self.started = True
            self._begin()
            self.deadline = self.result.start + self.duration if self.duration else float("inf")
        self._pump()

    def _pump(self) -> None:
        s, r, payload = self.sender, self.result, self.payload
        while self.inflight < self.window and s.credit > 0 and r.sent < self.count:
            if (r.sent & 63) == 0 and time.monotonic() > self.deadline:
                self.count = r.sent
                break
            s.delivery(b"%d" % r.sent)
            s.stream(payload)
            s.advance()
            r.sent += 1
            self.inflight += 1
            if self.sync:
                self.t_sent = time.perf_counter()
        if self.inflight == 0 and r.sent >= self.count:
            self._finish()

    def on_delivery(self, event: Any) -> None:
        d = event.delivery
        state = d.remote_state
        if not state and not d.remote_settled:
            return
        if self.sync:
            self.result.latencies.append(time.perf_counter() - self.t_sent)
        if state == Delivery.ACCEPTED:
            self.result.accepted += 1
        else:
            self.result.other_outcomes += 1
        d.settle()
        self.inflight -= 1
        if not self.done:
            self._pump()


class ConsumeLoop(_Base):
    """Receive and accept until `should_stop()`; publishes its count and last-receipt time via `report`."""

    def __init__(self, spec: ClientSpec, address: str, credit: int, on_ready: Callable[[], None],
                 should_stop: Callable[[], bool], report: Callable[[int, float], None],
                 give_up_after: float = 600.0) -> None:
        super().__init__(spec, on_ready, give_up_after)
        self.address = address
        self.credit = credit
        self.low = max(1, credit // 2)
        self.should_stop = should_stop
        self.report = report
        self.receiver: Any = None
        self.started = False

    def on_reactor_init(self, event: Any) -> None:
        super().on_reactor_init(event)
        self.receiver = event.container.create_receiver(self.conn, self.address)

    def on_link_remote_open(self, event: Any) -> None:
        if self.started or event.link != self.receiver:
            return
        self.started = True
        self._begin()
        self.receiver.flow(self.credit)
        self._poll()

    def _poll(self) -> None:
        if self.done:
            return
        if self.should_stop():
            self._finish()
        else:
            self.container.schedule(0.02, _Call(self._poll))

    def on_delivery(self, event: Any) -> None:
        d = event.delivery
        if d.partial or self.done:
            return
        r = self.receiver
        r.recv(d.pending)
        r.advance()
        d.update(Delivery.ACCEPTED)
        d.settle()
        res = self.result
        res.received += 1
        self.report(res.received, time.monotonic())
        if r.credit < self.low:
            r.flow(self.credit - r.credit)
