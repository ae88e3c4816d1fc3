"""The journal's on-disk format (pure: bytes in, records out; no files).

A journal is a directory of numbered segment files `00000001.jnl`, `00000002.jnl`, ... each starting with a header::

    header  = "UJNL" format:u16 segment:u32                       (10 bytes)

followed by records, each framed so that a torn or damaged one is recognised::

    record  = length:u32 crc32:u32 kind:u8 payload[length - 1]    (crc32 over kind and payload)

Kinds (integers big-endian; names and arguments as UTF-8 JSON, wiring is rare):

    ENQUEUE   queue:u32 position:u64 level:u8 flags:u8 count:u32 expires:f64 body   a durable message
    DEQUEUE   queue:u32 lo:u64 hi:u64                                             positions gone from a queue
    QUEUE     queue:u32 json{name, uuid, arguments, next}                         a durable queue (or its state)
    UNQUEUE   queue:u32                                                           the queue was deleted
    EXCHANGE  json{name, type, uuid, arguments}                                   a durable exchange
    UNEXCHANGE json{name}
    BIND      json{exchange, queue, key, arguments}                                a binding of durable ends
    UNBIND    json{exchange, queue, key}
    STATE     json{epoch, role, state}                                            the broker's HA standing
    DEDUP     queue:u32 reset:u8 (time:f64 length:u16 id[length])*                 ids added to a queue's duplicate
                                                                                  window (reset 1: the whole window)
    UNIT      length:u32                                                          the next `length` bytes of records
                                                                                  stand or fall together (format 2)

A UNIT record opens a pass's write that holds a committed transaction (the rest of that write: the commit's
enqueues and dequeues, and whatever else the pass journaled). Recovery keeps all of it or, when a crash cut the write
short or damaged a record in it, none of it: the torn tail is cut at the UNIT record, so a transaction the client
never saw settle is never half on disk.

A queue is named by a number (`queue:u32`) given in its QUEUE record, so message records stay small. `next` in a
QUEUE record is the queue's next position when it was written (positions are never reused, even after every message
was consumed and the segments holding them were dropped).

`scan` reads records from a buffer and tells a clean end from a torn tail (the last record incomplete or its CRC
wrong: a write that a crash cut short) and from damage in the middle.
"""

from __future__ import annotations

import json
import struct
import zlib
from dataclasses import dataclass
from typing import Any, NamedTuple

from broker.errors import BrokerError

MAGIC = b"UJNL"
FORMAT = 2  # 2: UNIT records (a release reading format 1 refuses a format-2 journal rather than misreading one)
HEADER = struct.Struct(">4sHI")
FRAME = struct.Struct(">II")  # length (of kind + payload), crc32

ENQUEUE, DEQUEUE, QUEUE, UNQUEUE, EXCHANGE, UNEXCHANGE, BIND, UNBIND, STATE, DEDUP, UNIT = range(1, 12)
KINDS = {ENQUEUE: "enqueue", DEQUEUE: "dequeue", QUEUE: "queue", UNQUEUE: "unqueue", EXCHANGE: "exchange",
         UNEXCHANGE: "unexchange", BIND: "bind", UNBIND: "unbind", STATE: "state", DEDUP: "dedup", UNIT: "unit"}

_ENQ = struct.Struct(">IQBBId")  # queue, position, level, flags, count, expires (0 = none)
ENQ_HEAD = _ENQ.size  # bytes of an ENQUEUE payload before the message
ENQ = _ENQ  # for the replay's hot loop (broker.store.store.Image)
ENQUEUE_OVERHEAD = FRAME.size + 1 + ENQ_HEAD  # bytes of an ENQUEUE record besides the message
_DEQ = struct.Struct(">IQQ")
_QID = struct.Struct(">I")
_DEDUP = struct.Struct(">IB")
_ID = struct.Struct(">dH")
_UNIT = struct.Struct(">I")
UNIT_SIZE = FRAME.size + 1 + _UNIT.size  # bytes of a UNIT record
_crc = zlib.crc32
MAX_RECORD = 1 << 30


class JournalError(BrokerError):
    """The journal cannot be used as it is (damaged in the middle, a newer format, unreadable)."""


