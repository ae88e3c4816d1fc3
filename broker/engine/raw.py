"""Raw proton-C calls for the hot path: receive, send, settle and credit without proton's Python objects.

Everything here takes cffi pointers (``link._impl``, ``delivery`` pointers from events) and calls proton-C through
``cproton_ffi.lib`` directly: one delivery costs a handful of C calls (~0.1-0.2 µs each) instead of proton's
wrapper objects (~25 µs per event, see docs/performance.md). Single-threaded: the buffers are shared by every caller
on the event loop thread.

Pointer lifetime: a delivery pointer is valid while its link is not freed and the delivery is not settled locally.
Our link handlers pin their link with its Python wrapper, and every holder of a delivery pointer checks that its
link handler is still open before touching it (a settled delivery may be recycled by proton for a new one).
"""

from __future__ import annotations

from typing import Any

from cproton_ffi import ffi, lib

NULL = ffi.NULL

# AMQP outcomes (pn_delivery_remote_state)
ACCEPTED = lib.PN_ACCEPTED
REJECTED = lib.PN_REJECTED
RELEASED = lib.PN_RELEASED
MODIFIED = lib.PN_MODIFIED
RECEIVED = lib.PN_RECEIVED

SND_SETTLED = lib.PN_SND_SETTLED

# Calls used per message, bound once (attribute lookups on `lib` are not free).
link_credit = lib.pn_link_credit
link_flow = lib.pn_link_flow
link_advance = lib.pn_link_advance
link_send = lib.pn_link_send
link_recv = lib.pn_link_recv
link_draining = lib.pn_link_draining
link_drained = lib.pn_link_drained
link_remote_snd_settle_mode = lib.pn_link_remote_snd_settle_mode
delivery_new = lib.pn_delivery
delivery_link = lib.pn_delivery_link
delivery_partial = lib.pn_delivery_partial
delivery_pending = lib.pn_delivery_pending
delivery_aborted = lib.pn_delivery_aborted
delivery_settled = lib.pn_delivery_settled  # settled by the peer
delivery_settle = lib.pn_delivery_settle
delivery_update = lib.pn_delivery_update
delivery_remote_state = lib.pn_delivery_remote_state
delivery_remote = lib.pn_delivery_remote
disposition_is_failed = lib.pn_disposition_is_failed
disposition_is_undeliverable = lib.pn_disposition_is_undeliverable

_recv_size = 1 << 16
_recv_buf = bytearray(_recv_size)
_recv_c = ffi.from_buffer(_recv_buf)

# One tag buffer, rewritten for each new delivery (pn_delivery copies the tag).
_tag_value = ffi.new("uint64_t *")
_tag = ffi.new("pn_bytes_t *", (8, ffi.cast("char *", _tag_value)))
_tag_struct = _tag[0]


def recv(link: Any, n: int) -> bytes:
    """The whole pending payload (``n`` = ``pn_delivery_pending``) of the current delivery, then advance."""
    global _recv_buf, _recv_c, _recv_size
    if n > _recv_size:
        _recv_size = max(n, 2 * _recv_size)
        _recv_buf = bytearray(_recv_size)
        _recv_c = ffi.from_buffer(_recv_buf)
    got = link_recv(link, _recv_c, n)
    link_advance(link)
    if got <= 0:
        return b""
    return ffi.buffer(_recv_c, got)[:]


def send(link: Any, tag: int, data: bytes) -> Any:
    """Start a delivery tagged ``tag`` (unique among the link's unsettled ones), send ``data``, advance.
    Returns the delivery pointer (settle it for pre-settled sends)."""
    if type(data) is not bytes:
        data = bytes(data)  # proton's Message.encode gives a bytearray
    _tag_value[0] = tag
    d = delivery_new(link, _tag_struct)
    link_send(link, data, len(data))
    link_advance(link)
    return d


def send_settled(link: Any, tag: int, data: bytes) -> None:
    """A pre-settled transfer (at most once, no outcome expected)."""
    if type(data) is not bytes:
        data = bytes(data)
    _tag_value[0] = tag
    d = delivery_new(link, _tag_struct)
    link_send(link, data, len(data))
    link_advance(link)
    delivery_settle(d)


def send_tagged(link: Any, tag: bytes, data: bytes) -> Any:
    """Like `send`, with a tag of our choosing (the per-message replication format names positions in tags)."""
    if type(data) is not bytes:
        data = bytes(data)
    t = ffi.new("char[]", tag)
    d = delivery_new(link, (len(tag), t))
    link_send(link, data, len(data))
    link_advance(link)
    return d


def accept(d: Any) -> None:
    """Settle a received delivery as accepted (unless the sender already settled it)."""
    if not delivery_settled(d):
        delivery_update(d, ACCEPTED)
    delivery_settle(d)


def top_up(link: Any, window: int, held: int) -> None:
    """Credit a receiver up to ``window`` minus ``held`` unsettled deliveries, in half-window steps (a held
    delivery is backpressure)."""
    credit = link_credit(link)
    room = window - held - credit
    if room >= window // 2 or (credit == 0 and room > 0):
        link_flow(link, room)


