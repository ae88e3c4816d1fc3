"""Synthetic event logs with known answers, for tests and the benchmark.

A night of a three-broker cluster (docs/events.md schema): b1 is primary with backups b2 and b3, which catch up and
become ready; the primary logs ``ha.lag`` samples and ``client.settled`` windows; at ``failover_at`` b1 dies, b2 is
promoted (epoch 2), b3 catches up again and b2 becomes active. Optional bad lines of every kind are mixed in.

Lines are streamed to files (never held in memory), one file per broker, rotated every ``lines_per_file`` lines,
laid out flat (``<broker>-<n>.jsonl``) or by date (``date=YYYY-MM-DD/<broker>-<n>.jsonl``), optionally gzipped.

Usage::

    truth = generate(Scenario(lag_samples=10_000), Path("/tmp/logs"))
    truth.failover.outage_seconds  # 4.5
"""

from __future__ import annotations

import datetime as dt
import gzip
import json
import random
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from spark.events import Quality

PRIMARY, NEW_PRIMARY, OTHER = "b1", "b2", "b3"


@dataclass(frozen=True)
class Scenario:
    day: dt.date = dt.date(2026, 11, 22)
    start_hour: int = 1
    hours: int = 3
    queues: tuple[str, ...] = ("orders", "audit")
    lag_samples: int = 5_000
    failover_fraction: float = 0.5  # where in the night b1 dies
    seed: int = 7
    bad_lines: bool = False
    partitioned: bool = False
    gzipped: bool = False
    lines_per_file: int = 2_000_000
    slow_hour: int | None = 2  # lags in this hour are 3x larger: visible in the plots

    @property
    def t0(self) -> float:
        return dt.datetime(self.day.year, self.day.month, self.day.day, self.start_hour, tzinfo=dt.UTC).timestamp()

    @property
    def t_end(self) -> float:
        return self.t0 + self.hours * 3600

    @property
    def failover_t(self) -> float:
        return float(int(self.t0 + self.failover_fraction * self.hours * 3600))


@dataclass(frozen=True)
class FailoverTruth:
    old_primary: str
    new_primary: str
    epoch: int
    primary_lost_at: dt.datetime
    promoted_at: dt.datetime
    active_at: dt.datetime
    backup_ready_at: dict[str, dt.datetime]
    outage_seconds: float


@dataclass
class Truth:
    failover: FailoverTruth
    catchup_episodes: int = 0  # as the report shows them (primary's view)
    bad: Counter[str] = field(default_factory=Counter)  # Quality value -> lines
    out_of_range: int = 0
    lines: int = 0


def sample_rate_at(second: int) -> float:
    """Deterministic sampling pattern: every 10th second at 1/4, every 10th+5 at 1/2, else every ack logged."""
    return {0: 0.25, 5: 0.5}.get(second % 10, 1.0)


