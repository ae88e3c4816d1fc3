"""The replication batch: what a replicating browser sends its backup in one transfer (format version 1).

A batch is the queue events one pass of the primary gathered for one (queue, backup), in order: dequeue ranges
first, then enqueued messages with their positions and the facts the backup needs to keep them as the primary does
(priority level, absolute expiry, delivery count, flags). The message bytes travel untouched; nothing is decoded on
either side. The same records can serve catch-up (newest first) and live traffic.

Wire form: the transfer's payload is one AMQP data section (so it is a valid AMQP message) whose binary is::

    batch   = "UB" version:u8 record*
    record  = "D" lo:u64 hi:u64                                               dequeue positions lo..hi
            | "E" position:u64 level:u8 flags:u8 count:u32 expires:f64 length:u32 bytes[length]
                                                                              enqueue (expires 0 = none)

All integers are big-endian. `parse` checks everything before anything is applied (a batch is applied whole or
not at all) and raises `BatchError` naming the first problem: wrong magic or version, a truncated or unknown record,
a position of 0, lo > hi, a message longer than the limit, a position twice in one batch.

Negotiation: a backup that understands version 1 attaches its replicating browser with link property
``batch: 1``; a primary that sends batches answers with ``batch: 1`` in its attach. Anyone else keeps the
per-message format (see ha.protocol), so a rolling upgrade works in either order.

Acknowledgements (`$ha.acks`, one transfer per pass of the backup) have a binary form too, used when the primary's
connection properties say ``x-understudy-acks-format: 1`` (a primary reads both forms; it tells them apart by the
first section)::

    acks    = "UA" version:u8 (name-length:u16 name ranges:u32 (lo:u64 hi:u64)*)*
"""

from __future__ import annotations

import struct
from collections.abc import Iterable

from broker.errors import BatchError

VERSION = 1
MAGIC = b"UB"
_HEAD = MAGIC + bytes([VERSION])
_ENQ = struct.Struct(">cQBBIdI")
_DEQ = struct.Struct(">cQQ")
_ENQ_SIZE = _ENQ.size
ENQUEUE = _ENQ  # the enqueue record's header, for hot loops that pack records themselves (then update size, count)
_SECTION = struct.Struct(">BBBBI")  # 0x00 0x53 0x75 (data section) 0xb0 (vbin32) length
_SECTION_HEAD = b"\x00\x53\x75\xb0"
_E = b"E"
_D = b"D"

DEFAULT_LIMIT = 256 * 1024  # bytes of records per batch (a single larger message travels alone)

Enqueue = tuple[int, int, int, int, float, bytes]  # position, level, flags, delivery count, expires (0 = none), data
Dequeue = tuple[int, int]  # lo, hi


_ACK_HEAD = b"UA" + bytes([VERSION])
_RANGE = struct.Struct(">QQ")
_NAME = struct.Struct(">H")
_COUNT = struct.Struct(">I")


def encode_acks(acks: dict[str, Iterable[tuple[int, int]]]) -> bytes:
    """{queue: [(lo, hi), ...]} as one AMQP data section (the binary acknowledgement form)."""
    parts = [b"", _ACK_HEAD]
    for name, ranges in acks.items():
        raw = name.encode()
        rs = list(ranges)
        parts.append(_NAME.pack(len(raw)) + raw + _COUNT.pack(len(rs)))
        parts.extend(_RANGE.pack(lo, hi) for lo, hi in rs)
    size = sum(len(p) for p in parts)
    parts[0] = _SECTION_HEAD + size.to_bytes(4, "big")
    return b"".join(parts)


def is_binary_acks(payload: bytes) -> bool:
    return payload[:4] == _SECTION_HEAD and payload[8:10] == b"UA"


def parse_acks(payload: bytes) -> dict[str, list[tuple[int, int]]]:
    """The binary acknowledgement form back to {queue: [(lo, hi), ...]}. Raises BatchError (nothing partial)."""
    if not is_binary_acks(payload):
        raise BatchError("not a binary acknowledgement")
    end = 8 + int.from_bytes(payload[4:8], "big")
    if end != len(payload):
        raise BatchError("acknowledgement length does not match its section")
    if payload[8:11] != _ACK_HEAD:
        raise BatchError(f"acknowledgement format version {payload[10]} is not supported")
    off = 11
    out: dict[str, list[tuple[int, int]]] = {}
    try:
        while off < end:
            (n,) = _NAME.unpack_from(payload, off)
            off += 2
            if off + n > end:
                raise BatchError("acknowledgement truncated in a queue name")
            name = payload[off : off + n].decode()
            off += n
            (count,) = _COUNT.unpack_from(payload, off)
            off += 4
            if off + 16 * count > end:
                raise BatchError(f"acknowledgement of {name!r} truncated")
            ranges = out.setdefault(name, [])
            for _ in range(count):
                lo, hi = _RANGE.unpack_from(payload, off)
                off += 16
                if lo == 0 or lo > hi:
                    raise BatchError(f"acknowledgement of {name!r}: bad range {lo}..{hi}")
                ranges.append((lo, hi))
    except (struct.error, UnicodeDecodeError) as e:
        raise BatchError(f"acknowledgement truncated or garbled: {e}") from None
    return out


