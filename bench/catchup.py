"""Catch-up phase: how long a new, empty backup takes to become `ready` behind a primary holding N messages.

Timeline (on a started `OursReplicated` target): stop the last backup and wipe its data; create a fresh queue on the
primary and fill it with N messages (pipelined publisher, every message confirmed); sample broker CPU; start the
backup (same name and port, empty data dir) and poll its HA state (management `STATUS ha-broker`) until it says
`ready`; sample CPU again; delete the queue. The other backups (if any) stay ready throughout, so with 2 backups the
fill is replicated to one of them while the new one catches up alone.

Reported: time from the backup's process start to `ready` (`seconds`), the part of it before the backup answered
management at all (`startup_seconds`, Python start-up, not catch-up), catch-up msg/s over the rest, and broker CPU of
the whole set over that rest (per role, and summed per message caught up).

Live traffic during catch-up (`publisher_rate` > 0, needs the C load generator): a steady publisher on a *second*
queue of the primary, at `publisher_rate` msg/s with up to 100 unconfirmed, runs from just before the backup starts
until it is `ready`. A second queue, so that the depth being caught up stays N and the figure stays comparable
between runs; the live messages must still be replicated to the joining backup (and to the other backup) while it
catches up. Its accepted count, achieved rate and confirm latency are reported with the catch-up
(`publisher_*`); the CPU figures include its load.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench import cclient, procstat, stats
from bench.client import PublishLoop, encode_message
from bench.ours import OursReplicated

FILL_WINDOW = 1000
POLL_SECONDS = 0.1
DELETE_TIMEOUT = 300.0  # a queue of 1M messages is not deleted within the management client's usual 5 s


@dataclass(frozen=True)
class Timeline:
    """What the state poll saw, as offsets in seconds from the backup's process start."""

    answered: float  # first STATUS answer (any state); NaN if never
    ready: float  # first `ready`; NaN if never
    states: tuple[str, ...]  # distinct states in order of first appearance


def timeline(samples: list[tuple[float, str | None]], t0: float) -> Timeline:
    """Pure: (monotonic time, state or None when unreachable) samples -> first answer, first ready, states seen."""
    answered = ready = float("nan")
    states: list[str] = []
    for t, state in samples:
        if state is None:
            continue
        if answered != answered:  # NaN: first answer
            answered = t - t0
        if state not in states:
            states.append(state)
        if state == "ready":
            ready = t - t0
            break
    return Timeline(answered, ready, tuple(states))


