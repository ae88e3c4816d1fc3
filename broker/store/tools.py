"""What the operator tools (`ha-admin journal check|stats|cut`) know about a journal on disk, with the broker stopped.

The rules are the broker's own (`broker.store.store.read_journal`): segments are replayed in order; an incomplete or
damaged last record of the *last* segment is a torn tail (a write that a crash cut short: the broker cuts it at
start); a bad record anywhere else, a bad segment header, or a torn end of an earlier segment is damage (the broker
refuses to start); a newer format is refused.

Pure parts (bytes and reports in, reports out): `examine` (one segment), `verdict`, `plan_cut`, `summarise`. File
parts: `inspect` (every segment of a directory, and the image the broker recovers: `read_journal` itself when it
starts at all, else the good records before the damage, which is what it recovers after a cut), `apply_cut` and
`holders` (who has the journal open). A cut destroys nothing: the damaged segment is copied whole and every later
segment is moved into `<journal>/cut-<UTC time>/`, then the damaged segment is truncated at its last good record.

Usage::

    ins = inspect(Path("/var/lib/understudy/journal"))
    ins.verdict                       # Verdict.CLEAN / TORN / DAMAGED / NEWER / UNREADABLE
    EXIT_CODE[ins.verdict]            # what `ha-admin journal check` exits with
    plan = plan_cut(ins.segments, ins.problem)  # None unless DAMAGED
    apply_cut(ins.directory, plan, time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()))
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from broker.store import records as R
from broker.store.journal import segment_name, segment_numbers
from broker.store.store import Image, read_journal

PID_FILE = "broker.pid"  # where the OCF agent and understudy-cluster have the broker write its pid (--pid-file)
CUT_PREFIX = "cut-"


class Verdict(StrEnum):
    CLEAN = "clean"  # the broker recovers everything
    TORN = "torn"  # the last segment ends in a torn record: the broker cuts it at start
    DAMAGED = "damaged"  # the broker refuses to start: `cut` cuts at the last good record
    NEWER = "newer-format"  # written by a newer release: the broker refuses, `cut` does not touch it
    UNREADABLE = "unreadable"  # a segment file cannot be read (permissions, I/O error)


# `ha-admin journal check` exits with the verdict's code (docs/durability.md); 1 and 2 are ha-admin's own (a
# refusal, a usage error). The broker starts with a journal of code 0 or 3.
EXIT_CODE = {Verdict.CLEAN: 0, Verdict.TORN: 3, Verdict.DAMAGED: 4, Verdict.NEWER: 5, Verdict.UNREADABLE: 6}
STARTS = (Verdict.CLEAN, Verdict.TORN)
INDEX_ONLY = 1  # an Image budget of 1 byte: messages are indexed (12-20 bytes each), their bodies are not kept


@dataclass(frozen=True)
class SegmentReport:
    """One segment file: what its whole records hold, and where (if anywhere) it goes wrong."""

    number: int
    file: str
    size: int
    good: int  # bytes from the start up to the end of its last good record (the header included)
    kinds: dict[str, int] = field(default_factory=dict)  # whole records by kind ("enqueue": 120, ...)
    message_bytes: int = 0  # bytes of the messages of its enqueue records
    status: Verdict = Verdict.CLEAN  # CLEAN, TORN (only the last segment), DAMAGED, NEWER, UNREADABLE
    reason: str = ""
    beyond: dict[str, int] = field(default_factory=dict)  # DAMAGED: whole records readable after the bad one
    tail: int | None = None  # bytes after `good` up to the last one that is not zero (None: to the end of the file)

    @property
    def records(self) -> int:
        return sum(self.kinds.values())

    @property
    def bad_bytes(self) -> int:
        """Bytes after the last good record (not counting zeros after the last that is not: a segment zero-filled
        in advance holds those anyway)."""
        return self.size - self.good if self.tail is None else self.tail


@dataclass(frozen=True)
class Problem:
    """Where the replay stops: the first segment that is not clean (a torn last segment included)."""

    kind: Verdict
    segment: int  # 0: not located (the broker's reader refused what the tools' scan accepted)
    file: str
    offset: int  # byte of the segment where its good records end
    bytes: int  # bytes of that segment from there to its end
    reason: str


@dataclass(frozen=True)
class CutPlan:
    """What `cut` does: truncate `file` at byte `at` (0: move it aside whole) and move every later segment aside."""

    file: str
    at: int
    cut_bytes: int  # bytes of `file` after `at`: lost (kept in the cut directory)
    moved: tuple[str, ...]  # later segments, moved aside whole
    moved_bytes: int
    lost_kinds: dict[str, int]  # whole records cut, by kind, as far as they can be read (the bad one not counted)
    reason: str

    @property
    def lost_bytes(self) -> int:
        return self.cut_bytes + self.moved_bytes


@dataclass
class Inspection:
    directory: Path
    segments: list[SegmentReport]
    verdict: Verdict
    problem: Problem | None
    image: Image  # what the broker recovers; when DAMAGED, what it recovers after the cut


# ----- pure ------------------------------------------------------------------------------------------------------
def examine(number: int, data: bytes | memoryview, last: bool) -> SegmentReport:
    """One segment's bytes, judged as `read_journal` judges them (`last`: it is the newest segment)."""
    name = segment_name(number)
    size = len(data)
    unwritten = R.header_unwritten(data)
    if unwritten and last:  # a crash between creating the file (or taking a prepared one) and syncing its header
        tail = R.nonzero_end(memoryview(data), 0)
        return SegmentReport(number, name, size, 0, status=Verdict.TORN if tail else Verdict.CLEAN,
                             reason=unwritten, tail=tail)
    if size < R.HEADER.size:
        return SegmentReport(number, name, size, 0, status=Verdict.DAMAGED,
                             reason="too short for a journal segment header")
    magic, fmt, _ = R.HEADER.unpack_from(data)
    try:
        R.check_header(bytes(data[: R.HEADER.size]), name)
    except R.JournalError as e:
        status = Verdict.NEWER if magic == R.MAGIC and fmt > R.FORMAT else Verdict.DAMAGED
        return SegmentReport(number, name, size, 0, status=status, reason=e.description.split(": ", 1)[-1])
    recs, end = R.scan(data, R.HEADER.size, fmt)
    if last:  # a write without its MARK is cut whole (R.last_end): its records are not counted
        end = R.last_end(end, R.HEADER.size, fmt)
    damaged = end.damaged or (end.torn and not last)
    good, tail = end.good, end.tail
    if damaged and fmt >= 3:
        # A cut at the bad record would leave the whole records before it in its write without their MARK, which
        # the broker then cuts at its next start: the cut starts where that write begins.
        good = max(end.committed, R.HEADER.size)
        tail += end.good - good
    kept = [rec for rec in recs if rec.offset < good]
    kinds: dict[str, int] = {}
    message_bytes = 0
    for rec in kept:
        k = R.KINDS[rec.kind]
        kinds[k] = kinds.get(k, 0) + 1
        if rec.kind == R.ENQUEUE:
            message_bytes += len(rec.enqueue()[6])
    beyond: dict[str, int] = {}
    if damaged:
        status = Verdict.DAMAGED
        reason = end.reason + ("" if end.damaged else " (at the end of a segment that is not the last)")
        if good < end.good:
            reason += f"; cut from byte {good}, where the write holding it begins"
        beyond = _beyond(data, end.good)
        for rec in recs[len(kept):]:  # the whole records of its write before it
            k = R.KINDS[rec.kind]
            beyond[k] = beyond.get(k, 0) + 1
    else:
        status, reason = (Verdict.TORN, end.reason) if end.torn else (Verdict.CLEAN, "")
    return SegmentReport(number, name, size, good, kinds, message_bytes, status, reason, beyond, tail)


