"""Messages as the broker keeps them: the encoded bytes plus the few fields routing and queues need.

The encoded bytes are forwarded untouched to consumers and backups; the message is decoded once on arrival (to route
it and to refuse malformed input) and the proton `Message` object is dropped right away, because keeping hundreds of
thousands of them alive makes Python's cyclic GC expensive.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from proton import Message


class MalformedMessage(ValueError):
    """The bytes are not a valid AMQP 1.0 message."""


@dataclass(slots=True, eq=False)
class Payload:
    """One received message, shared by every queue it was routed to (immutable by convention)."""

    data: bytes
    priority: int
    expires_at: float | None
    subject: str | None
    to: str | None
    properties: dict[Any, Any] | None
    durable: bool
    arrived_at: float

    @property
    def size(self) -> int:
        return len(self.data)


def decode_payload(data: bytes, now: float | None = None) -> Payload:
    """Decode just enough to route; raise MalformedMessage on bad input."""
    m = Message()
    try:
        m.decode(data)
    except Exception as e:  # proton raises several types for bad input
        raise MalformedMessage(f"cannot decode message: {e}") from None
    arrived = time.time() if now is None else now
    expires: float | None = None
    if m.ttl:
        expires = arrived + m.ttl
    elif m.expiry_time:
        expires = m.expiry_time
    subject = m.subject
    to = m.address
    if subject is not None and not isinstance(subject, str):
        raise MalformedMessage("subject must be a string")
    return Payload(
        data=data,
        priority=int(m.priority),
        expires_at=expires,
        subject=subject,
        to=to if isinstance(to, str) else None,
        properties=dict(m.properties) if m.properties else None,
        durable=bool(m.durable),
        arrived_at=arrived,
    )


def encode_message(m: Message) -> bytes:
    return m.encode()


def with_delivery_header(data: bytes, delivery_count: int, first_acquirer: bool) -> bytes:
    """Re-encode with an updated header (only for redeliveries: off the hot path)."""
    m = Message()
    m.decode(data)
    m.delivery_count = delivery_count
    m.first_acquirer = first_acquirer
    return m.encode()


def with_ttl_adjusted(data: bytes, remaining: float) -> bytes:
    """Re-encode carrying the remaining time-to-live (used when a queue's default TTL applies)."""
    m = Message()
    m.decode(data)
    m.ttl = max(remaining, 0.001)
    return m.encode()
