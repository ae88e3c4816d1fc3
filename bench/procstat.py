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
    rest = text[close + 2 :].split()
    # rest[0] is field 3 (state); utime is field 14, stime field 15 (1-based) -> rest[11], rest[12]
    return StatLine(pid=int(text[:open_]), comm=text[open_ + 1 : close], ppid=int(rest[1]),
                    ticks=int(rest[11]) + int(rest[12]))


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
