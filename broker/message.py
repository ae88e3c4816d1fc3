"""Messages as the broker sees them: encoded bytes, and the few fields routing and queues need.

The encoded bytes are stored and forwarded untouched to consumers and backups. On arrival a message is checked
(`check_framing`: proton accepts any bytes) and decoded once into proton's C message, from which only the header
fields every queue needs are read (`decode`: priority, expiry, durable); the rest (`to`, `subject`, application
properties) is read from the same C message only when routing asks for it (`current_to()` ...), before the next
decode. No proton `Message` object is made on the hot path: keeping many alive makes Python's GC expensive.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, NamedTuple

from cproton import (
    pn_message,
    pn_message_get_address,
    pn_message_get_expiry_time,
    pn_message_get_id,
    pn_message_get_priority,
    pn_message_get_subject,
    pn_message_get_ttl,
    pn_message_is_durable,
    pn_message_properties,
)
from cproton_ffi import lib
from proton import Data, Message

from broker.errors import MalformedMessage

__all__ = ["MalformedMessage", "Meta", "check_framing", "current_message_id", "current_properties", "current_subject",
           "current_to",
           "decode", "subject_of", "with_delivery_header"]


class Meta(NamedTuple):
    """What every queue needs of a message: its priority (0-9), absolute expiry (seconds since the epoch, or
    None), and whether it is durable."""

    priority: int
    expires: float | None
    durable: bool


# Width of the size/count field after a constructor, by the constructor's high nibble (AMQP 1.0 part 1, 1.6).
_FIXED_WIDTH = {0x4: 0, 0x5: 1, 0x6: 2, 0x7: 4, 0x8: 8, 0x9: 16}
_SIZED_ONE = frozenset({0xA, 0xC, 0xE})  # variable width / compound / array with a 1-byte size
_SIZED_FOUR = frozenset({0xB, 0xD, 0xF})  # ... with a 4-byte size
_HEADER, _FOOTER = 0x70, 0x78
_BODY_SECTIONS = frozenset({0x75, 0x76})  # data and amqp-sequence sections may repeat
_LISTS = frozenset({0x45, 0xC0, 0xD0, 0x40})  # list0, list8, list32 (or null)
_MAPS = frozenset({0xC1, 0xD1, 0x40})  # map8, map32 (or null)
_SECTION_SHAPES = {0x70: _LISTS, 0x71: _MAPS, 0x72: _MAPS, 0x73: _LISTS, 0x74: _MAPS, 0x78: _MAPS}
_SECTION_TEXT = {0x70: "header", 0x71: "delivery-annotations", 0x72: "message-annotations", 0x73: "properties",
                 0x74: "application-properties", 0x78: "footer"}
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


_MAX_DESCRIBED = 16  # described values inside described values, at most this deep (a chain of 0x00 must not recurse)


def _value_end(data: bytes, off: int, depth: int = 0) -> int:
    """Offset just past the encoded AMQP value starting at `off` (sizes only; the content is not decoded)."""
    code = data[off]
    off += 1
    if code == 0x00:  # described: a descriptor, then the value
        if depth >= _MAX_DESCRIBED:
            raise MalformedMessage(f"byte {off - 1}: described values nested more than {_MAX_DESCRIBED} deep")
        return _value_end(data, _value_end(data, off, depth + 1), depth + 1)
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
            shape = _SECTION_SHAPES.get(code)
            if shape is not None and data[start] not in shape:
                kind = "a list" if shape is _LISTS else "a map"
                raise MalformedMessage(f"byte {off}: {_SECTION_TEXT[code]} must be {kind}")
            off = _value_end(data, start)
    except IndexError:
        raise MalformedMessage("message truncated") from None
    if off != n:
        raise MalformedMessage(f"message truncated: section ends at byte {off} of {n}")


_pn_msg = pn_message()  # one C message reused for every decode (the event loop is single-threaded)
_decode = lib.pn_message_decode  # the C call itself: bytes pass as `char *` without a copy


def decode(data: bytes, now: float | None = None, trusted: bool = False) -> Meta:
    """Check and decode `data` into the shared C message; return the header fields. Raise MalformedMessage.

    `trusted` skips the framing check, for bytes a primary already checked. After this call (and before the next
    one) `current_to()`, `current_subject()` and `current_properties()` read the same message.
    """
    if not trusted:
        check_framing(data)
    msg = _pn_msg
    if _decode(msg, data, len(data)) < 0:
        raise MalformedMessage("cannot decode message")
    expires: float | None = None
    ttl = pn_message_get_ttl(msg)
    if ttl:
        expires = (time.time() if now is None else now) + ttl / 1000.0
    else:
        expiry = pn_message_get_expiry_time(msg)
        if expiry:
            expires = expiry / 1000.0
    return Meta(pn_message_get_priority(msg), expires, pn_message_is_durable(msg))


def current_to() -> str | None:
    """The `to` address of the message decoded last."""
    return pn_message_get_address(_pn_msg)  # type: ignore[no-any-return]


def current_message_id() -> Any:
    """The `message-id` of the message decoded last (None, int, str, bytes or UUID)."""
    return pn_message_get_id(_pn_msg)


def current_subject() -> str | None:
    return pn_message_get_subject(_pn_msg)  # type: ignore[no-any-return]


def current_properties() -> dict[Any, Any] | None:
    """The application properties of the message decoded last; MalformedMessage if they are not a map."""
    props = Data(pn_message_properties(_pn_msg))
    try:
        value = props.get_object() if props.next() else None
    except RecursionError:
        raise MalformedMessage("application-properties nested too deeply") from None
    if value is None:
        return None
    if not isinstance(value, dict):
        raise MalformedMessage("application-properties must be a map")
    return dict(value)


_KEY_TYPES = (str, bytes, int, float, uuid.UUID)  # symbol and char are str; bool, ulong and timestamp are int


def current_key(name: str) -> Any:
    """The application property `name` of the message decoded last, as a last-value key (None: it has none).
    MalformedMessage when it is not a simple value: AMQP allows only those in application-properties, and a list
    or a map cannot key a last-value queue."""
    props = current_properties()
    value = props.get(name) if props else None
    if value is None or isinstance(value, _KEY_TYPES):
        return value
    if isinstance(value, memoryview):  # how proton hands out a binary value: unhashable as it is
        return bytes(value)
    raise MalformedMessage(f"application property {name!r} must be a simple value (the last-value key of a queue), "
                           f"got {type(value).__name__}")


def subject_of(data: bytes) -> str | None:
    """The subject of stored message bytes (off the hot path: dead-lettering)."""
    decode(data, trusted=True)
    return current_subject()


def last_value_key_of(data: bytes, name: str) -> Any:
    """The last-value key `name` of stored message bytes, None when it has none or none a queue can use (off the hot
    path: last-value keys at promotion)."""
    decode(data, trusted=True)
    try:
        return current_key(name)
    except MalformedMessage:
        return None


def with_delivery_header(data: bytes, delivery_count: int, first_acquirer: bool) -> bytes:
    """Re-encode with an updated header (only for redeliveries: off the hot path)."""
    m = Message()
    m.decode(data)
    m.delivery_count = delivery_count
    m.first_acquirer = first_acquirer
    return m.encode()
