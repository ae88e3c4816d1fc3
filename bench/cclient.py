"""Drive the C load generator (bench/loadgen/loadgen.c): command lines, its output lines, a process handle.

A `CClient` is one loadgen process with a reader thread on its stdout: "READY" (attached, waiting at the barrier),
"PROGRESS <received> <last receipt>" (receivers), and one final JSON line. The go line and the stop line are
written to its stdin. Parsing is pure (`parse_line`, `loop_result`) and unit-tested without a binary.
"""

from __future__ import annotations

import array
import contextlib
import json
import math
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.client import LoopResult
from bench.targets import ClientSpec


@dataclass(frozen=True)
class LoadgenArgs:
    mode: str  # send | sync | receive
    address: str
    count: int = 0  # 0: until stopped
    size: int = 128
    durable: bool = False
    window: int = 200
    credit: int = 200
    duration: float | None = None
    rate: float | None = None
    timeout: float = 600.0
    barrier: str = "stdin"
    progress_ms: int = 0
    samples_file: str | None = None
    presettled: bool = False


def argv(binary: str | Path, spec: ClientSpec, a: LoadgenArgs) -> list[str]:
    """The loadgen command line for one client (pure)."""
    out = [str(binary), a.mode, "--url", spec.url, "--address", a.address, "--count", str(a.count),
           "--size", str(a.size), "--timeout", f"{a.timeout:g}", "--barrier", a.barrier]
    if a.mode == "send":
        out += ["--window", str(a.window)]
    if a.mode == "receive":
        out += ["--credit", str(a.credit)]
    if a.durable:
        out.append("--durable")
    if a.presettled:
        out.append("--presettled")
    if a.duration:
        out += ["--duration", f"{a.duration:g}"]
    if a.rate:
        out += ["--rate", f"{a.rate:g}"]
    if a.progress_ms:
        out += ["--progress-ms", str(a.progress_ms)]
    if a.samples_file:
        out += ["--samples-file", a.samples_file]
    if spec.user is not None:
        out += ["--user", spec.user, "--password", spec.password or ""]
    return out


def parse_line(line: str) -> tuple[str, Any]:
    """One stdout line -> ("ready", None) | ("progress", (received, last)) | ("result", dict) | ("other", line)."""
    s = line.strip()
    if s == "READY":
        return "ready", None
    if s.startswith("PROGRESS "):
        parts = s.split()
        if len(parts) == 3:
            with contextlib.suppress(ValueError):
                return "progress", (int(parts[1]), float(parts[2]))
    if s.startswith("{"):
        with contextlib.suppress(json.JSONDecodeError):
            d = json.loads(s)
            if isinstance(d, dict):
                return "result", d
    return "other", s


def _num(d: dict[str, Any], key: str, default: float = math.nan) -> float:
    v = d.get(key)
    return float(v) if isinstance(v, int | float) else default


def loop_result(d: dict[str, Any], latencies_ms: array.array | None = None) -> LoopResult:  # type: ignore[type-arg]
    """A loadgen JSON result -> the LoopResult the phases use for both client kinds (latencies in seconds)."""
    r = LoopResult(sent=int(d.get("sent") or 0), accepted=int(d.get("accepted") or 0),
                   other_outcomes=int(d.get("other_outcomes") or 0), received=int(d.get("received") or 0),
                   start=_num(d, "start", 0.0), end=_num(d, "end", 0.0), cpu_seconds=_num(d, "cpu_seconds", 0.0),
                   error=d.get("error") or None)
    if d.get("mode") == "receive" and not math.isnan(_num(d, "last_receive")):
        r.end = _num(d, "last_receive")
    if latencies_ms is not None:
        r.latencies = [v / 1e3 for v in latencies_ms]
    return r


def read_samples(path: str | Path) -> array.array:  # type: ignore[type-arg]
    """Latency samples written by loadgen --samples-file: float32 milliseconds, native byte order."""
    out = array.array("f")
    p = Path(path)
    if p.exists():
        out.frombytes(p.read_bytes())
    return out


class CClient:
    """One loadgen process; stdout is read by a thread, stdin carries the go and stop lines."""

    def __init__(self, cmd: list[str], role: str) -> None:
        self.cmd = cmd
        self.role = role
        self.ready = threading.Event()
        self.done = threading.Event()
        self.received = 0
        self.last = 0.0
        self.result: dict[str, Any] | None = None
        self.other: list[str] = []
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, bufsize=1)
        self._stderr: list[str] = []
        threading.Thread(target=self._read_stdout, daemon=True).start()
        threading.Thread(target=self._read_stderr, daemon=True).start()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _read_stdout(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            kind, value = parse_line(line)
            if kind == "ready":
                self.ready.set()
            elif kind == "progress":
                self.received, self.last = value
            elif kind == "result":
                self.result = value
            else:
                self.other.append(value)
        self.done.set()

    def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            if len(self._stderr) < 50:
                self._stderr.append(line.rstrip())

    def stderr_text(self) -> str:
        return " | ".join(self._stderr)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def send(self, line: str) -> None:
        with contextlib.suppress(BrokenPipeError, OSError, ValueError):
            assert self.proc.stdin is not None
            self.proc.stdin.write(line + "\n")
            self.proc.stdin.flush()

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not self.ready.wait(0.05):
            if self.done.is_set() or not self.alive():
                self.done.wait(5)
                raise RuntimeError(f"loadgen {self.role} ended before READY: {self.failure()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"loadgen {self.role} not READY within {timeout}s: {self.failure()}")

    def wait_result(self, timeout: float) -> dict[str, Any]:
        if not self.done.wait(timeout):
            self.kill()
            self.done.wait(5)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(5)
        if self.result is None:
            return {"error": f"no result from loadgen {self.role} within {timeout}s: {self.failure()}"}
        return self.result

    def failure(self) -> str:
        err = (self.result or {}).get("error")
        return str(err or self.stderr_text() or f"exit status {self.proc.poll()}")

    def kill(self) -> None:
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()

    def close(self) -> None:
        self.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)
        for f in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if f is not None:
                with contextlib.suppress(OSError):
                    f.close()


def fill(binary: str | Path, spec: ClientSpec, address: str, n: int, size: int, durable: bool,
         window: int = 1000, timeout: float = 3600.0) -> tuple[int, float, dict[str, Any]]:
    """Publish n messages with `window` in flight, all confirmed; returns (accepted, seconds, JSON result)."""
    c = CClient(argv(binary, spec, LoadgenArgs("send", address, n, size, durable, window=window, timeout=timeout,
                                               barrier="none")), "fill")
    try:
        d = c.wait_result(timeout + 30)
    finally:
        c.close()
    r = loop_result(d)
    if r.error or r.accepted != n:
        raise RuntimeError(f"fill {address}: {r.accepted}/{n} accepted ({r.error or c.failure()})")
    return r.accepted, r.end - r.start, d


class Background:
    """A steady publisher at `rate` msg/s until stopped (the catch-up phase's live traffic)."""

    def __init__(self, binary: str | Path, spec: ClientSpec, address: str, rate: float, size: int, durable: bool,
                 window: int = 100, timeout: float = 3600.0) -> None:
        self.client = CClient(argv(binary, spec, LoadgenArgs("send", address, 0, size, durable, window=window,
                                                             rate=rate, timeout=timeout)), "background")
        try:
            self.client.wait_ready(60.0)
        except Exception:
            self.client.close()
            raise
        self.client.send("go")

    def stop(self) -> dict[str, Any]:
        self.client.send("stop")
        try:
            return self.client.wait_result(60.0)
        finally:
            self.client.close()