@dataclass
class CatchupResult:
    target: str
    messages: int
    fill_seconds: float
    fill_rate: float
    seconds: float  # backup process start -> ready
    startup_seconds: float  # backup process start -> first management answer
    catchup_rate: float  # messages / (seconds - startup_seconds)
    broker_cpu_seconds: dict[str, float]  # per role, from the backup's first management answer to ready
    broker_us_per_msg: float  # the whole set's CPU over that interval, per message caught up
    machine_busy_share: float
    delete_seconds: float = float("nan")  # DELETE of the filled queue afterwards (management round trip)
    states: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    publisher_rate_target: float = 0.0  # msg/s asked of the live publisher (0: none ran)
    publisher_accepted: int = 0
    publisher_rate: float = float("nan")  # achieved msg/s over its run
    publisher_latency_ms: dict[str, float] = field(default_factory=dict)  # send -> confirmation

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class _StatePoller:
    """Polls one broker's HA state over a management connection kept open between polls."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.client: Any = None

    def state(self) -> str | None:
        from broker.client import ManagementClient, ManagementError

        try:
            if self.client is None:
                self.client = ManagementClient(self.url, timeout=5.0)
            return str(self.client.call("STATUS", "ha-broker").body["state"])
        except (ManagementError, OSError, KeyError):
            self.close()
            return None

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
            self.client = None


def fill(target: OursReplicated, queue: str, n: int, size: int, durable: bool, give_up: float,
         loadgen: str | Path | None = None) -> tuple[int, float]:
    """Publish n messages to `queue` with many in flight; returns (accepted, seconds)."""
    if loadgen is not None:
        accepted, seconds, _ = cclient.fill(loadgen, target.client(), target.address(queue), n, size, durable,
                                            FILL_WINDOW, give_up)
        return accepted, seconds
    loop = PublishLoop(target.client(), target.address(queue), encode_message(size, durable), n, None,
                       FILL_WINDOW, lambda: None, give_up)
    r = loop.run()
    if r.error or r.accepted != n:
        raise RuntimeError(f"fill {queue}: {r.accepted}/{n} accepted ({r.error})")
    return r.accepted, r.end - r.start


def run_catchup(target: OursReplicated, n: int, size: int, durable: bool = False,
                give_up: float = 3600.0, loadgen: str | Path | None = None,
                publisher_rate: float = 0.0) -> CatchupResult:
    backup = target.backups  # the last backup is the one that rejoins empty
    queue = f"bench-catchup-{uuid.uuid4().hex[:8]}"
    live = f"bench-catchup-live-{uuid.uuid4().hex[:8]}"
    live_on = bool(publisher_rate > 0 and loadgen is not None)
    target.stop_backup(backup)
    target.create_queue(queue)
    if live_on:
        target.create_queue(live)
    errors: list[str] = []
    background: cclient.Background | None = None
    pub: dict[str, Any] = {}
    try:
        filled, fill_s = fill(target, queue, n, size, durable, give_up, loadgen)
        if live_on:
            assert loadgen is not None
            background = cclient.Background(loadgen, target.client(), target.address(live), publisher_rate, size,
                                            durable, timeout=give_up)
        cpu0, m0 = _broker_cpu(target), procstat.machine_busy()
        t0 = time.monotonic()
        b = target.start_backup(backup)
        poller = _StatePoller(b.url)
        samples: list[tuple[float, str | None]] = []
        cpu_up: dict[str, float] | None = None
        try:
            while True:
                st = poller.state()
                samples.append((time.monotonic(), st))
                if st is not None and cpu_up is None:
                    cpu_up = _broker_cpu(target)
                if st == "ready":
                    break
                if b.proc is None or b.proc.poll() is not None:
                    errors.append(f"backup {b.name} exited during catch-up")
                    break
                if time.monotonic() - t0 > give_up:
                    errors.append(f"backup not ready after {give_up}s (last state {st})")
                    break
                time.sleep(POLL_SECONDS)
        finally:
            poller.close()
        cpu1, m1 = _broker_cpu(target), procstat.machine_busy()
        if background is not None:
            pub, background = background.stop(), None
            if pub.get("error"):
                errors.append(f"live publisher: {pub['error']}")
    finally:
        if background is not None:
            background.stop()
        # Deleting a deep queue takes the primary a while (and replicates to the backups): a failure here is
        # reported with the measurement instead of losing it.
        t_del = time.monotonic()
        try:
            target.delete_queue(queue, timeout=DELETE_TIMEOUT)
        except Exception as e:
            errors.append(f"deleting {queue}: {type(e).__name__}: {e}")
        delete_s = time.monotonic() - t_del
        if live_on:
            try:
                target.delete_queue(live, timeout=DELETE_TIMEOUT)
            except Exception as e:
                errors.append(f"deleting {live}: {type(e).__name__}: {e}")
    tl = timeline(samples, t0)
    pub_r = cclient.loop_result(pub) if pub else None
    cpu = {k: cpu1[k] - (cpu_up or cpu0).get(k, 0.0) for k in cpu1}
    return CatchupResult(
        target=target.name, messages=filled, fill_seconds=fill_s, fill_rate=stats.rate(filled, fill_s),
        seconds=tl.ready, startup_seconds=tl.answered, catchup_rate=stats.rate(filled, tl.ready - tl.answered),
        broker_cpu_seconds=cpu, broker_us_per_msg=stats.per_message_us(sum(cpu.values()), filled),
        machine_busy_share=(m1[0] - m0[0]) / (m1[1] - m0[1]) if m1[1] > m0[1] else 0.0,
        delete_seconds=delete_s, states=list(tl.states), errors=errors,
        publisher_rate_target=publisher_rate if live_on else 0.0,
        publisher_accepted=pub_r.accepted if pub_r else 0,
        publisher_rate=stats.rate(pub_r.accepted, pub_r.end - pub_r.start) if pub_r else float("nan"),
        publisher_latency_ms={k: float(v) for k, v in (pub.get("latency_ms") or {}).items()
                              if isinstance(v, int | float)})


def _broker_cpu(target: OursReplicated) -> dict[str, float]:
    return {role: procstat.cpu_seconds(pids) for role, pids in target.pid_groups().items()}
