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
    MARK      magic[8] at:u64 durable:u64                                         ends every commit (format 3): its
                                                                                  own offset, and how many bytes of
                                                                                  the segment were on disk when it
                                                                                  was written

A UNIT record opens a pass's write that holds a committed transaction (the rest of that write: the commit's
enqueues and dequeues, and whatever else the pass journaled). Recovery keeps all of it or, when a crash cut the write
short or damaged a record in it, none of it, so a transaction the client never saw settle is never half on disk. (In
format 3 every write is whole or cut whole anyway, `last_end`; the UNIT's own check also covers format 2.)

A queue is named by a number (`queue:u32`) given in its QUEUE record, so message records stay small. `next` in a
QUEUE record is the queue's next position when it was written (positions are never reused, even after every message
was consumed and the segments holding them were dropped).

`scan` reads records from a buffer and tells a clean end from a torn tail (a write that a crash cut short) and from
damage. In format 2 a segment only grew, so a torn tail was a bad record reaching the end of the file. From format
3 a segment may be written into a file zero-filled in advance (broker.store.journal.Preparer): the clean end is
where zeros start, and a crash in the middle of a commit can leave any of its pages written and others still zero
(the page cache writes back in any order), so good data may follow a torn commit. What tells them apart is the MARK
record ending each commit: a bad record is damage only if an intact MARK after it says that the bytes where it lies
were already on disk (fdatasynced) when that later commit was written; otherwise it lies in what the last sync had
not covered, which a crash may tear, and it is cut with everything after it. In the last segment the cut starts
where the torn write begins, after the last intact MARK (`last_end`): a write stands or falls whole.
"""

from __future__ import annotations

import json
import struct
import zlib
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

from broker.errors import BrokerError

MAGIC = b"UJNL"
FORMAT = 3  # 2: UNIT records; 3: MARK records, zero-filled segments (an older release refuses a newer journal)
HEADER = struct.Struct(">4sHI")
FRAME = struct.Struct(">II")  # length (of kind + payload), crc32

ENQUEUE, DEQUEUE, QUEUE, UNQUEUE, EXCHANGE, UNEXCHANGE, BIND, UNBIND, STATE, DEDUP, UNIT, MARK = range(1, 13)
KINDS = {ENQUEUE: "enqueue", DEQUEUE: "dequeue", QUEUE: "queue", UNQUEUE: "unqueue", EXCHANGE: "exchange",
         UNEXCHANGE: "unexchange", BIND: "bind", UNBIND: "unbind", STATE: "state", DEDUP: "dedup", UNIT: "unit",
         MARK: "mark"}

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
MARK_MAGIC = b"\x8eUJmark\x1d"  # found by search after a bad record (a message body would also need the CRC)
_MARK = struct.Struct(">8sQQ")
# A message's journal location is one int, `segment << 32 | offset` (`Entry.seg`, the paged index): no segment may
# grow past LOC_OFFSET bytes (Journal.commit refuses a commit that would take it there).
LOC_OFFSET = (1 << 32) - 1
MARK_SIZE = FRAME.size + 1 + _MARK.size
_ZEROS_STEP = 1 << 20
_ZEROS = bytes(_ZEROS_STEP)
_crc = zlib.crc32
# The longest record a reader accepts: a message of the largest --max-message-size (1 GiB) with its ENQUEUE header
# (a record longer than this on disk is damage). A DEDUP record holding a whole large window is split below it.
MAX_RECORD = (1 << 30) + (1 << 16)
DEDUP_CHUNK = 1 << 20  # bytes of ids in one DEDUP record: a larger window is written as several


class JournalError(BrokerError):
    """The journal cannot be used as it is (damaged in the middle, a newer format, unreadable)."""


def header(segment: int) -> bytes:
    return HEADER.pack(MAGIC, FORMAT, segment)


def check_header(data: bytes, name: str) -> int:
    """The format of a segment file's header (what `scan` reads it by); JournalError if it is not one we can
    read."""
    if len(data) < HEADER.size:
        raise JournalError(f"{name}: too short for a journal segment header")
    magic, fmt, _ = HEADER.unpack_from(data)
    if magic != MAGIC:
        raise JournalError(f"{name}: not a journal segment (magic {magic!r})")
    if fmt > FORMAT:
        raise JournalError(f"{name}: journal format {fmt} is newer than this broker's ({FORMAT}); "
                           "use the release that wrote it, or move the data directory away")
    return int(fmt)


# What a commit that could not be written hands to the next one: what already happened to messages and wiring
# (consumptions, queue, exchange and binding changes, the HA standing). Not ENQUEUE (those messages were refused to
# their publishers), DEDUP (their ids: a resend must be taken), UNIT (a transaction fails whole) or MARK.
CARRIED = frozenset({DEQUEUE, QUEUE, UNQUEUE, EXCHANGE, UNEXCHANGE, BIND, UNBIND, STATE})


def carried(records: list[bytes]) -> list[bytes]:
    """The records of a failed commit to write with the next one (pure)."""
    return [r for r in records if len(r) > FRAME.size and r[FRAME.size] in CARRIED]


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
    """Ids (oldest first) added to a queue's duplicate window, or (`reset`) the whole window (broker.dedup): one
    DEDUP record per DEDUP_CHUNK bytes of ids (only the first resets), so no window makes a record too long to read
    back (up to 65,535 bytes an id, any number of ids)."""
    out: list[bytes] = []
    parts = [_DEDUP.pack(qid, 1 if reset else 0)]
    size = 0
    for k, t in items:
        if size >= DEDUP_CHUNK:
            out.append(frame(DEDUP, b"".join(parts)))
            parts, size = [_DEDUP.pack(qid, 0)], 0
        parts.append(_ID.pack(t, len(k)))
        parts.append(k)
        size += _ID.size + len(k)
    out.append(frame(DEDUP, b"".join(parts)))
    return out[0] if len(out) == 1 else b"".join(out)


def dedup_items(payload: bytes | memoryview) -> list[tuple[bytes, float]]:
    """The ids of a DEDUP record's payload, oldest first (ValueError if it does not add up: the CRC passed, so a
    bug)."""
    off, n = _DEDUP.size, len(payload)
    items: list[tuple[bytes, float]] = []
    while off < n:
        t, k = _ID.unpack_from(payload, off)
        off += _ID.size
        if off + k > n:
            raise ValueError("dedup record truncated")
        items.append((bytes(payload[off : off + k]), t))
        off += k
    return items


def mark(at: int, durable: int) -> bytes:
    """The MARK record ending a commit: its own offset `at` in the segment, and `durable`: the segment's bytes known
    to be on disk when the commit was written (0 if none of this segment was yet)."""
    return frame(MARK, _MARK.pack(MARK_MAGIC, at, durable))


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

    def dedup_head(self) -> tuple[int, bool]:
        """A DEDUP record's queue and reset flag, its ids left unread (`dedup_items`)."""
        qid, reset = _DEDUP.unpack_from(self.payload)
        return qid, bool(reset)

    def qid(self) -> int:
        return int(_QID.unpack_from(self.payload)[0])

    def document(self) -> dict[str, Any]:
        doc = json.loads(bytes(self.payload))
        if not isinstance(doc, dict):
            raise ValueError("not a JSON object")
        return doc


