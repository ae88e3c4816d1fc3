"""CPU accounting from /proc: per-process utime+stime, process trees, whole-machine busy time.

Parsing is pure (functions of the file text) so it is unit-tested without a live process.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

CLK_TCK = os.sysconf("SC_CLK_TCK")
PROC = Path("/proc")


@dataclass(frozen=True)
class StatLine:
    pid: int
    comm: str
    ppid: int
    ticks: int  # utime + stime, in clock ticks


def parse_stat(text: str) -> StatLine:
    """One /proc/<pid>/stat line. `comm` may contain spaces and parentheses: split at the last ')'."""
    open_, close = text.index("("), text.rindex(")")
    user, system = parse_times(text)
    return StatLine(pid=int(text[:open_]), comm=text[open_ + 1 : close], ppid=int(text[close + 2 :].split()[1]),
                    ticks=user + system)


def parse_times(text: str) -> tuple[int, int]:
    """(utime, stime) clock ticks from a /proc/<pid>/stat or /proc/<pid>/task/<tid>/stat line."""
    rest = text[text.rindex(")") + 2 :].split()
    # rest[0] is field 3 (state); utime is field 14, stime field 15 (1-based) -> rest[11], rest[12]
    return int(rest[11]), int(rest[12])


#: the parts of a broker `thread_parts` tells apart
LOOP, THREADS, SYNC_PROCESS, CHILDREN = "loop", "other threads", "sync process", "other processes"


def part_of(pid: int, tid: int, root: int, cmdline: str) -> str:
    """Which part of a broker (process `root` and its children) thread `tid` of process `pid` is: its event loop
    (the main thread), its other threads (the journal's preparer ...), the journal's sync process, anything else."""
    if pid == root:
        return LOOP if tid == pid else THREADS
    return SYNC_PROCESS if "syncproc" in cmdline else CHILDREN


def thread_parts(root: int, pids: list[int]) -> dict[str, tuple[float, float]]:
    """{part: (user, system) CPU seconds} of a broker's threads and processes (`pids`: `root` and its children);
    live threads only (a thread that ended takes its time with it)."""
    out: dict[str, tuple[float, float]] = {}
    for pid in pids:
        try:
            cmdline = (PROC / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            tids = [int(t.name) for t in (PROC / str(pid) / "task").iterdir()]
        except OSError:
            continue
        for tid in tids:
            try:
                user, system = parse_times((PROC / str(pid) / "task" / str(tid) / "stat").read_text())
            except (OSError, ValueError):
                continue
            part = part_of(pid, tid, root, cmdline)
            u, s = out.get(part, (0.0, 0.0))
            out[part] = (u + user / CLK_TCK, s + system / CLK_TCK)
    return out


def parts_delta(before: dict[str, tuple[float, float]], after: dict[str, tuple[float, float]]
                ) -> dict[str, list[float]]:
    """{part: [user, system] seconds} spent between two `thread_parts` readings (a part that appeared meanwhile
    counts whole; a negative figure, a thread that ended, counts 0)."""
    out = {}
    for part, (u1, s1) in after.items():
        u0, s0 = before.get(part, (0.0, 0.0))
        out[part] = [round(max(u1 - u0, 0.0), 3), round(max(s1 - s0, 0.0), 3)]
    return out


def machine_ticks(text: str) -> tuple[int, int]:
    """(busy, total) clock ticks from the aggregate `cpu` line of /proc/stat."""
    for line in text.splitlines():
        if line.startswith("cpu "):
            vals = [int(v) for v in line.split()[1:]]
            idle = vals[3] + (vals[4] if len(vals) > 4 else 0)  # idle + iowait
            total = sum(vals[:8])  # guest time is already in user/nice
            return total - idle, total
    raise ValueError("no aggregate cpu line in /proc/stat")


def read_stat(pid: int) -> StatLine | None:
    try:
        return parse_stat((PROC / str(pid) / "stat").read_text())
    except (FileNotFoundError, ProcessLookupError, ValueError):
        return None


def all_stats() -> list[StatLine]:
    out = []
    for d in PROC.iterdir():
        if d.name.isdigit():
            s = read_stat(int(d.name))
            if s is not None:
                out.append(s)
    return out


def descendants(root: int, stats: list[StatLine] | None = None) -> list[int]:
    """`root` and every process below it (pure given `stats`)."""
    stats = all_stats() if stats is None else stats
    children: dict[int, list[int]] = {}
    for s in stats:
        children.setdefault(s.ppid, []).append(s.pid)
    out, todo = [], [root]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def cpu_seconds(pids: list[int]) -> float:
    """utime+stime of the given processes (all their threads, dead ones included), in seconds."""
    ticks = 0
    for p in pids:
        s = read_stat(p)
        if s is not None:
            ticks += s.ticks
    return ticks / CLK_TCK


def machine_busy() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine since boot, summed over cores."""
    busy, total = machine_ticks((PROC / "stat").read_text())
    return busy / CLK_TCK, total / CLK_TCK


def environ(pid: int) -> dict[str, str]:
    try:
        raw = (PROC / str(pid) / "environ").read_bytes()
    except OSError:
        return {}
    out = {}
    for item in raw.split(b"\0"):
        k, sep, v = item.partition(b"=")
        if sep:
            out[k.decode(errors="replace")] = v.decode(errors="replace")
    return out



def renice(pids: list[int], nice: int) -> int:
    """Set the nice value of every thread of the given processes (nice is per thread on Linux); returns count."""
    n = 0
    for p in pids:
        try:
            tids = [int(t.name) for t in (PROC / str(p) / "task").iterdir()]
        except OSError:
            continue
        for tid in tids:
            try:
                os.setpriority(os.PRIO_PROCESS, tid, nice)
                n += 1
            except OSError:
                pass
    return n
