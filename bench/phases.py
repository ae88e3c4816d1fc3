"""The measured phases, each run against one started target with client processes: the C load generator
(`client="c"`, bench/loadgen, one process per client driven by bench.cclient) or the Python clients
(`client="python"`, bench/client.py in multiprocessing spawn processes).

Timeline of a phase: the parent creates a fresh queue; every client process connects and attaches, then waits at a
barrier; the parent samples broker and machine CPU and opens the gate; clients run; the phase ends when the
publishers have every message settled (publish, latency) or when the consumers have received every accepted message
(end-to-end); the parent samples CPU again. Rates use the parent's gate time and the clients' end times
(CLOCK_MONOTONIC is system-wide, so times from different processes compare).
"""

from __future__ import annotations

import array
import multiprocessing as mp
import queue as queue_mod
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench import cclient, procstat, stats
from bench.client import ConsumeLoop, LoopResult, PublishLoop, encode_message
from bench.targets import ClientSpec, Target

CTX = mp.get_context("spawn")
SETUP_TIMEOUT = 60.0


@dataclass(frozen=True)
class PhaseSpec:
    name: str  # publish | e2e | latency
    publishers: int
    consumers: int
    messages: int  # total over all publishers
    duration: float | None  # seconds; caps each publisher when set
    window: int  # unsettled deliveries per publisher (1 = sync)
    credit: int  # consumer credit window
    size: int
    durable: bool
    nice: int = 0  # applied to every broker thread and client process before the gate opens (0 = leave alone)


@dataclass
class PhaseResult:
    target: str
    phase: str
    messages: int
    seconds: float
    rate: float
    broker_cpu_seconds: dict[str, float]
    broker_us_per_msg: float
    broker_core_share: float  # broker CPU seconds / wall seconds (1.0 = one full core)
    client_processes: int
    client_cpu_seconds: float
    client_us_per_msg: float
    client_max_core_share: float  # busiest client process: CPU seconds / wall seconds (1.0 = a full core)
    machine_busy_share: float  # whole machine: busy / total over the phase (1.0 = every core busy)
    latency_ms: dict[str, float] = field(default_factory=dict)  # send -> settlement (sync phase; C: every phase)
    other_outcomes: int = 0
    errors: list[str] = field(default_factory=list)
    client: str = "python"  # c | python
    e2e_latency_ms: dict[str, float] = field(default_factory=dict)  # C consumers: send stamp -> receipt
    #: {role: {part: [user, system] CPU seconds}}: the broker's event loop, its other threads, its sync process
    broker_thread_seconds: dict[str, dict[str, list[float]]] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


# ---------------------------------------------------------------------------------------------------------------
# Client process entry points (module level so that `spawn` can import them).

def _publisher_main(spec: ClientSpec, address: str, payload: bytes, count: int, duration: float | None,
                    window: int, barrier: Any, go: Any, results: Any, give_up: float) -> None:
    def ready() -> None:
        barrier.wait(SETUP_TIMEOUT)
        go.wait(SETUP_TIMEOUT)

    loop = PublishLoop(spec, address, payload, count, duration, window, ready, give_up)
    results.put(("pub", _run(loop)))


def _consumer_main(spec: ClientSpec, address: str, credit: int, slot: int, counts: Any, lasts: Any,
                   barrier: Any, go: Any, stop: Any, results: Any, give_up: float) -> None:
    def ready() -> None:
        barrier.wait(SETUP_TIMEOUT)
        go.wait(SETUP_TIMEOUT)

    def report(n: int, t: float) -> None:
        counts[slot] = n
        lasts[slot] = t

    loop = ConsumeLoop(spec, address, credit, ready, stop.is_set, report, give_up)
    results.put(("con", _run(loop)))


def _run(loop: PublishLoop | ConsumeLoop) -> LoopResult:
    try:
        return loop.run()
    except Exception as e:  # report, never hang the parent
        loop.result.error = f"{type(e).__name__}: {e}"
        return loop.result


# ---------------------------------------------------------------------------------------------------------------

@dataclass
class CpuReading:
    """Broker CPU seconds so far: per role, and per role and part (`procstat.thread_parts`: user, system)."""

    roles: dict[str, float]
    parts: dict[str, dict[str, tuple[float, float]]]


def _broker_cpu(target: Target) -> CpuReading:
    groups = target.pid_groups()
    return CpuReading({role: procstat.cpu_seconds(pids) for role, pids in groups.items()},
                      {role: procstat.thread_parts(pids[0], pids) for role, pids in groups.items()
                       if pids and target.broker_parts})


def run_phase(target: Target, spec: PhaseSpec, give_up: float = 600.0, loadgen: str | Path | None = None
              ) -> PhaseResult:
    """One phase on a fresh queue; `loadgen` (the C binary) selects the C clients, None the Python ones."""
    qname = f"bench-{spec.name}-{uuid.uuid4().hex[:8]}"
    target.create_queue(qname)
    try:
        if loadgen is not None:
            return _run_phase_c(target, spec, qname, give_up, loadgen)
        return _run_phase(target, spec, qname, give_up)
    finally:
        target.delete_queue(qname)