@dataclass(frozen=True)
class ScanEnd:
    """How a scan ended: `good` = bytes of whole records from the start; `torn` = what follows is what a crash in
    the middle of a write leaves (cut at `good`); `damaged` = a bad record that is not that (real damage); `tail` =
    bytes from `good` to the end of the data that is not zero (what a cut removes)."""

    good: int
    torn: bool
    damaged: bool
    reason: str = ""
    tail: int = 0
    committed: int = -1  # where the last intact MARK read ends (the last whole commit); -1: none read


def header_unwritten(data: bytes | memoryview) -> str:
    """Why the last segment's header may be missing without damage ("" if it is there): shorter than a header (a
    crash between creating the file and writing it), or all zero (a segment zero-filled in advance whose header a
    crash caught before its first fdatasync, which covers the header: nothing in such a segment was confirmed)."""
    if len(data) < HEADER.size:
        return "segment header incomplete"
    if not any(bytes(data[: HEADER.size])):
        return "segment header never written (a zero-filled segment, no sync of it made)"
    return ""


class Replay(Protocol):
    """What `scan` hands each record to, in order, as it reads them (recovery: broker.store.store.Image)."""

    def enqueue(self, view: memoryview, at: int, end: int, offset: int) -> None:
        """An ENQUEUE record whose payload is `view[at:end]`, its frame at `offset` (no Record made: one per
        message)."""

    def record(self, rec: Record) -> None:
        """Any other record."""


