"""The replication batch: what a replicating browser sends its backup in one transfer (format versions 1 to 4).

A batch is the queue events one pass of the primary gathered for one (queue, backup), in order: dequeue ranges
first, then enqueued messages with their positions and the facts the backup needs to keep them as the primary does
(priority level, absolute expiry, delivery count, flags). The message bytes travel untouched; nothing is decoded on
either side. The same records can serve catch-up (newest first) and live traffic.

Wire form: the transfer's payload is one AMQP data section (so it is a valid AMQP message) whose binary is::

    batch   = "UB" version:u8 record*
    record  = "D" lo:u64 hi:u64                                               dequeue positions lo..hi
            | "E" position:u64 level:u8 flags:u8 count:u32 expires:f64 length:u32 bytes[length]
                                                                              enqueue (expires 0 = none)

Version 2 (negotiated, see below) adds three record kinds, and gives two enqueue flags a meaning on the wire::

            | "A" lo:u64 hi:u64                                               positions lo..hi acquired by consumers
            | "R" position:u64 flags:u8 count:u32                             released: the message as it is now
            | "W" n:u32 (time:f64 length:u16 id[length])*                     the queue's duplicate window, replaced

    enqueue flags: 1 redelivered, 2 durable, 16 acquired (a consumer holds it unsettled), 32 windowed (its
    message-id entered the queue's duplicate window when the primary took it)

A backup keeps a message acquired on the primary as it would come back after a failover (delivery count + 1,
redelivered); a release sets it to what the primary has. A reader of version 1 ignores flags it does not know.

Version 3 (negotiated the same way) adds one record kind, always before any other record of its batch::

            | "X" txn:u64 parts:u16                                           this batch is one part of transaction
                                                                              unit `txn`, which has `parts` parts

Version 4 (negotiated the same way) adds one record kind::

            | "G" position:u64 length:u16 id[length]                          gone: the message at `position` (of
                                                                              a duplicate window) was dequeued on
                                                                              the primary; take its id (when length
                                                                              > 0) into the window, keep nothing

A backup acknowledges a "G" position as it would an enqueue. The primary sends one for a windowed message that a
consumer took before the message itself went out (with its id), and, without the id, for one the backup has to
acknowledge although it will never be sent (its id came in the window the browser's first batch carried): a
windowed message's publisher is settled only once every backup has its id (docs/replication.md, "Exactly once").

A transaction unit is the transactions a pass of the primary committed (broker.transactions); it has one part per
queue it touched that this backup replicates, each part a batch of that queue on the same connection holding all of
the unit's records of that queue. The backup applies a part only together with all the others (ha.core.txnparts);
a batch with several "X" records belongs to each of those units (a browser that could not send for a while).

All integers are big-endian. `parse` checks everything before anything is applied (a batch is applied whole or
not at all) and raises `BatchError` naming the first problem: wrong magic or version, a truncated or unknown record,
a position of 0, lo > hi, a message longer than the limit, a position twice in one batch.

Negotiation: a backup that understands version 1 attaches its replicating browser with link property
``batch: 1``; a primary that sends batches answers with ``batch: 1`` in its attach. Anyone else keeps the
per-message format (see ha.protocol), so a rolling upgrade works in either order. A backup that also reads version
2 adds ``batch-max: 2``; a primary that sends version 2 answers ``batch-max: 2``, else its batches are version 1
(and a version-1 primary ignores the property). Likewise ``batch-max: 3`` (`negotiate`): a backup that reads
only version 2 gets version-2 batches, and transactions replicated record by record as before.

Acknowledgements (`$ha.acks`, one transfer per pass of the backup) have a binary form too, used when the primary's
connection properties say ``x-understudy-acks-format: 1`` (a primary reads both forms; it tells them apart by the
first section)::

    acks    = "UA" 1 (name-length:u16 name ranges:u32 (lo:u64 hi:u64)*)*
            | "UA" 2 (name-length:u16 name ranges:u32 (lo:u64 hi:u64)* dequeued:u32 (lo:u64 hi:u64)*)*

Version 2 also acknowledges the dequeue ranges the backup applied (and journaled), so that the primary can answer a
consumer's accept once every backup has the dequeue (ha.core.accepts). A backup sends it only to a primary whose
connection properties say ``x-understudy-dequeue-acks: 1``; the primary then reads both versions.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from typing import NamedTuple

from broker.errors import BatchError

VERSION = 1
VERSION_MAX = 4  # the newest batch format this broker writes and reads
VERSION_TXN = 3  # the first version with transaction parts ("X")
VERSION_GONE = 4  # the first version with "G" (gone) records
MAGIC = b"UB"
_HEAD = MAGIC + bytes([VERSION])
_HEADS = {v: MAGIC + bytes([v]) for v in range(1, VERSION_MAX + 1)}
_ENQ = struct.Struct(">cQBBIdI")
_DEQ = struct.Struct(">cQQ")
_ENQ_SIZE = _ENQ.size
ENQUEUE = _ENQ  # the enqueue record's header, for hot loops that pack records themselves (then update size, count)
_SECTION = struct.Struct(">BBBBI")  # 0x00 0x53 0x75 (data section) 0xb0 (vbin32) length
_SECTION_HEAD = b"\x00\x53\x75\xb0"
_E = b"E"
_D = b"D"
_A = b"A"
_R = b"R"
_W = b"W"
_REL = struct.Struct(">cQBI")
_WHEAD = struct.Struct(">cI")
_WITEM = struct.Struct(">dH")
_X = b"X"
_TXN = struct.Struct(">cQH")
_G = b"G"
GONE = struct.Struct(">cQH")  # a "G" record's header, for the sender's hot loop (then the id's bytes)

FLAG_ACQUIRED = 16  # version 2: a consumer holds the message (broker.queue.HELD on a backup)
FLAG_WINDOWED = 32  # version 2: its message-id entered the queue's duplicate window (broker.queue.WINDOWED)

DEFAULT_LIMIT = 256 * 1024  # bytes of records per batch (a single larger message travels alone)

Enqueue = tuple[int, int, int, int, float, bytes]  # position, level, flags, delivery count, expires (0 = none), data
Dequeue = tuple[int, int]  # lo, hi


class Acquired(NamedTuple):
    """Version 2: positions lo..hi were acquired by consumers of the primary."""

    kind: str
    lo: int
    hi: int


class Released(NamedTuple):
    """Version 2: the message at `position` was released; `flags` and `count` are what the primary has now."""

    kind: str
    position: int
    flags: int
    delivery_count: int


class Window(NamedTuple):
    """Version 2: the queue's duplicate window is exactly `items` ((id key, time), oldest first)."""

    kind: str
    items: list[tuple[bytes, float]]