def _beyond(data: bytes | memoryview, bad: int) -> dict[str, int]:
    """The whole records after a damaged one, when its length still says where the next one starts (damage to
    its body or CRC): what a cut loses besides it."""
    if bad + R.FRAME.size > len(data):
        return {}
    length = R.FRAME.unpack_from(data, bad)[0]
    nxt = bad + R.FRAME.size + length
    if length == 0 or nxt > len(data):
        return {}
    kinds: dict[str, int] = {}
    for rec in R.scan(data, nxt)[0]:
        k = R.KINDS[rec.kind]
        kinds[k] = kinds.get(k, 0) + 1
    return kinds


def unreadable(number: int, error: OSError) -> SegmentReport:
    return SegmentReport(number, segment_name(number), 0, 0, status=Verdict.UNREADABLE,
                         reason=error.strerror or str(error))


def verdict(segments: list[SegmentReport]) -> tuple[Verdict, Problem | None]:
    """The journal's verdict: the first segment that is not clean decides (the broker stops there too)."""
    for s in segments:
        if s.status is not Verdict.CLEAN:
            return s.status, Problem(s.status, s.number, s.file, s.good, s.bad_bytes, s.reason)
    return Verdict.CLEAN, None


def plan_cut(segments: list[SegmentReport], problem: Problem | None) -> CutPlan | None:
    """What to cut for damage (None for anything else: a clean journal, a torn tail the broker cuts itself, a
    newer format or an unreadable file, which a cut must not touch, or damage the tools could not locate)."""
    if problem is None or problem.kind is not Verdict.DAMAGED or problem.segment < 1:
        return None
    later = [s for s in segments if s.number > problem.segment]
    kinds: dict[str, int] = {}
    for counts in [s.beyond for s in segments if s.number == problem.segment] + [s.kinds for s in later]:
        for k, n in counts.items():
            kinds[k] = kinds.get(k, 0) + n
    return CutPlan(problem.file, problem.offset, problem.bytes, tuple(s.file for s in later),
                   sum(s.size for s in later), kinds, problem.reason)