class BatchWriter:
    """Collects records for one transfer. `full` says when the next enqueue should start a new batch."""

    __slots__ = ("count", "limit", "parts", "size")

    def __init__(self, limit: int = DEFAULT_LIMIT) -> None:
        self.limit = limit
        self.parts: list[bytes] = [b"", _HEAD]  # parts[0]: the data-section header, filled in by payload()
        self.size = len(_HEAD)
        self.count = 0

    def dequeue(self, lo: int, hi: int) -> None:
        self.parts.append(_DEQ.pack(_D, lo, hi))
        self.size += _DEQ.size
        self.count += 1

    def dequeue_ranges(self, ranges: Iterable[tuple[int, int]]) -> None:
        for lo, hi in ranges:
            self.dequeue(lo, hi)

    def enqueue(self, position: int, level: int, flags: int, count: int, expires: float | None, data: bytes) -> None:
        n = len(data)
        self.parts.append(_ENQ.pack(_E, position, level, flags, count, expires or 0.0, n))
        self.parts.append(data)
        self.size += _ENQ_SIZE + n
        self.count += 1

    @property
    def full(self) -> bool:
        return self.size >= self.limit

    def __bool__(self) -> bool:
        return self.count > 0

    def payload(self) -> bytes:
        """The transfer payload: one AMQP data section holding the batch."""
        self.parts[0] = _SECTION_HEAD + self.size.to_bytes(4, "big")
        return b"".join(self.parts)


def parse(payload: bytes, max_message: int) -> list[Enqueue | Dequeue]:
    """The records of a batch transfer, in order (enqueues are 6-tuples, dequeue ranges 2-tuples).
    Raises BatchError; never returns a partial result."""
    if len(payload) < _SECTION.size + len(_HEAD) or payload[:4] != _SECTION_HEAD:
        raise BatchError("not a replication batch (no data section)")
    size = int.from_bytes(payload[4:8], "big")
    end = 8 + size
    if end != len(payload):
        raise BatchError(f"batch section says {size} bytes, transfer has {len(payload) - 8}")
    if payload[8:11] != _HEAD:
        got = payload[8:11]
        if got[:2] == MAGIC:
            raise BatchError(f"batch format version {got[2]} is not supported (this broker reads {VERSION})")
        raise BatchError("not a replication batch (bad magic)")
    off = 11
    out: list[Enqueue | Dequeue] = []
    seen: set[int] = set()
    enq, deq = _ENQ, _DEQ
    esize, dsize = enq.size, deq.size
    while off < end:
        kind = payload[off : off + 1]
        if kind == _E:
            if off + esize > end:
                raise BatchError(f"truncated enqueue record at byte {off}")
            _, pos, level, flags, count, expires, n = enq.unpack_from(payload, off)
            off += esize
            if pos == 0:
                raise BatchError(f"enqueue record at byte {off - esize}: position 0")
            if n > max_message:
                raise BatchError(f"enqueue of position {pos}: {n} bytes is over the limit of {max_message}")
            if off + n > end:
                raise BatchError(f"enqueue of position {pos}: message truncated")
            if pos in seen:
                raise BatchError(f"position {pos} twice in one batch")
            seen.add(pos)
            out.append((pos, level, flags, count, expires, payload[off : off + n]))
            off += n
        elif kind == _D:
            if off + dsize > end:
                raise BatchError(f"truncated dequeue record at byte {off}")
            _, lo, hi = deq.unpack_from(payload, off)
            if lo == 0 or lo > hi:
                raise BatchError(f"dequeue record at byte {off}: bad range {lo}..{hi}")
            off += dsize
            out.append((lo, hi))
        else:
            raise BatchError(f"unknown record kind {kind!r} at byte {off}")
    return out
