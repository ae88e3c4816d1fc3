"""Blocking proton clients for tests."""

from __future__ import annotations

from typing import Any

from proton import Delivery, Link, Message, Timeout
from proton.reactor import Copy, DynamicNodeProperties, LinkOption
from proton.utils import BlockingConnection, BlockingReceiver, BlockingSender

from broker.client import ManagementClient


class SettleSecond(LinkOption):  # type: ignore[misc]
    """Receiver-settle-mode second: the consumer waits for the broker's settlement of its outcome (the broker
    settles an accept once it took effect: on a replicated queue, once the backups have the dequeue)."""

    def apply(self, link: Any) -> None:
        link.rcv_settle_mode = Link.RCV_SECOND


def connect(url: str, timeout: float = 10.0, **kw: Any) -> BlockingConnection:
    kw.setdefault("reconnect", False)
    return BlockingConnection(url, timeout=timeout, **kw)


def send(url: str, address: str | None, bodies: list[Any], timeout: float = 10.0, **msg_kw: Any) -> None:
    c = connect(url, timeout)
    try:
        s = c.create_sender(address)
        for b in bodies:
            s.send(Message(body=b, **msg_kw))
    finally:
        c.close()


def receive(url: str, address: str, n: int, timeout: float = 10.0, browse: bool = False) -> list[Any]:
    """Exactly `n` message bodies (accepted unless browsing); fails if they do not come within `timeout` each."""
    return _take(url, address, n, timeout, browse)


def drain(url: str, address: str, timeout: float = 0.5, browse: bool = False) -> list[Any]:
    """Every message body until nothing arrives for `timeout` seconds (accepted unless browsing)."""
    return _take(url, address, None, timeout, browse)


def _take(url: str, address: str, n: int | None, timeout: float, browse: bool) -> list[Any]:
    c = connect(url, max(timeout, 10.0))
    try:
        r = c.create_receiver(address, options=Copy() if browse else None, credit=max(n or 1000, 1))
        out: list[Any] = []
        while n is None or len(out) < n:
            try:
                m = r.receive(timeout=timeout)
            except Timeout:
                if n is None:
                    break
                raise
            body = m.body
            # proton gives a binary body as a memoryview into the message's C memory, which is freed with the
            # message: keep a copy.
            out.append(bytes(body) if isinstance(body, memoryview) else body)
            if not browse:
                r.accept()
        return out
    finally:
        c.close()


def settle_last(r: BlockingReceiver, state: int, failed: bool = False, undeliverable: bool = False) -> None:
    assert r.fetcher is not None
    d: Delivery = r.fetcher.unsettled.popleft()
    if state == Delivery.MODIFIED:
        d.local.failed = failed
        d.local.undeliverable = undeliverable
    d.update(state)
    d.settle()


def mgmt(url: str, **kw: Any) -> ManagementClient:
    return ManagementClient(url, **kw)


__all__ = ["BlockingSender", "Copy", "DynamicNodeProperties", "connect", "drain", "mgmt", "receive", "send",
           "settle_last"]