def summarise(image: Image) -> dict[str, Any]:
    """The image as the tools print it: queues (by name) with their messages, exchanges, bindings, the HA standing.
    Messages may be held whole (`Image.messages`) or only indexed (`Image.paged`, under a budget): both count."""
    queues = []
    live: dict[int, list[int]] = {}  # segment -> [messages, bytes] still on a queue
    for qid, doc in image.queues.items():
        sizes: dict[int, int] = {}  # position -> bytes of the message
        for pos, m in image.messages.get(qid, {}).items():
            sizes[pos] = len(m.data)
            _tally(live, m.seg, len(m.data))
        index = image.paged.get(qid)
        for pos, loc, size in index.items() if index is not None else ():
            sizes[pos] = size
            _tally(live, loc, size)
        first, last = (min(sizes), max(sizes)) if sizes else (None, None)
        queues.append({
            "name": doc.get("name"), "id": qid, "messages": len(sizes), "bytes": sum(sizes.values()),
            "first": first, "last": last, "next": max(int(doc.get("next", 1)), (last or 0) + 1,
                                                        image.dequeued_top.get(qid, 0) + 1),
            "arguments": doc.get("arguments") or {},
        })
    queues.sort(key=lambda q: str(q["name"]))
    return {
        "queues": queues,
        "exchanges": [{"name": n, "type": d.get("type", "direct"), "arguments": d.get("arguments") or {}}
                      for n, d in sorted(image.exchanges.items())],
        "bindings": [{"exchange": e, "queue": q, "key": k} for (e, q, k) in sorted(image.bindings)],
        "standing": dict(image.state) or None,
        "messages": sum(q["messages"] for q in queues),
        "bytes": sum(q["bytes"] for q in queues),
        "live": {seg: {"messages": n, "bytes": b} for seg, (n, b) in sorted(live.items())},
    }


def _tally(live: dict[int, list[int]], location: int, size: int) -> None:
    row = live.setdefault(_segment_of(location), [0, 0])
    row[0] += 1
    row[1] += size


def _segment_of(location: int) -> int:
    """The segment of an image message's location: a segment number, or (flow to disk) `segment << 32 | offset`."""
    return location >> 32 or location


