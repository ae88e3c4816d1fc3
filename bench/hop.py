"""The loopback one-way hop of this machine, measured in the same run as the phases.

A TCP ping-pong of 1-byte messages between two processes over 127.0.0.1 (TCP_NODELAY): the hop is half the median
round trip. With the C load generator built, `loadgen hop` does it (fork, blocking read/write); otherwise two Python
processes do (slower: it then includes the interpreter's cost per message, and says so in `method`).
"""

from __future__ import annotations

import json
import multiprocessing as mp
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

from bench import stats

CTX = mp.get_context("spawn")


def summarize(rtts_us: list[float], method: str) -> dict[str, Any]:
    """RTT samples (µs) -> the hop figure (half the median RTT) and the RTT percentiles (pure)."""
    if not rtts_us:
        return {"method": method, "samples": 0, "hop_us": float("nan"), "rtt_us": {}, "error": "no samples"}
    p50 = stats.percentile(rtts_us, 50)
    return {"method": method, "samples": len(rtts_us), "hop_us": p50 / 2,
            "rtt_us": {"p50": p50, "p99": stats.percentile(rtts_us, 99), "min": min(rtts_us),
                       "mean": sum(rtts_us) / len(rtts_us)}, "error": None}


def from_loadgen(d: dict[str, Any]) -> dict[str, Any]:
    """`loadgen hop` JSON -> the same shape as `summarize` (pure)."""
    return {"method": "c", "samples": int(d.get("samples") or 0), "hop_us": float(d.get("hop_us") or "nan"),
            "rtt_us": dict(d.get("rtt_us") or {}), "error": d.get("error")}


def _echo(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port)) as c:
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        while True:
            b = c.recv(1)
            if not b:
                return
            c.sendall(b)


def python_pingpong(count: int) -> dict[str, Any]:
    with socket.socket() as ls:
        ls.bind(("127.0.0.1", 0))
        ls.listen(1)
        child = CTX.Process(target=_echo, args=(ls.getsockname()[1],), daemon=True)
        child.start()
        ls.settimeout(30)
        c, _ = ls.accept()
    rtts: list[float] = []
    with c:
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        warmup = max(100, count // 10)
        for i in range(warmup + count):
            t0 = time.perf_counter()
            c.sendall(b"x")
            if c.recv(1) != b"x":
                break
            if i >= warmup:
                rtts.append((time.perf_counter() - t0) * 1e6)
    child.join(10)
    return summarize(rtts, "python")


def measure(loadgen: str | Path | None, count: int = 20_000) -> dict[str, Any]:
    if loadgen is not None:
        r = subprocess.run([str(loadgen), "hop", "--count", str(count)], capture_output=True, text=True, timeout=120)
        line = next((x for x in r.stdout.splitlines() if x.startswith("{")), "")
        if r.returncode == 0 and line:
            return from_loadgen(json.loads(line))
    return python_pingpong(count)