def header(segment: int) -> bytes:
    return HEADER.pack(MAGIC, FORMAT, segment)


def check_header(data: bytes, name: str) -> int:
    """The segment number of a segment file's header; JournalError if it is not one we can read."""
    if len(data) < HEADER.size:
        raise JournalError(f"{name}: too short for a journal segment header")
    magic, fmt, segment = HEADER.unpack_from(data)
    if magic != MAGIC:
        raise JournalError(f"{name}: not a journal segment (magic {magic!r})")
    if fmt > FORMAT:
        raise JournalError(f"{name}: journal format {fmt} is newer than this broker's ({FORMAT}); "
                           "use the release that wrote it, or move the data directory away")
    return int(segment)


def frame(kind: int, payload: bytes) -> bytes:
    body = bytes((kind,)) + payload
    return FRAME.pack(len(body), _crc(body)) + body


def enqueue(queue: int, position: int, level: int, flags: int, count: int, expires: float | None,
            data: bytes) -> bytes:
    head = bytes((ENQUEUE,)) + _ENQ.pack(queue, position, level, flags, count, expires or 0.0)
    return FRAME.pack(len(head) + len(data), _crc(data, _crc(head))) + head + data


def dequeue(queue: int, lo: int, hi: int) -> bytes:
    return frame(DEQUEUE, _DEQ.pack(queue, lo, hi))


def queue(qid: int, name: str, uuid: str, arguments: dict[str, Any], next_position: int) -> bytes:
    doc = {"name": name, "uuid": uuid, "arguments": arguments, "next": next_position}
    return frame(QUEUE, _QID.pack(qid) + json.dumps(doc, separators=(",", ":")).encode())


def unqueue(qid: int) -> bytes:
    return frame(UNQUEUE, _QID.pack(qid))


def dedup(qid: int, items: list[tuple[bytes, float]], reset: bool) -> bytes:
    """Ids (oldest first) added to a queue's duplicate window, or (`reset`) the whole window (broker.dedup)."""
    parts = [_DEDUP.pack(qid, 1 if reset else 0)]
    for k, t in items:
        parts.append(_ID.pack(t, len(k)))
        parts.append(k)
    return frame(DEDUP, b"".join(parts))


def unit(length: int) -> bytes:
    """The UNIT record opening `length` bytes of records that recovery keeps whole or not at all."""
    return frame(UNIT, _UNIT.pack(length))


def document(kind: int, doc: dict[str, Any]) -> bytes:
    """EXCHANGE, UNEXCHANGE, BIND, UNBIND, STATE."""
    return frame(kind, json.dumps(doc, separators=(",", ":")).encode())


class Record(NamedTuple):  # a tuple: a million of them are made at recovery
    kind: int
    payload: memoryview
    offset: int  # of the frame, in the buffer scanned

    def enqueue_head(self) -> tuple[int, int, int, int, int, float | None]:
        """An ENQUEUE record's fields without copying the message out."""
        q, pos, level, flags, count, expires = _ENQ.unpack_from(self.payload)
        return q, pos, level, flags, count, expires or None

    def enqueue(self) -> tuple[int, int, int, int, int, float | None, bytes]:
        q, pos, level, flags, count, expires = _ENQ.unpack_from(self.payload)
        return q, pos, level, flags, count, expires or None, bytes(self.payload[_ENQ.size:])

    def dequeue(self) -> tuple[int, int, int]:
        q, lo, hi = _DEQ.unpack_from(self.payload)
        return q, lo, hi

    def queue(self) -> tuple[int, dict[str, Any]]:
        (qid,) = _QID.unpack_from(self.payload)
        return qid, json.loads(bytes(self.payload[4:]))

    def dedup(self) -> tuple[int, bool, list[tuple[bytes, float]]]:
        """A DEDUP record: queue, reset, ids (ValueError if it does not add up: the CRC passed, so a bug)."""
        p = self.payload
        qid, reset = _DEDUP.unpack_from(p)
        off, n = _DEDUP.size, len(p)
        items: list[tuple[bytes, float]] = []
        while off < n:
            t, k = _ID.unpack_from(p, off)
            off += _ID.size
            if off + k > n:
                raise ValueError("dedup record truncated")
            items.append((bytes(p[off : off + k]), t))
            off += k
        return qid, bool(reset), items

    def qid(self) -> int:
        return int(_QID.unpack_from(self.payload)[0])

    def document(self) -> dict[str, Any]:
        doc = json.loads(bytes(self.payload))
        if not isinstance(doc, dict):
            raise ValueError("not a JSON object")
        return doc