class TxnPart(NamedTuple):
    """Version 3: this batch is one of the `parts` parts of transaction unit `txn` (first in its batch)."""

    kind: str
    txn: int
    parts: int


class Gone(NamedTuple):
    """Version 4: the windowed message at `position` was dequeued on the primary: acknowledge the position, take
    `key` (an id key as broker.dedup makes them; b"" for none) into the window, keep no message."""

    kind: str
    position: int
    key: bytes


Record = Enqueue | Dequeue | Acquired | Released | Window | TxnPart | Gone  # by type: `type(r) is tuple` for the first two


def negotiate(batch: bool, offered: object) -> int:
    """The batch format version a primary writes to a browser whose backup offered `batch-max: offered` (1 without
    batches or without an offer of 2 or more)."""
    if not batch or not isinstance(offered, int) or isinstance(offered, bool) or offered < 2:
        return 1
    return min(offered, VERSION_MAX)


def txn_parts(records: list[Record]) -> list[tuple[int, int]]:
    """The (txn, parts) of a parsed batch's leading "X" records ([] for a batch outside any transaction)."""
    out: list[tuple[int, int]] = []
    for r in records:
        if type(r) is not TxnPart:
            break
        out.append((r.txn, r.parts))  # type: ignore[union-attr]
    return out


_ACK_HEADS = {v: b"UA" + bytes([v]) for v in (1, 2)}
_RANGE = struct.Struct(">QQ")
_NAME = struct.Struct(">H")
_COUNT = struct.Struct(">I")

Ranges = list[tuple[int, int]]