def report(ins: Inspection, plan: CutPlan | None = None) -> dict[str, Any]:
    """The whole inspection as one JSON-able document (`ha-admin journal check --json`)."""
    summary = summarise(ins.image)
    live = summary.pop("live")
    segs = []
    for s in ins.segments:
        row = asdict(s)
        row["status"] = s.status.value
        row["records"] = s.records
        row["live_messages"] = live.get(s.number, {}).get("messages", 0)
        row["live_bytes"] = live.get(s.number, {}).get("bytes", 0)
        row["beyond_problem"] = ins.problem is not None and 0 < ins.problem.segment < s.number
        segs.append(row)
    doc: dict[str, Any] = {
        "journal": str(ins.directory), "verdict": ins.verdict.value,
        "problem": None if ins.problem is None else {**asdict(ins.problem), "kind": ins.problem.kind.value},
        "segments": segs, "disk_bytes": sum(s.size for s in ins.segments), **summary,
    }
    if plan is not None:
        doc["cut"] = {**asdict(plan), "lost_bytes": plan.lost_bytes}
    return doc


# ----- files -----------------------------------------------------------------------------------------------------
class _States:
    """A replay that keeps only the last STATE document (the HA standing) of a whole write (one its MARK ends)."""

    def __init__(self) -> None:
        self.state: dict[str, Any] | None = None
        self.unmarked: dict[str, Any] | None = None  # read since the last MARK

    def enqueue(self, view: memoryview, at: int, end: int, offset: int) -> None:
        pass

    def record(self, rec: R.Record) -> None:
        if rec.kind == R.STATE:
            self.unmarked = rec.document()
        elif rec.kind == R.MARK and self.unmarked is not None:
            self.state, self.unmarked = self.unmarked, None


def last_state(directory: Path) -> dict[str, Any] | None:
    """The HA standing the journal in `directory` holds last (the newest STATE record; None: none), for a broker
    that is down: its segments from the newest back until one has it (each segment's checkpoint has one). A torn
    tail ends a segment's reading, as the broker cuts it. Raises OSError or R.JournalError for a journal it cannot
    read."""
    numbers = segment_numbers(directory)
    for n in reversed(numbers):
        data = (directory / segment_name(n)).read_bytes()
        if R.header_unwritten(data):
            continue
        states = _States()
        fmt = R.check_header(data, segment_name(n))
        R.scan(data, R.HEADER.size, fmt, into=states)
        if fmt < 3 or n != numbers[-1]:  # only the last segment's write without a MARK is cut (R.last_end)
            states.state = states.unmarked or states.state
        if states.state is not None:
            return states.state
    return None


def inspect(directory: Path) -> Inspection:
    """Examine every segment of `directory` and replay what the broker would: `read_journal` when the broker would
    start; otherwise the good records before the problem (what it recovers once the damage is cut). Read-only. The
    replay indexes messages rather than keeping them (a journal larger than memory can be checked)."""
    segments: list[SegmentReport] = []
    try:
        numbers = segment_numbers(directory)
    except OSError as e:  # the directory itself: as an unreadable file, nothing can be said of what it holds
        numbers = []
        segments.append(SegmentReport(0, str(directory), 0, 0, status=Verdict.UNREADABLE,
                                      reason=e.strerror or str(e)))
    for i, n in enumerate(numbers):
        try:
            data = (directory / segment_name(n)).read_bytes()
        except OSError as e:
            segments.append(unreadable(n, e))
            continue
        segments.append(examine(n, data, i == len(numbers) - 1))
        del data
    v, problem = verdict(segments)
    image: Image | None = None
    if v in STARTS:
        try:
            image = read_journal(directory, INDEX_ONLY)[0]
        except R.JournalError as e:  # the broker's own reader disagrees: it decides
            v = Verdict.DAMAGED
            problem = Problem(v, 0, "", 0, 0, e.description)
    if image is None:
        image = Image(INDEX_ONLY)
        for s in segments:
            if problem is not None and s.number > problem.segment:
                break
            if s.good <= R.HEADER.size:
                continue
            data = (directory / s.file).read_bytes()[: s.good]
            for rec in R.scan(data, R.HEADER.size)[0]:
                image.apply(rec, s.number)
    return Inspection(directory, segments, v, problem, image)


