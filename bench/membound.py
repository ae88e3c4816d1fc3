"""Memory-bound phase: a broker with `--max-memory` filled far past its bound with durable messages (flow to disk).

Timeline (on a started standalone durable target, `ours-durable`; run last, it restarts the broker): stop the broker,
wipe its data dir, start it again with `--max-memory BOUND`; create a durable queue, wait a moment and read the
broker's RSS (the *baseline*: interpreter, libraries, empty structures); fill the queue with N durable messages (C
client, 1000 in flight, every message confirmed) while sampling the broker's RSS (VmRSS of its process tree) every
`SAMPLE_SECONDS`; read the queue's depth at the end. The queue is left for the target's stop (deleting 10M messages
is not what is measured).

Verdict (`report.memory_verdicts`): peak RSS <= bound + baseline + allowance, where the allowance (`ALLOWANCE`,
stated in the output) covers what `--max-memory` does not count by design: the check runs every 5 ms, so a burst can
overshoot; allocator slack of the heap that held the messages before they were paged; journal write and read-back
buffers; the connection's buffers.
"""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench import cclient, stats
from bench.ours import OursStandalone
from bench.rss import rss_by_role
from bench.targets import Target

SAMPLE_SECONDS = 0.25
SETTLE_SECONDS = 1.0
ALLOWANCE = 64 * 1024 * 1024  # bytes over bound + baseline that still count as "bounded"
FILL_WINDOW = 1000


@dataclass
class MemoryResult:
    target: str
    messages: int  # accepted
    wanted: int
    size: int
    bound: int  # --max-memory, bytes
    allowance: int
    baseline_rss: int  # bytes, after start and queue creation, before the fill
    peak_rss: int
    final_rss: int
    rss_samples: list[tuple[float, int]]  # (seconds since the fill started, bytes), thinned for the JSON
    fill_seconds: float
    fill_rate: float
    other_outcomes: int  # refused (e.g. amqp:resource-limit-exceeded) or released
    depth_after: int
    phase: str = "memory"
    errors: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def thin(samples: list[tuple[float, int]], keep: int = 400) -> list[tuple[float, int]]:
    """At most about `keep` samples, evenly spread, always with the peak and the last one (pure)."""
    if len(samples) <= keep:
        return list(samples)
    step = len(samples) / keep
    picked = {int(i * step) for i in range(keep)}
    picked.add(len(samples) - 1)
    picked.add(max(range(len(samples)), key=lambda i: samples[i][1]))
    return [samples[i] for i in sorted(picked)]


class _Sampler(threading.Thread):
    def __init__(self, target: Target, t0: float) -> None:
        super().__init__(name="rss-sampler", daemon=True)
        self.target, self.t0 = target, t0
        self.samples: list[tuple[float, int]] = []
        self.stop_flag = threading.Event()

    def run(self) -> None:
        while not self.stop_flag.is_set():
            self.samples.append((time.monotonic() - self.t0, sum(rss_by_role(self.target).values())))
            self.stop_flag.wait(SAMPLE_SECONDS)


def run_memory(target: OursStandalone, n: int, size: int, bound: str, loadgen: str | Path,
               give_up: float = 7200.0) -> MemoryResult:
    if not target.durable or target.broker is None:
        raise RuntimeError(f"memory phase: {target.name} is not a started durable standalone target")
    from broker.config import parse_size  # the broker's own reading of --max-memory

    bound_bytes = parse_size(bound)
    offset = target.restart(wipe=True, extra=["--max-memory", bound])
    target.broker.wait_event("broker.started", after=offset)
    queue = f"bench-memory-{uuid.uuid4().hex[:8]}"
    target.create_queue(queue)
    time.sleep(SETTLE_SECONDS)
    baseline = sum(rss_by_role(target).values())
    errors: list[str] = []
    c = cclient.CClient(cclient.argv(loadgen, target.client(), cclient.LoadgenArgs(
        "send", target.address(queue), n, size, True, window=FILL_WINDOW, timeout=give_up, barrier="none")),
        "memory-fill")
    sampler = _Sampler(target, time.monotonic())
    sampler.start()
    try:
        d = c.wait_result(give_up + 30)
    finally:
        c.close()
        time.sleep(SETTLE_SECONDS)  # the broker pages out what the last burst brought in
        sampler.stop_flag.set()
        sampler.join(5)
    r = cclient.loop_result(d)
    if r.error:
        errors.append(f"fill: {r.error}")
    final = sum(rss_by_role(target).values())
    depth = -1
    try:
        depth = target.queue_depth(queue, timeout=60.0)
    except Exception as e:
        errors.append(f"reading the depth of {queue}: {type(e).__name__}: {e}")
    samples = sampler.samples
    peak = max([s for _, s in samples] + [final, baseline])
    return MemoryResult(target=target.name, messages=r.accepted, wanted=n, size=size, bound=bound_bytes,
                        allowance=ALLOWANCE, baseline_rss=baseline, peak_rss=peak, final_rss=final,
                        rss_samples=thin(samples), fill_seconds=r.end - r.start,
                        fill_rate=stats.rate(r.accepted, r.end - r.start), other_outcomes=r.other_outcomes,
                        depth_after=depth, errors=errors)
