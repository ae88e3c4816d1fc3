"""Results -> summary (medians over repeats), ratio table and load-generator table in markdown. Pure functions."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from bench import stats


@dataclass(frozen=True)
class Metric:
    label: str
    phase: str
    key: str  # attribute of a PhaseResult dict; "a.b" reaches into a nested dict
    higher_is_better: bool


METRICS = [
    Metric("confirmed publish, msg/s", "publish", "rate", True),
    Metric("end-to-end, msg/s", "e2e", "rate", True),
    Metric("sync publish p50, ms", "latency", "latency_ms.p50", False),
    Metric("sync publish p99, ms", "latency", "latency_ms.p99", False),
    Metric("broker CPU per msg, publish, µs", "publish", "broker_us_per_msg", False),
    Metric("broker CPU per msg, e2e, µs", "e2e", "broker_us_per_msg", False),
    Metric("broker CPU per msg, sync, µs", "latency", "broker_us_per_msg", False),
]
LOADGEN_KEYS = [("client procs", "client_processes"), ("messages", "messages"), ("seconds", "seconds"), ("client CPU µs/msg", "client_us_per_msg"),
                ("busiest client, core share", "client_max_core_share"),
                ("broker core share", "broker_core_share"), ("machine busy share", "machine_busy_share")]

INTEGER_KEYS = {"client_processes", "messages"}

#: replicated / unreplicated, same run (issue 3): what replication costs
#: (the same metrics as METRICS; the CPU rows say that they sum the primary and its backups)
REPLICATION_METRICS = [
    Metric(m.label.replace("broker CPU per msg", "broker CPU per msg (all brokers)"), m.phase, m.key,
           m.higher_is_better)
    for m in METRICS
]


@dataclass(frozen=True)
class RatioGoal:
    label: str
    metric: Metric
    bound: float  # the replicated / unreplicated ratio must be >= bound (higher_is_better) or <= bound


REPLICATION_GOALS = [
    RatioGoal("replicated confirmed-publish throughput >= 0.8x unreplicated", REPLICATION_METRICS[0], 0.8),
    RatioGoal("replicated sync-publish p50 <= 1.5x unreplicated", REPLICATION_METRICS[2], 1.5),
]


def _get(row: dict[str, Any], key: str) -> float:
    v: Any = row
    for part in key.split("."):
        if not isinstance(v, dict) or part not in v:
            return math.nan
        v = v[part]
    return float(v)


def summarize(runs: Sequence[dict[str, Any]], keys: Sequence[str]) -> dict[str, dict[str, dict[str, float]]]:
    """{target: {phase: {key: median over repeats}}} for the given keys."""
    grouped: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in runs:
        grouped.setdefault((r["target"], r["phase"]), []).append(r)
    out: dict[str, dict[str, dict[str, float]]] = {}
    for (target, phase), rows in grouped.items():
        out.setdefault(target, {})[phase] = {k: stats.median([_get(r, k) for r in rows]) for k in keys}
    return out


def _fmt(v: float, integer: bool = False) -> str:
    if math.isnan(v):
        return "n/a"
    if integer:
        return f"{v:.0f}"
    if abs(v) >= 100:
        return f"{v:,.0f}"
    if abs(v) >= 10:
        return f"{v:.1f}"
    return f"{v:.2f}"


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def ratio_pairs(targets: Sequence[str], kinds: dict[str, str]) -> list[tuple[str, str]]:
    """(ours, reference) pairs: every understudy target against every RabbitMQ target."""
    ours = [t for t in targets if kinds.get(t) == "understudy"]
    refs = [t for t in targets if kinds.get(t) == "rabbitmq"]
    return [(a, b) for a in ours for b in refs]


def markdown(runs: Sequence[dict[str, Any]], targets: Sequence[str], kinds: dict[str, str],
             catchups: Sequence[dict[str, Any]] = ()) -> str:
    if not runs:  # e.g. --phases catchup
        return catchup_markdown(catchups) if catchups else "no results"
    keys = sorted({m.key for m in METRICS} | {k for _, k in LOADGEN_KEYS})
    summary = summarize(runs, keys)
    pairs = ratio_pairs(targets, kinds)
    present = [t for t in targets if t in summary]
    header = ["metric", *present, *[f"{a} / {b}" for a, b in pairs]]
    rows = []
    for m in METRICS:
        vals = {t: summary.get(t, {}).get(m.phase, {}).get(m.key, math.nan) for t in present}
        ratios = [stats.ratio(vals.get(a, math.nan), vals.get(b, math.nan)) for a, b in pairs]
        rows.append([m.label, *[_fmt(vals[t]) for t in present], *[_fmt(r) for r in ratios]])
    parts = [_table(header, rows),
             "",
             "Ratios are ours / RabbitMQ: above 1 is better for msg/s, below 1 is better for ms and µs.",
             "",
             "Load generator (medians):",
             "",
             _loadgen_table(summary, present)]
    goals = goal_lines(summary, kinds)
    if goals:
        parts += ["", *goals]
    repl = replication_markdown(summary, present, kinds)
    if repl:
        parts += ["", repl]
    if catchups:
        parts += ["", catchup_markdown(catchups)]
    return "\n".join(parts)


def replicated_targets(targets: Sequence[str], kinds: dict[str, str], unreplicated: str = "ours") -> list[str]:
    return [t for t in targets if kinds.get(t) == "understudy" and t != unreplicated]


def replication_markdown(summary: dict[str, dict[str, dict[str, float]]], targets: Sequence[str],
                         kinds: dict[str, str], unreplicated: str = "ours") -> str:
    """Replicated targets against the unreplicated broker of the same run: values, ratios, goal verdicts."""
    repl = [t for t in replicated_targets(targets, kinds, unreplicated) if t in summary]
    if unreplicated not in summary or not repl:
        return ""
    cols = [unreplicated, *repl]
    rows = []
    for m in REPLICATION_METRICS:
        vals = {t: summary[t].get(m.phase, {}).get(m.key, math.nan) for t in cols}
        rows.append([m.label, *[_fmt(vals[t]) for t in cols],
                     *[_fmt(stats.ratio(vals[t], vals[unreplicated])) for t in repl]])
    table = _table(["metric", *cols, *[f"{t} / {unreplicated}" for t in repl]], rows)
    return "\n".join(["Replication cost (replicated / unreplicated, same run; CPU summed over primary and backups):",
                      "", table, "", *replication_goal_lines(summary, repl, unreplicated)])


def replication_goal_lines(summary: dict[str, dict[str, dict[str, float]]], replicated: Sequence[str],
                           unreplicated: str = "ours") -> list[str]:
    out = []
    for g in REPLICATION_GOALS:
        base = summary.get(unreplicated, {}).get(g.metric.phase, {}).get(g.metric.key, math.nan)
        for t in replicated:
            v = summary.get(t, {}).get(g.metric.phase, {}).get(g.metric.key, math.nan)
            r = stats.ratio(v, base)
            met = (r >= g.bound) if g.metric.higher_is_better else (r <= g.bound)
            verdict = "n/a" if math.isnan(r) else ("met" if met else "NOT met")
            out.append(f"- Goal {g.label}: {t} {_fmt(v)} vs {_fmt(base)} -> ratio {_fmt(r)} -> {verdict}")
    return out


CATCHUP_COLUMNS = [("messages", "messages"), ("fill msg/s", "fill_rate"),
                   ("backup start -> ready, s", "seconds"), ("of which start-up, s", "startup_seconds"),
                   ("catch-up msg/s", "catchup_rate"), ("broker CPU µs/msg (all brokers)", "broker_us_per_msg"),
                   ("machine busy share", "machine_busy_share"), ("queue delete afterwards, s", "delete_seconds")]


def catchup_markdown(rows: Sequence[dict[str, Any]]) -> str:
    """One row per catch-up run: an empty backup joining a primary that holds `messages` messages."""
    body = [[r["target"], *[_fmt(_get(r, k), integer=k == "messages") for _, k in CATCHUP_COLUMNS],
             "; ".join(r.get("errors") or []) or "-"] for r in rows]
    return "\n".join(["Catch-up (an empty backup joins a primary holding the messages; CPU from its first "
                      "management answer to ready):", "",
                      _table(["target", *[label for label, _ in CATCHUP_COLUMNS], "errors"], body)])


def _loadgen_table(summary: dict[str, dict[str, dict[str, float]]], targets: Sequence[str]) -> str:
    rows = []
    for t in targets:
        for phase in ("publish", "e2e", "latency"):
            v = summary.get(t, {}).get(phase)
            if v:
                rows.append([t, phase, *[_fmt(v[k], integer=k in INTEGER_KEYS) for _, k in LOADGEN_KEYS]])
    return _table(["target", "phase", *[label for label, _ in LOADGEN_KEYS]], rows)


def goal_lines(summary: dict[str, dict[str, dict[str, float]]], kinds: dict[str, str],
               ours: str = "ours", baseline: str = "rabbit-classic") -> list[str]:
    """The two goals of the project, stated against the classic-queue RabbitMQ baseline."""
    if ours not in summary or baseline not in summary:
        return []
    o, b = summary[ours], summary[baseline]
    cpu_o, cpu_b = o.get("e2e", {}).get("broker_us_per_msg", math.nan), b.get("e2e", {}).get("broker_us_per_msg",
                                                                                                  math.nan)
    e2e_o, e2e_b = o.get("e2e", {}).get("rate", math.nan), b.get("e2e", {}).get("rate", math.nan)
    return [
        f"- Goal broker CPU per message (e2e) <= {baseline}: {_fmt(cpu_o)} vs {_fmt(cpu_b)} µs -> "
        f"{'met' if cpu_o <= cpu_b else 'NOT met'} (ratio {_fmt(stats.ratio(cpu_o, cpu_b))})",
        f"- Goal end-to-end throughput >= {baseline}: {_fmt(e2e_o)} vs {_fmt(e2e_b)} msg/s -> "
        f"{'met' if e2e_o >= e2e_b else 'NOT met'} (ratio {_fmt(stats.ratio(e2e_o, e2e_b))})",
    ]