def apply_cut(directory: Path, plan: CutPlan, stamp: str) -> Path:
    """Carry out `plan` in the journal `directory`; returns the directory that holds what was cut. Crash-safe in
    this order: the damaged segment is copied whole (or, cut at 0, moved) and every later segment moved before the
    damaged one is truncated, so an interrupted cut leaves a journal that is still refused, never one with a gap."""
    target = directory / f"{CUT_PREFIX}{stamp}"
    n = 1
    while target.exists():
        n += 1
        target = directory / f"{CUT_PREFIX}{stamp}-{n}"
    target.mkdir()
    damaged = directory / plan.file
    if plan.at > 0:
        shutil.copy2(damaged, target / plan.file)
        _fsync(target / plan.file)
    else:
        os.rename(damaged, target / plan.file)
    for name in plan.moved:
        os.rename(directory / name, target / name)
    doc = {"cut": asdict(plan), "note": f"{plan.file} is kept whole here; it was truncated at byte {plan.at} in "
           "the journal (0: moved here). The later segments were moved here whole. Nothing was deleted."}
    (target / "cut.json").write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    _fsync(target / "cut.json")
    _fsync(target)
    _fsync(directory)
    if plan.at > 0:
        os.truncate(damaged, plan.at)
        _fsync(damaged)
    return target


def holders(data_dir: Path, journal: Path, proc: Path = Path("/proc")) -> tuple[list[str], list[str]]:
    """Who holds the journal: processes with one of its files open (as far as /proc shows this user), and the
    broker named by DATA_DIR/broker.pid if it runs. Returns (holders, notes): a note is a pid file naming a
    process that is gone or is not a broker (stale, e.g. after a reboot)."""
    found: dict[int, str] = {}
    notes: list[str] = []
    jdir = os.path.realpath(journal)
    for entry in _listdir(proc):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        for fd in _listdir(proc / entry / "fd"):
            try:
                target = os.readlink(proc / entry / "fd" / fd)
            except OSError:
                continue
            if target.startswith(jdir + os.sep):
                found.setdefault(int(entry), f"pid {entry} ({_command(proc, int(entry))}) has "
                                 f"{os.path.relpath(target, jdir)} open")
    pid_file = data_dir / PID_FILE
    try:
        text = pid_file.read_text().strip()
    except OSError:
        text = ""
    if text:
        if not text.isdigit():
            notes.append(f"{pid_file}: not a pid ({text[:20]!r}); ignored")
        elif int(text) not in found:
            pid = int(text)
            cmd = _command(proc, pid)
            if not (proc / str(pid)).exists():
                notes.append(f"{pid_file} names pid {pid}, which is not running (a stale pid file)")
            elif "ha-broker" in cmd or "ha.main" in cmd:
                found[pid] = f"pid {pid} ({cmd}) from {pid_file} is running"
            else:
                notes.append(f"{pid_file} names pid {pid}, which is not a broker ({cmd}): a stale pid file")
    return [found[p] for p in sorted(found)], notes


def _listdir(path: Path) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def _command(proc: Path, pid: int) -> str:
    try:
        raw = (proc / str(pid) / "cmdline").read_bytes()
    except OSError:
        return "?"
    return " ".join(part.decode(errors="replace") for part in raw.split(b"\0") if part)[:120] or "?"


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# ----- text (from the same document as --json) -------------------------------------------------------------------
def plural(n: int, word: str) -> str:
    return f"{n:,} {word}{'s' * (n != 1)}"


def describe_kinds(kinds: dict[str, int]) -> str:
    return ", ".join(f"{n:,} {k}" for k, n in sorted(kinds.items(), key=lambda kv: -kv[1])) or "no records"


def describe_lost(kinds: dict[str, int]) -> str:
    """What a cut loses besides the bad record: the whole records readable after it, by kind."""
    if not kinds:
        return "the damaged record (no whole record can be read after it)"
    return f"the damaged record and {describe_kinds(kinds)} records after it"


def _when(ts: Any) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ts)) if isinstance(ts, int | float) else "?"


def describe_standing(st: dict[str, Any] | None) -> str:
    if not st:
        return "none journaled (a standalone broker, or one that never took part in a cluster)"
    return (f"epoch {st.get('epoch')}, role {st.get('role')}, state {st.get('state')}, "
            f"ready_epoch {st.get('ready_epoch', 0)} (journaled {_when(st.get('time'))})")