@dataclass(frozen=True)
class ScanEnd:
    """How a scan ended: `good` = bytes of whole records from the start; `torn` = what follows is an incomplete
    or damaged last record; `damaged` = a bad record followed by more data (not a crash's cut: real damage)."""

    good: int
    torn: bool
    damaged: bool
    reason: str = ""


def scan(data: bytes | memoryview, start: int = 0) -> tuple[list[Record], ScanEnd]:
    """The records in `data` from `start`, and how the scan ended."""
    view = memoryview(data)
    n = len(view)
    off = start
    out: list[Record] = []
    fsize = FRAME.size
    # The loop runs once per record of every segment at recovery: local names, no method lookups.
    unpack, crc32, kinds, append, new = FRAME.unpack_from, _crc, KINDS, out.append, tuple.__new__
    while off < n:
        if off + fsize > n:
            return out, ScanEnd(off, True, False, f"{n - off} bytes of an incomplete record header")
        length, crc = unpack(view, off)
        body_at = off + fsize
        end = body_at + length
        if length == 0 or length > MAX_RECORD:
            return out, _bad(off, n, end, f"record at byte {off} has an impossible length {length}")
        if end > n:
            return out, ScanEnd(off, True, False, f"record at byte {off} needs {length} bytes, {n - off - fsize} left")
        body = view[body_at:end]
        if crc32(body) != crc:
            return out, _bad(off, n, end, f"record at byte {off} fails its CRC")
        kind = body[0]
        if kind not in kinds:
            return out, _bad(off, n, end, f"record at byte {off} has an unknown kind {kind}")
        if kind == UNIT:  # rare (a pass with a commit): check the whole unit before keeping any of it
            unit_end = end + _UNIT.unpack_from(body, 1)[0]
            problem = _unit_problem(view, end, unit_end)
            if problem:
                return out, _bad(off, n, unit_end, f"transaction unit at byte {off}: {problem}")
        append(new(Record, (kind, view[body_at + 1:end], off)))
        off = end
    return out, ScanEnd(off, False, False)


def _unit_problem(view: memoryview, off: int, end: int) -> str:
    """Why the records from `off` to `end` are not a whole unit ("" if they are)."""
    n = len(view)
    if end > n:
        return f"needs {end - off} bytes, {n - off} left"
    while off < end:
        if off + FRAME.size > end:
            return f"incomplete record header at byte {off}"
        length, crc = FRAME.unpack_from(view, off)
        stop = off + FRAME.size + length
        if length == 0 or stop > end:
            return f"record at byte {off} goes past the unit's end"
        if _crc(view[off + FRAME.size:stop]) != crc:
            return f"record at byte {off} fails its CRC"
        off = stop
    return ""


def _bad(off: int, n: int, end: int, reason: str) -> ScanEnd:
    # A damaged record at the very end is what a crash in the middle of a write leaves: a torn tail. Anything after
    # it means the damage is not at the end.
    torn = end >= n
    return ScanEnd(off, torn, not torn, reason)


def read_enqueue(buf: bytes | memoryview, off: int, what: str) -> tuple[int, int, int, int, int, float | None, bytes]:
    """The ENQUEUE record framed at `off` of `buf` (read back for a paged message); JournalError if it is not one
    or fails its CRC (`what` says where, for the message)."""
    view = memoryview(buf)
    if off + FRAME.size > len(view):
        raise JournalError(f"{what}: record beyond the end of what was read")
    length, crc = FRAME.unpack_from(view, off)
    end = off + FRAME.size + length
    body = view[off + FRAME.size:end]
    if end > len(view) or _crc(body) != crc or body[0] != ENQUEUE:
        raise JournalError(f"{what}: not an intact enqueue record")
    q, pos, level, flags, count, expires = _ENQ.unpack_from(body, 1)
    return q, pos, level, flags, count, expires or None, bytes(body[1 + _ENQ.size:])