def scan(data: bytes | memoryview, start: int = 0, fmt: int = FORMAT,
         into: Replay | None = None) -> tuple[list[Record], ScanEnd]:
    """The records in `data` from `start`, and how the scan ended (`fmt`: the segment's format). With `into`, each
    record is handed to it as it is read instead (none is returned): those before a bad one are handed over."""
    view = memoryview(data)
    n = len(view)
    off = start
    out: list[Record] = []
    fsize = FRAME.size
    # The loop runs once per record of every segment at recovery: local names, no method lookups.
    unpack, crc32, kinds, new = FRAME.unpack_from, _crc, KINDS, tuple.__new__
    enqueue, add = (into.enqueue, into.record) if into is not None else (None, out.append)
    committed = -1
    while off < n:
        if off + fsize > n:
            return out, _bad(view, off, n, f"{n - off} bytes of an incomplete record header", fmt, committed)
        length, crc = unpack(view, off)
        body_at = off + fsize
        end = body_at + length
        if length == 0 or length > MAX_RECORD:
            return out, _bad(view, off, end, f"record at byte {off} has an impossible length {length}", fmt,
                             committed)
        if end > n:
            return out, _bad(view, off, end, f"record at byte {off} needs {length} bytes, {n - off - fsize} left",
                             fmt, committed)
        body = view[body_at:end]
        if crc32(body) != crc:
            return out, _bad(view, off, end, f"record at byte {off} fails its CRC", fmt, committed)
        kind = body[0]
        if kind == ENQUEUE and enqueue is not None:
            enqueue(view, body_at + 1, end, off)
            off = end
            continue
        if kind not in kinds:
            return out, _bad(view, off, end, f"record at byte {off} has an unknown kind {kind}", fmt, committed)
        if kind == UNIT:  # rare (a pass with a commit): check the whole unit before keeping any of it
            unit_end = end + _UNIT.unpack_from(body, 1)[0]
            problem = _unit_problem(view, end, unit_end)
            if problem:
                return out, _bad(view, off, unit_end, f"transaction unit at byte {off}: {problem}", fmt, committed)
        elif kind == MARK:
            committed = end
        add(new(Record, (kind, view[body_at + 1:end], off)))
        off = end
    return out, ScanEnd(off, False, False, committed=committed)


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


def _bad(view: memoryview, off: int, end: int, reason: str, fmt: int, committed: int) -> ScanEnd:
    """A scan met a bad or incomplete record at `off` (which would end at `end`)."""
    n = len(view)
    if fmt < 3:
        # A segment that only grows: a damaged record at the very end is what a crash in the middle of a write
        # leaves, a torn tail. Anything after it means the damage is not at the end.
        torn = end >= n
        return ScanEnd(off, torn, not torn, reason, n - off, committed)
    stop = nonzero_end(view, off)
    if stop == off:  # zeros from here on: the rest of a segment zero-filled in advance, not yet written
        return ScanEnd(off, False, False, "", 0, committed)
    if _on_disk_before(view, off, stop):
        return ScanEnd(off, False, True, f"{reason} (a later commit says it was already on disk)", stop - off,
                       committed)
    return ScanEnd(off, True, False, reason, stop - off, committed)


def last_end(end: ScanEnd, start: int, fmt: int) -> ScanEnd:
    """How the *last* segment ends, as recovery cuts it (`end`: its scan from `start`). From format 3 every write is
    one commit ending in its MARK, and nothing of a write counts until its MARK is there: the records after the last
    intact MARK are what a crash cut short (the write's last pages never reached the disk, or its bad record ends
    the scan), never confirmed to anyone, and they are cut with the rest. So a commit stands or falls whole: a
    message is never kept without the DEDUP record of its id (a resend would be taken twice), nor a write's
    dequeues without its enqueues. Earlier segments keep records after their last MARK (an older release's
    recovery may have kept such a write before the journal moved on); a segment of format 2 has no MARKs."""
    if fmt < 3 or end.damaged:
        return end
    committed = max(end.committed, start)
    if committed >= end.good:
        return end
    stop = end.good + end.tail
    what = f"the write from byte {committed} has no mark after it (a crash cut it short)"
    reason = f"{end.reason}; cut from byte {committed}, where its write begins" if end.torn else what
    return ScanEnd(committed, True, False, reason, stop - committed, committed)


def nonzero_end(view: memoryview, off: int) -> int:
    """The end of the last byte after `off` that is not zero (`off` if there is none). Every recovery of a segment
    zero-filled in advance reads its unwritten rest: a step's bytes are compared with zeros (a copy and a memcmp)
    and only the step that ends the data is stripped byte by byte (64 MiB of zeros: ~12 ms, 280 ms stripping it
    all)."""
    end = len(view)
    while end > off:
        lo = max(off, end - _ZEROS_STEP)
        chunk = bytes(view[lo:end])
        if chunk != _ZEROS[: end - lo]:
            return lo + len(chunk.rstrip(b"\0"))
        end = lo
    return off


def _on_disk_before(view: memoryview, off: int, stop: int) -> bool:
    """Is there an intact MARK between `off` and `stop` written when the bytes at `off` were already on disk?"""
    data = bytes(view[off:stop])  # only after a crash or damage: a copy is fine
    body_size = MARK_SIZE - FRAME.size
    i = data.find(MARK_MAGIC)
    while i >= 0:
        at = off + i - FRAME.size - 1
        if at >= off and at + MARK_SIZE <= stop:
            length, crc = FRAME.unpack_from(view, at)
            body = view[at + FRAME.size : at + MARK_SIZE]
            if length == body_size and body[0] == MARK and _crc(body) == crc:
                _, where, durable = _MARK.unpack_from(body, 1)
                if where == at and durable > off:
                    return True
        i = data.find(MARK_MAGIC, i + 1)
    return False


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