def describe_problem(doc: dict[str, Any], data_dir: str) -> str:
    p = doc["problem"]
    v = doc["verdict"]
    if v == Verdict.CLEAN:
        if not doc["segments"]:
            return "verdict: clean: an empty journal (no segments): the broker starts with no durable state"
        return "verdict: clean: the broker recovers everything above"
    if v == Verdict.TORN:
        return (f"verdict: torn tail: {p['bytes']:,} bytes at {p['file']} byte {p['offset']:,} ({p['reason']}). "
                "The broker cuts them at start: a write that a crash cut short, never confirmed to a client")
    if v == Verdict.NEWER:
        return (f"verdict: newer format: {p['file']}: {p['reason']}. The broker refuses to start; "
                "`journal cut` does not touch it")
    if v == Verdict.UNREADABLE:
        return (f"verdict: unreadable: {p['file']}: {p['reason']}. Fix the file's permissions or the disk (copy "
                "what can be read elsewhere first), then check again")
    if not p["segment"]:
        return f"verdict: damaged: {p['reason']}"
    cut = doc.get("cut") or {}
    later = cut.get("moved") or []
    tail = f" and {plural(len(later), 'later segment')} ({cut.get('moved_bytes', 0):,} bytes)" if later else ""
    return (f"verdict: damaged: {p['file']} at byte {p['offset']:,}: {p['reason']}. The broker refuses to start. "
            f"`ha-admin journal cut --data-dir {data_dir}` cuts the journal there: the last {p['bytes']:,} bytes of "
            f"{p['file']}{tail} are set aside, and what they held is lost: "
            f"{describe_lost(cut.get('lost_kinds') or {})} (messages published after that point are "
            "lost; messages consumed after it come back)")


def check_lines(doc: dict[str, Any], data_dir: str) -> list[str]:
    """`ha-admin journal check` as text."""
    segs = doc["segments"]
    out = [f"journal {doc['journal']}: {plural(len(segs), 'segment')}, {doc['disk_bytes']:,} bytes"]
    if segs:
        out.append(f"  {'segment':<14}{'bytes':>14}{'records':>9}{'enqueue':>9}{'dequeue':>9}{'other':>7}"
                   f"{'msg bytes':>13}{'live':>8}  status")
        for s in segs:
            k = s["kinds"]
            other = s["records"] - k.get("enqueue", 0) - k.get("dequeue", 0)
            status = "ok" if s["status"] == Verdict.CLEAN else f"{s['status']} at byte {s['good']:,}: {s['reason']}"
            if s["beyond_problem"]:
                status = f"{status}; after the first problem: not replayed"
            out.append(f"  {s['file']:<14}{s['size']:>14,}{s['records']:>9,}{k.get('enqueue', 0):>9,}"
                       f"{k.get('dequeue', 0):>9,}{other:>7,}{s['message_bytes']:>13,}{s['live_messages']:>8,}  "
                       f"{status}")
    after = " after the cut" if doc["verdict"] == Verdict.DAMAGED else ""
    out.append(f"queues: {len(doc['queues'])} durable, {plural(doc['messages'], 'message')}, {doc['bytes']:,} bytes "
               f"(what the broker recovers{after})")
    for q in doc["queues"]:
        span = f"positions {q['first']}..{q['last']}" if q["messages"] else "empty"
        out.append(f"  {q['name']}: {plural(q['messages'], 'message')}, {q['bytes']:,} bytes, {span}, next {q['next']}")
    out.append(f"exchanges: {len(doc['exchanges'])} durable")
    out.extend(f"  {e['name']} ({e['type']})" for e in doc["exchanges"])
    out.append(f"bindings: {len(doc['bindings'])}")
    out.extend(f"  {b['exchange']} -> {b['queue']}" + (f" key {b['key']!r}" if b["key"] else "")
               for b in doc["bindings"])
    out.append(f"HA standing: {describe_standing(doc['standing'])}")
    out.append(describe_problem(doc, data_dir))
    return out
