"""RSS per queued message: broker memory before and after filling a fresh queue with N messages.

Run right after the target starts (before the load phases, so the fill cannot reuse heap that earlier phases
freed): create a fresh queue, wait a moment, read the resident set (VmRSS from /proc, summed over each role's
process tree), fill the queue with N confirmed messages (one pipelined publisher, 1000 in flight), wait a moment,
read again. Per role: (RSS after - RSS before) / N bytes per message; overhead = that minus the body size (the
payload: the message's encoded sections, header and framing count as overhead). A replicated set keeps a copy on
every broker, so its figure is the largest role's (each broker's own cost), all roles are in the JSON. The queue is
deleted afterwards where the target can (not on proton-c-broker, which has no management).
"""

from __future__ import annotations

import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench import cclient, procstat, stats
from bench.client import PublishLoop, encode_message
from bench.targets import Target

SETTLE_SECONDS = 1.0
DELETE_TIMEOUT = 300.0


@dataclass
class RssResult:
    target: str
    messages: int
    size: int  # body bytes (the payload)
    rss_before: dict[str, int]  # bytes, per role
    rss_after: dict[str, int]
    bytes_per_msg: dict[str, float]  # per role
    overhead_bytes_per_msg: float  # the largest role's bytes per message minus the body size
    fill_seconds: float
    fill_rate: float
    phase: str = "rss"
    errors: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def vm_rss(pid: int) -> int:
    """Resident set of one process in bytes (0 if it is gone)."""
    try:
        text = (procstat.PROC / str(pid) / "status").read_text()
    except OSError:
        return 0
    return parse_vmrss(text)


def parse_vmrss(status_text: str) -> int:
    """VmRSS from a /proc/<pid>/status text, in bytes (pure)."""
    for line in status_text.splitlines():
        if line.startswith("VmRSS:"):
            parts = line.split()
            return int(parts[1]) * 1024 if len(parts) >= 2 and parts[1].isdigit() else 0
    return 0


def rss_by_role(target: Target) -> dict[str, int]:
    return {role: sum(vm_rss(p) for p in pids) for role, pids in target.pid_groups().items()}


def per_message(before: dict[str, int], after: dict[str, int], n: int, size: int) -> tuple[dict[str, float], float]:
    """(bytes per message per role, overhead per message of the largest role) (pure)."""
    per = {role: (after.get(role, 0) - before.get(role, 0)) / n if n > 0 else float("nan") for role in after}
    top = max(per.values(), default=float("nan"))
    return per, top - size


def run_rss(target: Target, n: int, size: int, durable: bool, loadgen: str | Path | None,
            give_up: float = 3600.0) -> RssResult:
    queue = f"bench-rss-{uuid.uuid4().hex[:8]}"
    target.create_queue(queue)
    errors: list[str] = []
    try:
        time.sleep(SETTLE_SECONDS)
        before = rss_by_role(target)
        if loadgen is not None:
            accepted, seconds, _ = cclient.fill(loadgen, target.client(), target.address(queue), n, size, durable,
                                                timeout=give_up)
        else:
            r = PublishLoop(target.client(), target.address(queue), encode_message(size, durable), n, None, 1000,
                            lambda: None, give_up).run()
            if r.error or r.accepted != n:
                raise RuntimeError(f"fill {queue}: {r.accepted}/{n} accepted ({r.error})")
            accepted, seconds = r.accepted, r.end - r.start
        time.sleep(SETTLE_SECONDS)
        after = rss_by_role(target)
    finally:
        try:
            target.delete_queue(queue, timeout=DELETE_TIMEOUT)
        except Exception as e:
            errors.append(f"deleting {queue}: {type(e).__name__}: {e}")
    per, overhead = per_message(before, after, accepted, size)
    return RssResult(target=target.name, messages=accepted, size=size, rss_before=before, rss_after=after,
                     bytes_per_msg=per, overhead_bytes_per_msg=overhead, fill_seconds=seconds,
                     fill_rate=stats.rate(accepted, seconds), errors=errors)