def encode_acks(acks: dict[str, Iterable[tuple[int, int]]],
                dequeued: dict[str, Iterable[tuple[int, int]]] | None = None) -> bytes:
    """{queue: [(lo, hi), ...]} as one AMQP data section (the binary acknowledgement form): version 1, or version 2
    when `dequeued` (the dequeue ranges applied, per queue) is given."""
    parts = [b"", _ACK_HEADS[1 if dequeued is None else 2]]
    names = list(acks) if dequeued is None else list(dict.fromkeys([*acks, *dequeued]))
    for name in names:
        raw = name.encode()
        parts.append(_NAME.pack(len(raw)) + raw)
        sections = [acks.get(name, ())] if dequeued is None else [acks.get(name, ()), dequeued.get(name, ())]
        for ranges in sections:
            rs = list(ranges)
            parts.append(_COUNT.pack(len(rs)))
            parts.extend(_RANGE.pack(lo, hi) for lo, hi in rs)
    size = sum(len(p) for p in parts)
    parts[0] = _SECTION_HEAD + size.to_bytes(4, "big")
    return b"".join(parts)


def is_binary_acks(payload: bytes) -> bool:
    return payload[:4] == _SECTION_HEAD and payload[8:10] == b"UA"


def parse_acks(payload: bytes) -> tuple[dict[str, Ranges], dict[str, Ranges]]:
    """The binary acknowledgement form back to ({queue: applied [(lo, hi), ...]}, {queue: dequeued ranges}) (the
    second is empty in version 1). Raises BatchError (nothing partial)."""
    if not is_binary_acks(payload):
        raise BatchError("not a binary acknowledgement")
    end = 8 + int.from_bytes(payload[4:8], "big")
    if end != len(payload):
        raise BatchError("acknowledgement length does not match its section")
    version = payload[10] if len(payload) > 10 else 0
    if payload[8:11] != _ACK_HEADS.get(version):
        raise BatchError(f"acknowledgement format version {version} is not supported")
    off = 11
    applied: dict[str, Ranges] = {}
    dequeued: dict[str, Ranges] = {}
    outs = [applied] if version == 1 else [applied, dequeued]
    try:
        while off < end:
            (n,) = _NAME.unpack_from(payload, off)
            off += 2
            if off + n > end:
                raise BatchError("acknowledgement truncated in a queue name")
            name = payload[off : off + n].decode()
            off += n
            for out in outs:
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
    return applied, {k: v for k, v in dequeued.items() if v}


class BatchWriter:
    """Collects records for one transfer. `full` says when the next enqueue should start a new batch."""

    __slots__ = ("count", "limit", "parts", "size", "version")

    def __init__(self, limit: int = DEFAULT_LIMIT, version: int = VERSION) -> None:
        head = _HEADS.get(version)
        if head is None:
            raise ValueError(f"no batch format version {version}")
        self.limit = limit
        self.version = version
        self.parts: list[bytes] = [b"", head]  # parts[0]: the data-section header, filled in by payload()
        self.size = len(head)
        self.count = 0

    def dequeue(self, lo: int, hi: int) -> None:
        self.parts.append(_DEQ.pack(_D, lo, hi))
        self.size += _DEQ.size
        self.count += 1

    def dequeue_ranges(self, ranges: Iterable[tuple[int, int]]) -> None:
        for lo, hi in ranges:
            self.dequeue(lo, hi)

    def acquired(self, lo: int, hi: int) -> None:
        """Version 2 only."""
        assert self.version >= 2
        self.parts.append(_DEQ.pack(_A, lo, hi))
        self.size += _DEQ.size
        self.count += 1

    def released(self, position: int, flags: int, count: int) -> None:
        """Version 2 only."""
        assert self.version >= 2
        self.parts.append(_REL.pack(_R, position, flags & 0xFF, count))
        self.size += _REL.size
        self.count += 1

    def window(self, items: list[tuple[bytes, float]]) -> None:
        """Version 2 only: the whole duplicate window (ids over 65535 bytes are never in one: broker.dedup)."""
        assert self.version >= 2
        parts = [_WHEAD.pack(_W, len(items))]
        for k, t in items:
            parts.append(_WITEM.pack(t, len(k)))
            parts.append(k)
        blob = b"".join(parts)
        self.parts.append(blob)
        self.size += len(blob)
        self.count += 1

    def txn(self, txn: int, parts: int) -> None:
        """Version 3 only, before any other record: this batch is one of the `parts` parts of unit `txn`."""
        assert self.version >= VERSION_TXN
        if not 1 <= parts <= 0xFFFF or not 1 <= txn < 2**64:
            raise ValueError(f"transaction part {txn}: {parts} parts")
        self.parts.append(_TXN.pack(_X, txn, parts))
        self.size += _TXN.size
        self.count += 1

    def gone(self, position: int, key: bytes = b"") -> None:
        """Version 4 only: the windowed message at `position` is gone; `key` its id (b"": acknowledge only)."""
        assert self.version >= VERSION_GONE
        self.parts.append(GONE.pack(_G, position, len(key)))
        if key:
            self.parts.append(key)
        self.size += GONE.size + len(key)
        self.count += 1

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


