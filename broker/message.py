"""Messages as the broker keeps them: the encoded bytes plus the few fields routing and queues need.

The encoded bytes are forwarded untouched to consumers and backups; the message is decoded once on arrival (to route
it and to refuse malformed input) and the proton `Message` object is dropped right away, because keeping hundreds of
thousands of them alive makes Python's cyclic GC expensive.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from cproton import (
    pn_message,
    pn_message_decode,
    pn_message_get_address,
    pn_message_get_expiry_time,
    pn_message_get_priority,
    pn_message_get_subject,
    pn_message_get_ttl,
    pn_message_is_durable,
    pn_message_properties,
)
from proton import Data, Message


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


# Width of the size/count field after a constructor, by the constructor's high nibble (AMQP 1.0 part 1, 1.6).
_FIXED_WIDTH = {0x4: 0, 0x5: 1, 0x6: 2, 0x7: 4, 0x8: 8, 0x9: 16}
_SIZED_ONE = frozenset({0xA, 0xC, 0xE})  # variable width / compound / array with a 1-byte size
_SIZED_FOUR = frozenset({0xB, 0xD, 0xF})  # ... with a 4-byte size
_HEADER, _FOOTER = 0x70, 0x78
_BODY_SECTIONS = frozenset({0x75, 0x76})  # data and amqp-sequence sections may repeat
_SECTION_NAMES = {
    b"amqp:header:list": 0x70,
    b"amqp:delivery-annotations:map": 0x71,
    b"amqp:message-annotations:map": 0x72,
    b"amqp:properties:list": 0x73,
    b"amqp:application-properties:map": 0x74,
    b"amqp:data:binary": 0x75,
    b"amqp:amqp-sequence:list": 0x76,
    b"amqp:amqp-value:*": 0x77,
    b"amqp:footer:map": 0x78,
}


def _value_end(data: bytes, off: int) -> int:
    """Offset just past the encoded AMQP value starting at `off` (sizes only; the content is not decoded)."""
    code = data[off]
    off += 1
    if code == 0x00:  # described: a descriptor, then the value
        return _value_end(data, _value_end(data, off))
    hi = code >> 4
    width = _FIXED_WIDTH.get(hi)
    if width is not None:
        return off + width
    if hi in _SIZED_ONE:
        return off + 1 + data[off]
    if hi in _SIZED_FOUR:
        return off + 4 + int.from_bytes(data[off : off + 4], "big")
    raise MalformedMessage(f"unknown AMQP type code 0x{code:02x} at byte {off - 1}")


def _section_code(data: bytes, off: int) -> int:
    """The section descriptor (0x70 header .. 0x78 footer) of the section at `off`, or -1."""
    if data[off] != 0x00:
        return -1
    kind = data[off + 1]
    if kind == 0x53:  # smallulong
        return data[off + 2]
    if kind == 0x80:  # ulong
        return int.from_bytes(data[off + 2 : off + 10], "big")
    if kind in (0xA3, 0xB3):  # symbol
        size = data[off + 2] if kind == 0xA3 else int.from_bytes(data[off + 2 : off + 6], "big")
        start = off + (3 if kind == 0xA3 else 6)
        return _SECTION_NAMES.get(bytes(data[start : start + size]), -1)
    return -1


def check_framing(data: bytes) -> None:
    """Raise MalformedMessage unless `data` is a sequence of AMQP 1.0 message sections, in order, that fills it
    exactly. proton's `Message.decode` accepts any bytes (garbage decodes to an empty message), so this is what
    tells a client it sent something that is not a message. Sizes are checked, contents are not decoded (cheap)."""
    n = len(data)
    if n == 0:
        raise MalformedMessage("empty transfer: a message needs at least a body section")
    off, last = 0, -1
    try:
        while off < n:
            if data[off] == 0x00 and data[off + 1] == 0x53:  # the usual smallulong descriptor: inline
                code = data[off + 2]
                start = off + 3
            else:
                code = _section_code(data, off)
                start = _value_end(data, off + 1)
            if not _HEADER <= code <= _FOOTER:
                raise MalformedMessage(f"byte {off}: not an AMQP message section")
            if code < last or (code == last and code not in _BODY_SECTIONS):
                raise MalformedMessage(f"byte {off}: message section 0x{code:02x} out of order")
            last = code
            off = _value_end(data, start)
    except IndexError:
        raise MalformedMessage("message truncated") from None
    if off != n:
        raise MalformedMessage(f"message truncated: section ends at byte {off} of {n}")


_pn_msg = pn_message()  # one C message reused for every decode (the reactor is single-threaded)


def decode_payload(data: bytes, now: float | None = None, trusted: bool = False) -> Payload:
    """Decode just enough to route; raise MalformedMessage on bad input.

    Reads the header and properties straight from proton's C message: the body is never converted to Python
    (that copy was a large share of the broker's CPU per message). `trusted` skips the framing check, for
    bytes a primary already checked (replication).
    """
    if not trusted:
        check_framing(data)
    msg = _pn_msg
    err = pn_message_decode(msg, data)
    if err < 0:
        raise MalformedMessage(f"cannot decode message (proton error {err})")
    arrived = time.time() if now is None else now
    expires: float | None = None
    ttl = pn_message_get_ttl(msg)
    if ttl:
        expires = arrived + ttl / 1000.0
    else:
        expiry = pn_message_get_expiry_time(msg)
        if expiry:
            expires = expiry / 1000.0
    props = Data(pn_message_properties(msg))
    properties = props.get_object() if props.next() else None
    if properties is not None and not isinstance(properties, dict):
        raise MalformedMessage("application-properties must be a map")
    return Payload(
        data=data,
        priority=int(pn_message_get_priority(msg)),
        expires_at=expires,
        subject=pn_message_get_subject(msg),
        to=pn_message_get_address(msg),
        properties=dict(properties) if properties else None,
        durable=bool(pn_message_is_durable(msg)),
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