def per_publisher(messages: int, publishers: int) -> list[int]:
    return [messages // publishers + (1 if i < messages % publishers else 0) for i in range(publishers)]


def latency_summary(values_ms: Sequence[float]) -> dict[str, float]:
    """p50/p99/mean (ms) and the sample count; {} when there are no samples."""
    if not values_ms:
        return {}
    return {"p50": stats.percentile(values_ms, 50), "p99": stats.percentile(values_ms, 99),
            "mean": sum(values_ms) / len(values_ms), "samples": float(len(values_ms))}


def _result(target: Target, spec: PhaseSpec, pubs: list[LoopResult], cons: list[LoopResult], t0: float,
            t_end: float, cpu0: CpuReading, cpu1: CpuReading, m0: tuple[float, float],
            m1: tuple[float, float], errors: list[str], latency: dict[str, float], client: str,
            e2e_latency: dict[str, float] | None = None) -> PhaseResult:
    loops = pubs + cons
    errors = errors + [r.error for r in loops if r.error]
    accepted = sum(r.accepted for r in pubs)
    seconds = t_end - t0
    client_cpu = sum(r.cpu_seconds for r in loops)
    broker_cpu = {k: cpu1.roles[k] - cpu0.roles.get(k, 0.0) for k in cpu1.roles}
    return PhaseResult(
        target=target.name, phase=spec.name, messages=accepted, seconds=seconds,
        rate=stats.rate(accepted, seconds), broker_cpu_seconds=broker_cpu,
        broker_us_per_msg=stats.per_message_us(sum(broker_cpu.values()), accepted),
        broker_core_share=sum(broker_cpu.values()) / seconds if seconds > 0 else 0.0,
        client_processes=len(loops), client_cpu_seconds=client_cpu,
        client_us_per_msg=stats.per_message_us(client_cpu, accepted),
        client_max_core_share=max((r.cpu_seconds / seconds for r in loops), default=0.0) if seconds > 0 else 0.0,
        machine_busy_share=(m1[0] - m0[0]) / (m1[1] - m0[1]) if m1[1] > m0[1] else 0.0,
        latency_ms=latency, other_outcomes=sum(r.other_outcomes for r in pubs), errors=errors, client=client,
        e2e_latency_ms=e2e_latency or {},
        broker_thread_seconds={role: procstat.parts_delta(cpu0.parts.get(role, {}), parts)
                               for role, parts in cpu1.parts.items()},
    )


def _run_phase(target: Target, spec: PhaseSpec, qname: str, give_up: float) -> PhaseResult:
    client = target.client()
    address = target.address(qname)
    payload = encode_message(spec.size, spec.durable)
    n = spec.publishers + spec.consumers
    barrier, go, stop = CTX.Barrier(n + 1), CTX.Event(), CTX.Event()
    results = CTX.Queue()
    counts = CTX.RawArray("q", max(1, spec.consumers))
    lasts = CTX.RawArray("d", max(1, spec.consumers))
    per_pub = per_publisher(spec.messages, spec.publishers)
    procs = [CTX.Process(target=_publisher_main, daemon=True,
                         args=(client, address, payload, per_pub[i], spec.duration, spec.window, barrier, go,
                               results, give_up)) for i in range(spec.publishers)]
    procs += [CTX.Process(target=_consumer_main, daemon=True,
                          args=(client, address, spec.credit, i, counts, lasts, barrier, go, stop, results, give_up))
              for i in range(spec.consumers)]
    errors: list[str] = []
    for p in procs:
        p.start()
    try:
        barrier.wait(SETUP_TIMEOUT)
        if spec.nice:
            broker_pids = [p for pids in target.pid_groups().values() for p in pids]
            procstat.renice(broker_pids + [p.pid for p in procs if p.pid is not None], spec.nice)
        cpu0, m0 = _broker_cpu(target), procstat.machine_busy()
        t0 = time.monotonic()
        go.set()
        early: list[LoopResult] = []
        pubs = [_take(results, "pub", give_up, errors, early) for _ in range(spec.publishers)]
        accepted = sum(r.accepted for r in pubs)
        if spec.consumers:
            _wait_received(counts, accepted, give_up, errors, procs[spec.publishers:])
            t_end = max(lasts[:])
        else:
            t_end = max(r.end for r in pubs)
        cpu1, m1 = _broker_cpu(target), procstat.machine_busy()
        stop.set()
        cons = early + [_take(results, "con", 60.0, errors, early) for _ in range(spec.consumers - len(early))]
    finally:
        stop.set()
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
    lat = [x * 1e3 for r in pubs for x in r.latencies]
    return _result(target, spec, pubs, cons, t0, t_end, cpu0, cpu1, m0, m1, errors, latency_summary(lat), "python")


def _take(results: Any, kind: str, timeout: float, errors: list[str], early: list[LoopResult]) -> LoopResult:
    """The next result of `kind`; a consumer result arriving first (it failed early) is kept in `early`."""
    while True:
        try:
            got_kind, r = results.get(timeout=timeout)
        except queue_mod.Empty:
            errors.append(f"no result from a {kind} process within {timeout}s")
            return LoopResult(error="missing")
        if got_kind == kind:
            return r  # type: ignore[no-any-return]
        early.append(r)


def _wait_received(counts: Any, expected: int, timeout: float, errors: list[str], consumers: list[Any]) -> None:
    deadline = time.monotonic() + timeout
    while sum(counts[:]) < expected:
        if not any(p.is_alive() for p in consumers):
            errors.append(f"every consumer ended after {sum(counts[:])} of {expected} messages")
            return
        if time.monotonic() > deadline:
            errors.append(f"consumers got {sum(counts[:])} of {expected} within {timeout}s")
            return
        time.sleep(0.005)


# ---------------------------------------------------------------------------------------------------------------
# The same phase with the C load generator: one loadgen process per client, barrier over stdin/stdout.

PROGRESS_MS = 20


def _run_phase_c(target: Target, spec: PhaseSpec, qname: str, give_up: float, loadgen: str | Path) -> PhaseResult:
    client = target.client()
    address = target.address(qname)
    errors: list[str] = []
    with tempfile.TemporaryDirectory(prefix="bench-loadgen-") as tmp:
        pub_files = [str(Path(tmp) / f"pub-{i}.f32") for i in range(spec.publishers)]
        con_files = [str(Path(tmp) / f"con-{i}.f32") for i in range(spec.consumers)]
        mode = "sync" if spec.window == 1 else "send"
        pubs_c = [cclient.CClient(cclient.argv(loadgen, client, cclient.LoadgenArgs(
            mode, address, n, spec.size, spec.durable, window=spec.window, duration=spec.duration, timeout=give_up,
            samples_file=pub_files[i])), f"publisher-{i + 1}") for i, n in enumerate(per_publisher(spec.messages,
                                                                                              spec.publishers))]
        cons_c = [cclient.CClient(cclient.argv(loadgen, client, cclient.LoadgenArgs(
            "receive", address, 0, spec.size, credit=spec.credit, timeout=give_up, progress_ms=PROGRESS_MS,
            samples_file=con_files[i])), f"consumer-{i + 1}") for i in range(spec.consumers)]
        everyone = cons_c + pubs_c
        try:
            deadline = time.monotonic() + SETUP_TIMEOUT
            for c in everyone:
                c.wait_ready(max(0.1, deadline - time.monotonic()))
            if spec.nice:
                broker_pids = [p for pids in target.pid_groups().values() for p in pids]
                procstat.renice(broker_pids + [c.pid for c in everyone], spec.nice)
            cpu0, m0 = _broker_cpu(target), procstat.machine_busy()
            t0 = time.monotonic()
            for c in everyone:
                c.send("go")
            pub_json = [c.wait_result(give_up + 30) for c in pubs_c]
            pubs = [cclient.loop_result(d) for d in pub_json]
            accepted = sum(r.accepted for r in pubs)
            if cons_c:
                _wait_received_c(cons_c, accepted, give_up, errors)
            else:
                t_end = max((r.end for r in pubs), default=t0)
            cpu1, m1 = _broker_cpu(target), procstat.machine_busy()
            for c in cons_c:
                c.send("stop")
            cons = [cclient.loop_result(c.wait_result(60.0)) for c in cons_c]
            if cons_c:
                t_end = max((r.end for r in cons if r.end), default=t0)
            for c, r in zip(everyone, cons + pubs, strict=True):
                if r.error and c.stderr_text() and c.stderr_text() not in r.error:
                    r.error = f"{c.role}: {r.error}"
        finally:
            for c in everyone:
                c.close()
        pub_lat = _concat([cclient.read_samples(f) for f in pub_files])
        con_lat = _concat([cclient.read_samples(f) for f in con_files])
    return _result(target, spec, pubs, cons, t0, t_end, cpu0, cpu1, m0, m1, errors, latency_summary(pub_lat), "c",
                   latency_summary(con_lat))


def _concat(arrays: list[array.array]) -> array.array:  # type: ignore[type-arg]
    out = array.array("f")
    for a in arrays:
        out.extend(a)
    return out


def _wait_received_c(consumers: list[cclient.CClient], expected: int, timeout: float, errors: list[str]) -> None:
    deadline = time.monotonic() + timeout
    while sum(c.received for c in consumers) < expected:
        if not any(c.alive() for c in consumers):
            errors.append(f"every consumer ended after {sum(c.received for c in consumers)} of {expected} "
                          f"messages: {'; '.join(c.failure() for c in consumers)}")
            return
        if time.monotonic() > deadline:
            errors.append(f"consumers got {sum(c.received for c in consumers)} of {expected} within {timeout}s")
            return
        time.sleep(0.005)