def parse(payload: bytes, max_message: int) -> list[Record]:
    """The records of a batch transfer, in order (enqueues are 6-tuples, dequeue ranges 2-tuples, the version-2
    kinds named tuples). Raises BatchError; never returns a partial result."""
    if len(payload) < _SECTION.size + len(_HEAD) or payload[:4] != _SECTION_HEAD:
        raise BatchError("not a replication batch (no data section)")
    size = int.from_bytes(payload[4:8], "big")
    end = 8 + size
    if end != len(payload):
        raise BatchError(f"batch section says {size} bytes, transfer has {len(payload) - 8}")
    got = payload[8:11]
    if got[:2] != MAGIC:
        raise BatchError("not a replication batch (bad magic)")
    version = got[2]
    if version not in _HEADS:
        raise BatchError(f"batch format version {version} is not supported (this broker reads 1..{VERSION_MAX})")
    off = 11
    out: list[Record] = []
    seen: set[int] = set()
    txns: set[int] = set()
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
        elif version >= 2 and kind == _A:
            if off + dsize > end:
                raise BatchError(f"truncated acquired record at byte {off}")
            _, lo, hi = deq.unpack_from(payload, off)
            if lo == 0 or lo > hi:
                raise BatchError(f"acquired record at byte {off}: bad range {lo}..{hi}")
            off += dsize
            out.append(Acquired("A", lo, hi))
        elif version >= 2 and kind == _R:
            if off + _REL.size > end:
                raise BatchError(f"truncated released record at byte {off}")
            _, pos, flags, count = _REL.unpack_from(payload, off)
            if pos == 0:
                raise BatchError(f"released record at byte {off}: position 0")
            off += _REL.size
            out.append(Released("R", pos, flags, count))
        elif version >= 2 and kind == _W:
            off, items = _parse_window(payload, off, end)
            out.append(Window("W", items))
        elif version >= VERSION_TXN and kind == _X:
            if off + _TXN.size > end:
                raise BatchError(f"truncated transaction record at byte {off}")
            if len(out) != len(txns):
                raise BatchError(f"transaction record at byte {off} after other records")
            _, txn, parts = _TXN.unpack_from(payload, off)
            if txn == 0 or parts == 0:
                raise BatchError(f"transaction record at byte {off}: txn {txn}, {parts} parts")
            if txn in txns:
                raise BatchError(f"transaction {txn} twice in one batch")
            txns.add(txn)
            off += _TXN.size
            out.append(TxnPart("X", txn, parts))
        elif version >= VERSION_GONE and kind == _G:
            if off + GONE.size > end:
                raise BatchError(f"truncated gone record at byte {off}")
            _, pos, n = GONE.unpack_from(payload, off)
            if pos == 0:
                raise BatchError(f"gone record at byte {off}: position 0")
            off += GONE.size
            if off + n > end:
                raise BatchError(f"gone record of position {pos}: id truncated")
            out.append(Gone("G", pos, payload[off : off + n]))
            off += n
        else:
            raise BatchError(f"unknown record kind {kind!r} at byte {off}")
    return out


def _parse_window(payload: bytes, off: int, end: int) -> tuple[int, list[tuple[bytes, float]]]:
    if off + _WHEAD.size > end:
        raise BatchError(f"truncated window record at byte {off}")
    start = off
    _, n = _WHEAD.unpack_from(payload, off)
    off += _WHEAD.size
    if n * _WITEM.size > end - off:
        raise BatchError(f"window record at byte {start}: {n} ids cannot fit")
    items: list[tuple[bytes, float]] = []
    isize = _WITEM.size
    for _ in range(n):
        if off + isize > end:
            raise BatchError(f"window record at byte {start}: truncated")
        t, k = _WITEM.unpack_from(payload, off)
        off += isize
        if k == 0 or off + k > end:
            raise BatchError(f"window record at byte {start}: bad id length {k}")
        items.append((payload[off : off + k], t))
        off += k
    return off, items