class _Writer:
    """One rotating output stream per broker."""

    def __init__(self, root: Path, scenario: Scenario) -> None:
        self.root = root
        self.scenario = scenario
        self.files: dict[str, IO[str]] = {}
        self.counts: Counter[str] = Counter()
        self.total = 0

    def write(self, broker: str, line: str) -> None:
        handle = self.files.get(broker)
        if handle is None or self.counts[broker] % self.scenario.lines_per_file == 0:
            if handle is not None:
                handle.close()
            handle = self._open(broker, self.counts[broker] // self.scenario.lines_per_file)
            self.files[broker] = handle
        handle.write(line)
        handle.write("\n")
        self.counts[broker] += 1
        self.total += 1

    def _open(self, broker: str, index: int) -> IO[str]:
        directory = self.root / f"date={self.scenario.day}" if self.scenario.partitioned else self.root
        directory.mkdir(parents=True, exist_ok=True)
        name = f"{broker}-{index}.jsonl"
        if self.scenario.gzipped:
            return gzip.open(directory / f"{name}.gz", "wt", encoding="utf-8", compresslevel=1)
        return open(directory / name, "w", encoding="utf-8")

    def close(self) -> None:
        for handle in self.files.values():
            handle.close()


def iso(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def at(t: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(t, dt.UTC)


def event(t: float, broker: str, name: str, level: str = "info", **fields: Any) -> str:
    return json.dumps({"ts": iso(t), "level": level, "event": name, "broker": broker, **fields})


def generate(scenario: Scenario, root: Path) -> Truth:
    """Write the scenario's logs under ``root``; return what a correct report must find."""
    out = _Writer(root, scenario)
    try:
        truth = _write_all(scenario, out)
    finally:
        out.close()
    truth.lines = out.total
    return truth


def _write_all(s: Scenario, out: _Writer) -> Truth:
    rng = random.Random(s.seed)
    t0, tf = s.t0, s.failover_t
    episodes = _write_join(out, t0, PRIMARY, (NEW_PRIMARY, OTHER), s.queues, epoch=1, first=True)
    lost_at, promoted_at, ready_at, active_at = tf + 1.0, tf + 2.0, tf + 4.0, tf + 4.1
    last_old, first_new = tf - 0.2, tf + 4.3
    # Client settlement windows, one per second, by whichever broker is primary.
    for second in range(int(t0) + 6, int(s.t_end)):
        if second < tf:
            window_end = min(second + 0.95, last_old)
            out.write(PRIMARY, event(window_end, PRIMARY, "client.settled", count=40, first_ts=second + 0.05,
                                     last_ts=window_end, epoch=1, role="primary"))
        elif second >= first_new - 0.3:
            window_start = max(second + 0.05, first_new)
            out.write(NEW_PRIMARY, event(second + 0.95, NEW_PRIMARY, "client.settled", count=40,
                                         first_ts=window_start, last_ts=second + 0.95, epoch=2, role="primary"))
    _write_lag(s, out, rng)
    # The failover.
    for backup in (NEW_PRIMARY, OTHER):
        out.write(backup, event(lost_at, backup, "ha.primary.lost", "warning", primary=PRIMARY,
                                address="10.0.0.1:5672", reason="disconnected"))
    out.write(NEW_PRIMARY, event(promoted_at, NEW_PRIMARY, "ha.state", from_state="ready", to_state="recovering",
                                 role="primary", epoch=2, reason="promoted"))
    out.write(NEW_PRIMARY, event(promoted_at, NEW_PRIMARY, "ha.promoted", "warning", epoch=2, from_state="ready",
                                 forced=False, expected_backups=[OTHER]))
    episodes += _write_join(out, promoted_at + 0.5, NEW_PRIMARY, (OTHER,), s.queues, epoch=2, first=False,
                            ready_at=ready_at)
    out.write(NEW_PRIMARY, event(active_at, NEW_PRIMARY, "ha.active", epoch=2, waited_seconds=2.1, timed_out=[]))
    out.write(NEW_PRIMARY, event(active_at, NEW_PRIMARY, "ha.state", from_state="recovering", to_state="active",
                                 role="primary", epoch=2, reason="backups ready"))
    truth = Truth(
        failover=FailoverTruth(
            old_primary=PRIMARY, new_primary=NEW_PRIMARY, epoch=2, primary_lost_at=at(lost_at),
            promoted_at=at(promoted_at), active_at=at(active_at), backup_ready_at={OTHER: at(ready_at)},
            outage_seconds=round(first_new - last_old, 6),
        ),
        catchup_episodes=episodes,
    )
    if s.bad_lines:
        _write_bad(s, out, truth)
    return truth


def _write_join(out: _Writer, t: float, primary: str, backups: tuple[str, ...], queues: tuple[str, ...],
                epoch: int, first: bool, ready_at: float | None = None) -> int:
    """Backups join ``primary``: states, per-queue catch-up seen by both sides, ready. Returns episodes."""
    if first:
        out.write(primary, event(t, primary, "ha.state", from_state="recovering", to_state="active",
                                 role="primary", epoch=epoch, reason="first start"))
    for b in backups:
        out.write(b, event(t, b, "ha.primary.connected", primary=primary, address="10.0.0.9:5672", epoch=epoch))
        out.write(b, event(t, b, "ha.state", from_state="ready" if not first else "joining", to_state="catchup",
                           role="backup", epoch=epoch, reason="connected"))
    episodes = 0
    for i, b in enumerate(backups):
        for j, q in enumerate(queues):
            start, seconds = t + 0.1 + 0.2 * j, 0.5 + 0.7 * i + 0.3 * j
            messages = 100 * (i + 1) + 10 * j
            for observer in (primary, b):
                out.write(observer, event(start, observer, "ha.catchup.start", backup=b, queue=q, messages=messages))
                out.write(observer, event(start + seconds, observer, "ha.catchup.end", backup=b, queue=q,
                                          messages=messages, seconds=seconds))
            episodes += 1
    ready = ready_at if ready_at is not None else t + 5.0
    for b in backups:
        out.write(b, event(ready, b, "ha.state", from_state="catchup", to_state="ready", role="backup",
                           epoch=epoch, reason="caught up"))
        out.write(primary, event(ready, primary, "ha.backup.ready", backup=b, address="10.0.0.9:5672",
                                 seconds=ready - t))
    return episodes


def _write_lag(s: Scenario, out: _Writer, rng: random.Random) -> None:
    tf = s.failover_t
    before = [(q, b) for q in s.queues for b in (NEW_PRIMARY, OTHER)]
    after = [(q, OTHER) for q in s.queues]
    span_start, span_end = s.t0 + 10, s.t_end - 10
    step = (span_end - span_start) / max(s.lag_samples, 1)
    for i in range(s.lag_samples):
        t = span_start + i * step
        if tf <= t < tf + 5:
            continue  # no primary during the failover
        primary, pairs = (PRIMARY, before) if t < tf else (NEW_PRIMARY, after)
        queue, backup = pairs[i % len(pairs)]
        lag = round(rng.lognormvariate(1.0, 0.8) * (3.0 if at(t).hour == s.slow_hour else 1.0), 3)
        out.write(primary, _lag_line(t, primary, queue, backup, i, lag, rng.randint(0, 50), sample_rate_at(int(t))))


def _lag_line(t: float, broker: str, queue: str, backup: str, position: int, lag: float, backlog: int,
              rate: float) -> str:
    # Hand-formatted: this is the benchmark's hot loop (json.dumps costs 3x more).
    return (
        f'{{"ts": "{iso(t)}", "level": "info", "event": "ha.lag", "broker": "{broker}", "queue": "{queue}", '
        f'"backup": "{backup}", "position": {position}, "enqueue_ts": {t - lag / 1000:.6f}, "ack_ts": {t:.6f}, '
        f'"lag_ms": {lag}, "backlog": {backlog}, "sample_rate": {rate}}}'
    )


def _write_bad(s: Scenario, out: _Writer, truth: Truth) -> None:
    t = s.t0 + 30
    bad: list[tuple[Quality, str]] = [
        (Quality.MALFORMED, '{"ts": "' + iso(t) + '", "event": "ha.lag", "broker": "b1", "queue": '),
        (Quality.MALFORMED, "Traceback (most recent call last):"),
        (Quality.MALFORMED, "[1, 2, 3]"),
        (Quality.MISSING_COMMON, json.dumps({"level": "info", "event": "ha.lag", "broker": "b1"})),
        (Quality.MISSING_COMMON, event(t, "b1", "ha.lag").replace(iso(t), "yesterday-ish")),
        (Quality.UNKNOWN_EVENT, event(t, "b1", "ha.mystery", detail=1)),
        (Quality.MISSING_FIELD, event(t, "b1", "ha.lag", queue="orders", lag_ms=3.0)),  # no backup
        (Quality.MISSING_FIELD, event(t, "b1", "ha.lag", queue="orders", backup="b2", lag_ms="slow")),
        (Quality.MISSING_FIELD, event(t, "b1", "ha.promoted", epoch="two")),
        (Quality.NEGATIVE_LAG, event(t, "b1", "ha.lag", queue="orders", backup="b2", lag_ms=-12.5, sample_rate=1.0)),
        (Quality.NEGATIVE_LAG, event(t + 1, "b1", "ha.lag", queue="audit", backup="b3", enqueue_ts=t + 1.5,
                                     ack_ts=t + 1.0)),
        (Quality.OUT_OF_RANGE, event(s.t0 - 86400, "b1", "ha.lag", queue="orders", backup="b2", lag_ms=999.0)),
    ]
    for quality, line in bad:
        out.write(PRIMARY, line)
        if quality is Quality.OUT_OF_RANGE:
            truth.out_of_range += 1
        else:
            truth.bad[quality.value] += 1
    out.write(PRIMARY, "")  # blank lines are ignored, not counted
