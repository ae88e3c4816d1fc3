"""Results -> summary (medians over repeats), the figures table, per-role CPU, RSS, catch-up and the goal verdicts
in markdown. Pure functions."""

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
    Metric("end-to-end latency p50, ms", "e2e", "e2e_latency_ms.p50", False),
    Metric("RAM per queued msg over the body, B", "rss", "overhead_bytes_per_msg", False),
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
    for m in METRICS[:7]
]
LOAD_PHASES = ("publish", "e2e", "latency")
PHASE_LABEL = {"publish": "publish", "e2e": "e2e", "latency": "sync"}


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
    """(ours, reference) pairs: every understudy target against every RabbitMQ target, and the unreplicated
    broker (`ours`) against the proton-C example broker."""
    ours = [t for t in targets if kinds.get(t) == "understudy"]
    refs = [t for t in targets if kinds.get(t) == "rabbitmq"]
    engine = [(a, b) for a in ours if a == "ours" for b in targets if kinds.get(b) == "proton-c"]
    return [(a, b) for a in ours for b in refs] + engine


def markdown(runs: Sequence[dict[str, Any]], targets: Sequence[str], kinds: dict[str, str],
             catchups: Sequence[dict[str, Any]] = (), hop: dict[str, Any] | None = None,
             client: str | None = None, fsync: dict[str, Any] | None = None,
             recoveries: Sequence[dict[str, Any]] = (), memories: Sequence[dict[str, Any]] = ()) -> str:
    durable_part = durable_sections({}, [], fsync, recoveries, memories, client)
    if not runs:  # e.g. --phases catchup
        if not catchups and not recoveries and not memories:
            return "no results"
        parts = [catchup_markdown(catchups)] if catchups else []
        if hop is not None and catchups:
            parts += ["", "Goal verdicts:", "", *verdict_lines(verdicts({}, hop, catchups, client))]
        return "\n".join([*parts, *durable_part])
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
             "Ratios are ours / reference: above 1 is better for msg/s, below 1 is better for ms, µs and B.",
             "RAM per queued msg: (broker RSS after - before filling a fresh queue) / messages - body bytes; "
             "replicated: the largest broker of the set."]
    if hop is not None:
        parts += ["", hop_line(hop)]
    parts += ["",
              f"Load generator{f' ({client} clients)' if client else ''}, medians:",
              "",
              _loadgen_table(summary, present)]
    by_role = role_markdown(runs, present)
    if by_role:
        parts += ["", by_role]
    by_part = part_markdown(runs, present)
    if by_part:
        parts += ["", by_part]
    repl = replication_markdown(summary, present, kinds)
    if repl:
        parts += ["", repl]
    rss_rows = [r for r in runs if r.get("phase") == "rss"]
    if rss_rows:
        parts += ["", rss_markdown(rss_rows)]
    if catchups:
        parts += ["", catchup_markdown(catchups)]
    vs = verdicts(summary, hop, catchups, client)
    durable_part = durable_sections(summary, present, fsync, recoveries, memories, client)
    if durable_part and all(v.status == "not measured" for v in vs):  # a durable-only run: one line, not eleven
        parts += ["", "Goal verdicts (Message path v2): none of their figures were measured in this run."]
    else:
        parts += ["", f"Goal verdicts (same run{f', {client} clients' if client else ''}):", "", *verdict_lines(vs)]
    return "\n".join([*parts, *durable_part])


def hop_line(hop: dict[str, Any]) -> str:
    rtt = hop.get("rtt_us") or {}
    return (f"Loopback one-way hop (same run): {_fmt(float(hop.get('hop_us', math.nan)))} µs = half the median "
            f"round trip of 1-byte TCP messages between two processes (RTT p50 {_fmt(float(rtt.get('p50', math.nan)))}"
            f", p99 {_fmt(float(rtt.get('p99', math.nan)))} µs; {hop.get('method', '?')}, "
            f"{hop.get('samples', 0)} round trips)")


def role_cpu(runs: Sequence[dict[str, Any]]) -> dict[str, dict[str, dict[str, float]]]:
    """{target: {role: {phase: broker CPU µs per message of that role, median over repeats}}}."""
    grouped: dict[tuple[str, str, str], list[float]] = {}
    for r in runs:
        if r.get("phase") not in LOAD_PHASES:
            continue
        n = r.get("messages") or 0
        for role, sec in (r.get("broker_cpu_seconds") or {}).items():
            grouped.setdefault((r["target"], role, r["phase"]), []).append(stats.per_message_us(sec, n))
    out: dict[str, dict[str, dict[str, float]]] = {}
    for (t, role, phase), vals in grouped.items():
        out.setdefault(t, {}).setdefault(role, {})[phase] = stats.median(vals)
    return out


def role_markdown(runs: Sequence[dict[str, Any]], targets: Sequence[str]) -> str:
    per = role_cpu(runs)
    rows = []
    for t in targets:
        for role, phases in per.get(t, {}).items():
            rows.append([t, role, *[_fmt(phases.get(ph, math.nan)) for ph in LOAD_PHASES]])
    if not rows:
        return ""
    return "\n".join(["Broker CPU per message by role, µs (the per-target figures above are the sums):", "",
                       _table(["target", "role", *[PHASE_LABEL[p] for p in LOAD_PHASES]], rows)])


def part_cpu(runs: Sequence[dict[str, Any]]) -> dict[tuple[str, str, str], dict[str, tuple[float, float]]]:
    """{(target, role, part): {phase: (user, system) µs per message, medians over repeats}} (part: the broker's
    event loop, its other threads, its sync process: bench.procstat.thread_parts)."""
    grouped: dict[tuple[str, str, str, str], list[tuple[float, float]]] = {}
    for r in runs:
        if r.get("phase") not in LOAD_PHASES:
            continue
        n = r.get("messages") or 0
        for role, parts in (r.get("broker_thread_seconds") or {}).items():
            for part, (user, system) in parts.items():
                grouped.setdefault((r["target"], role, part, r["phase"]), []).append(
                    (stats.per_message_us(user, n), stats.per_message_us(system, n)))
    out: dict[tuple[str, str, str], dict[str, tuple[float, float]]] = {}
    for (t, role, part, phase), vals in grouped.items():
        out.setdefault((t, role, part), {})[phase] = (stats.median([u for u, _ in vals]),
                                                      stats.median([s for _, s in vals]))
    return out


def part_markdown(runs: Sequence[dict[str, Any]], targets: Sequence[str]) -> str:
    per = part_cpu(runs)
    rows = []
    for t in targets:
        for (target, role, part), phases in per.items():
            if target == t and any(u or s for u, s in phases.values()):  # a part that took no CPU: no row
                rows.append([t, role, part, *[_fmt(phases[ph][0]) + " + " + _fmt(phases[ph][1]) if ph in phases
                                             else "n/a" for ph in LOAD_PHASES]])
    if not rows:
        return ""
    return "\n".join(["Broker CPU per message by part, µs, user + system (the event loop is one thread: near a core's "
                       "worth of it per second, it is the limit):", "",
                       _table(["target", "role", "part", *[PHASE_LABEL[p] for p in LOAD_PHASES]], rows)])


def rss_markdown(rows: Sequence[dict[str, Any]]) -> str:
    body = []
    for r in rows:
        per = r.get("bytes_per_msg") or {}
        body.append([r["target"], _fmt(float(r.get("messages", math.nan)), integer=True),
                     _fmt(float(r.get("size", math.nan)), integer=True),
                     "; ".join(f"{k} {_fmt(float(v))}" for k, v in per.items()) or "n/a",
                     _fmt(_get(r, "overhead_bytes_per_msg")), _fmt(_get(r, "fill_rate")),
                     "; ".join(r.get("errors") or []) or "-"])
    return "\n".join(["RSS per queued message (fresh queue filled right after the target started):", "",
                       _table(["target", "messages", "body B", "RSS B/msg by role", "over the body, B/msg",
                               "fill msg/s", "errors"], body)])


def replicated_targets(targets: Sequence[str], kinds: dict[str, str], unreplicated: str = "ours") -> list[str]:
    return [t for t in targets if kinds.get(t) == "understudy" and t != unreplicated]


def replication_markdown(summary: dict[str, dict[str, dict[str, float]]], targets: Sequence[str],
                         kinds: dict[str, str], unreplicated: str = "ours") -> str:
    """Replicated targets against the unreplicated broker of the same run: values and ratios."""
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
                      "", table])


CATCHUP_COLUMNS = [("messages", "messages"), ("fill msg/s", "fill_rate"),
                   ("backup start -> ready, s", "seconds"), ("of which start-up, s", "startup_seconds"),
                   ("catch-up msg/s", "catchup_rate"), ("broker CPU µs/msg (all brokers)", "broker_us_per_msg"),
                   ("machine busy share", "machine_busy_share"), ("queue delete afterwards, s", "delete_seconds"),
                   ("live publisher msg/s", "publisher_rate"), ("live confirm p99, ms", "publisher_latency_ms.p99")]


def catchup_markdown(rows: Sequence[dict[str, Any]]) -> str:
    """One row per catch-up run: an empty backup joining a primary that holds `messages` messages."""
    body = [[r["target"], *[_fmt(_get(r, k), integer=k == "messages") for _, k in CATCHUP_COLUMNS],
             "; ".join(r.get("errors") or []) or "-"] for r in rows]
    return "\n".join(["Catch-up (an empty backup joins a primary holding the messages; CPU from its first "
                      "management answer to ready; live publisher: a steady publisher on a second queue of the "
                      "primary while the backup catches up, n/a when none ran):", "",
                      _table(["target", *[label for label, _ in CATCHUP_COLUMNS], "errors"], body)])


def _loadgen_table(summary: dict[str, dict[str, dict[str, float]]], targets: Sequence[str]) -> str:
    rows = []
    for t in targets:
        for phase in ("publish", "e2e", "latency"):
            v = summary.get(t, {}).get(phase)
            if v:
                rows.append([t, phase, *[_fmt(v[k], integer=k in INTEGER_KEYS) for _, k in LOADGEN_KEYS]])
    return _table(["target", "phase", *[label for label, _ in LOADGEN_KEYS]], rows)


@dataclass(frozen=True)
class Verdict:
    goal: str
    status: str  # "met" | "NOT met" | "not measured"
    detail: str


def _verdict(goal: str, ok: bool | None, detail: str) -> Verdict:
    return Verdict(goal, "not measured" if ok is None else ("met" if ok else "NOT met"), detail)


def _val(summary: dict[str, dict[str, dict[str, float]]], target: str, phase: str, key: str) -> float:
    v = summary.get(target, {}).get(phase, {}).get(key, math.nan)
    return float(v)


def _ratio_goal(goal: str, summary: dict[str, dict[str, dict[str, float]]], a: str, b: str, phase: str, key: str,
                bound: float, at_least: bool, unit: str) -> Verdict:
    """a's figure / b's figure against `bound` (>= when at_least, else <=); not measured if either is missing."""
    va, vb = _val(summary, a, phase, key), _val(summary, b, phase, key)
    r = stats.ratio(va, vb)
    if math.isnan(r):
        missing = [t for t, v in ((a, va), (b, vb)) if math.isnan(v)]
        return _verdict(goal, None, f"no {phase} figure for {', '.join(missing) or 'the reference'}")
    ok = r >= bound if at_least else r <= bound
    return _verdict(goal, ok, f"{a} {_fmt(va)} vs {b} {_fmt(vb)} {unit} -> {_fmt(r)}x "
                              f"({'>=' if at_least else '<='} {bound:g}x)")


CATCHUP_GOAL_MESSAGES = 1_000_000
CATCHUP_GOAL_SECONDS = 5.0
RAM_GOAL_BYTES = 300.0


def verdicts(summary: dict[str, dict[str, dict[str, float]]], hop: dict[str, Any] | None,
             catchups: Sequence[dict[str, Any]] = (), client: str | None = None) -> list[Verdict]:
    """The goals of "Message path v2", each met / NOT met with its numbers, or not measured in this run."""
    out = [
        _ratio_goal("unreplicated broker CPU/msg <= 3x proton-c-broker (publish)", summary, "ours",
                    "proton-c-broker", "publish", "broker_us_per_msg", 3.0, False, "µs/msg"),
        _ratio_goal("unreplicated broker CPU/msg <= 3x proton-c-broker (e2e)", summary, "ours", "proton-c-broker",
                    "e2e", "broker_us_per_msg", 3.0, False, "µs/msg"),
        _ratio_goal("ours e2e throughput >= 2x rabbit-classic", summary, "ours", "rabbit-classic", "e2e", "rate",
                    2.0, True, "msg/s"),
        _ratio_goal("ours-replicated-1 confirmed publish >= 0.9x ours", summary, "ours-replicated-1", "ours",
                    "publish", "rate", 0.9, True, "msg/s"),
        _ratio_goal("ours-replicated-1 broker CPU/msg, both brokers, <= 1.4x ours (publish)", summary,
                    "ours-replicated-1", "ours", "publish", "broker_us_per_msg", 1.4, False, "µs/msg"),
        _ratio_goal("ours-replicated-2 confirmed publish >= 0.75x ours", summary, "ours-replicated-2", "ours",
                    "publish", "rate", 0.75, True, "msg/s"),
    ]
    hop_us = float((hop or {}).get("hop_us", math.nan))
    base = _val(summary, "ours", "latency", "latency_ms.p50")
    for t in ("ours-replicated-1", "ours-replicated-2"):
        goal = f"{t} sync p50 <= ours p50 + 4 one-way loopback hops"
        v = _val(summary, t, "latency", "latency_ms.p50")
        if math.isnan(v) or math.isnan(base) or math.isnan(hop_us):
            what = "the hop" if math.isnan(hop_us) else ("ours" if math.isnan(base) else t)
            out.append(_verdict(goal, None, f"no sync p50 / hop figure for {what}"))
        else:
            bound = base + 4 * hop_us / 1e3
            out.append(_verdict(goal, v <= bound, f"{_fmt(v)} ms vs {_fmt(base)} + 4 x {_fmt(hop_us)} µs = "
                                                  f"{bound:.3f} ms"))
        if client == "python":
            out.append(_ratio_goal(f"{t} sync p50 <= 1.5x ours (Python clients)", summary, t, "ours", "latency",
                                   "latency_ms.p50", 1.5, False, "ms"))
    out.append(_ratio_goal("ours-replicated-2 e2e >= 1.5x rabbit-quorum-3 e2e", summary, "ours-replicated-2",
                           "rabbit-quorum-3", "e2e", "rate", 1.5, True, "msg/s"))
    out += catchup_verdicts(catchups)
    ram = _val(summary, "ours", "rss", "overhead_bytes_per_msg")
    goal = f"RAM <= payload + {RAM_GOAL_BYTES:.0f} B per queued message (ours)"
    out.append(_verdict(goal, None, "no RSS figure for ours") if math.isnan(ram) else
               _verdict(goal, ram <= RAM_GOAL_BYTES, f"{_fmt(ram)} B over the body per message"))
    return out


def catchup_verdicts(catchups: Sequence[dict[str, Any]]) -> list[Verdict]:
    goal = (f"catch-up of {CATCHUP_GOAL_MESSAGES:,} queued messages <= {CATCHUP_GOAL_SECONDS:g} s while a "
            f"publisher runs")
    rows = [c for c in catchups if int(c.get("messages") or 0) >= CATCHUP_GOAL_MESSAGES]
    live = [c for c in rows if float(c.get("publisher_rate_target") or 0) > 0]
    if not live:
        seen = ", ".join(f"{c['target']} {int(c.get('messages') or 0):,} in {_fmt(_get(c, 'seconds'))} s"
                         + ("" if float(c.get("publisher_rate_target") or 0) > 0 else " without publisher")
                         for c in catchups)
        return [_verdict(goal, None, "no 1M catch-up with a live publisher in this run"
                                    + (f" (measured: {seen})" if seen else ""))]
    out = []
    for c in live:
        sec, err = _get(c, "seconds"), c.get("errors") or []
        ok = None if math.isnan(sec) else (sec <= CATCHUP_GOAL_SECONDS and not err)
        out.append(_verdict(f"{c['target']}: {goal}", ok,
                            f"ready {_fmt(sec)} s after the backup's start (start-up {_fmt(_get(c, 'startup_seconds'))}"
                            f" s), live publisher {_fmt(_get(c, 'publisher_rate'))} msg/s"
                            + (f"; errors: {'; '.join(err)}" if err else "")))
    return out


def verdict_lines(vs: Sequence[Verdict]) -> list[str]:
    return [f"- {v.goal}: **{v.status}** — {v.detail}" for v in vs]


# ---------------------------------------------------------------------------------------------------------------
# The durable store (issue 11): durable targets against their non-durable counterparts, the disk's fsync, recovery,
# the memory bound, and the goal verdicts.

DURABLE_SUFFIX = "-durable"
#: our durable targets whose sync p50 is held against the fsync figure
DURABLE_SYNC_TARGETS = ("ours-durable", "ours-replicated-1-durable", "ours-replicated-2-durable")
DURABLE_PUBLISH_RATIO = 0.8
DURABLE_SYNC_MARGIN_MS = 0.5
DURABLE_E2E_RATIO = 1.5
RECOVERY_GOAL_MESSAGES = 1_000_000
RECOVERY_GOAL_SECONDS = 5.0
MEMORY_GOAL_MESSAGES = 10_000_000
MIB = 1024 * 1024


def durable_pairs(targets: Sequence[str]) -> list[tuple[str, str]]:
    """(durable target, its non-durable counterpart) for each durable target whose counterpart ran too (pure)."""
    return [(t, t.removesuffix(DURABLE_SUFFIX)) for t in targets
            if t.endswith(DURABLE_SUFFIX) and t.removesuffix(DURABLE_SUFFIX) in targets]


def durable_cost_markdown(summary: dict[str, dict[str, dict[str, float]]], targets: Sequence[str]) -> str:
    pairs = [(d, b) for d, b in durable_pairs([t for t in targets if t in summary])]
    if not pairs:
        return ""
    cols = [c for pair in pairs for c in pair]
    rows = []
    for m in REPLICATION_METRICS:
        vals = {t: summary[t].get(m.phase, {}).get(m.key, math.nan) for t in cols}
        rows.append([m.label, *[_fmt(vals[t]) for t in cols], *[_fmt(stats.ratio(vals[d], vals[b])) for d, b in pairs]])
    table = _table(["metric", *cols, *[f"{d} / {b}" for d, b in pairs]], rows)
    return "\n".join(["Durable cost (durable queues and messages / the same target non-durable, same run):", "",
                      table])


def fsync_line(f: dict[str, Any]) -> str:
    return (f"Disk (same run, the brokers' data dirs' file system {f.get('filesystem', '?')}): write + fdatasync of "
            f"{f.get('size', '?')}-byte writes into a zero-filled file (as the journal's segments) p50 "
            f"{_fmt(float(f.get('p50_us', math.nan)))} µs, p99 {_fmt(float(f.get('p99_us', math.nan)))} µs "
            f"({f.get('samples', 0)} writes)"
            + (f"; appending to a file that grows: p50 {_fmt(float(f['append_p50_us']))} µs, p99 "
               f"{_fmt(float(f['append_p99_us']))} µs" if "append_p50_us" in f else "")
            + "".join(f"; {w} writers at once: p50 {_fmt(float(v))} µs"
                      for w, v in (f.get("concurrent_p50_us") or {}).items())
            + (f"; ERROR {f['error']}" if f.get("error") else ""))


RECOVERY_COLUMNS = [("messages", "messages"), ("fill msg/s", "fill_rate"),
                    ("journal.recovered, s", "journal_seconds"), ("recovered messages", "journal_messages"),
                    ("journal MiB", "journal_mib"), ("segments", "journal_segments"),
                    ("process start -> management answer, s", "answer_seconds"), ("depth after", "depth_after")]
RECOVERY_INTEGER = {"messages", "journal_messages", "journal_segments", "depth_after"}


def recovery_markdown(rows: Sequence[dict[str, Any]]) -> str:
    body = []
    for r in rows:
        r = {**r, "journal_mib": float(r.get("journal_bytes", math.nan)) / MIB}
        body.append([r["target"], *[_fmt(_get(r, k), integer=k in RECOVERY_INTEGER) for _, k in RECOVERY_COLUMNS],
                     "; ".join(r.get("errors") or []) or "-"])
    return "\n".join(["Recovery (a queue filled with durable messages, all confirmed; SIGKILL; restart on the same "
                      "data dir):", "",
                      _table(["target", *[label for label, _ in RECOVERY_COLUMNS], "errors"], body)])


def memory_limit(row: dict[str, Any]) -> float:
    """The RSS a bounded broker may reach: bound + its baseline + the stated allowance (bytes) (pure)."""
    return _get(row, "bound") + _get(row, "baseline_rss") + _get(row, "allowance")


def memory_markdown(rows: Sequence[dict[str, Any]]) -> str:
    body = []
    for r in rows:
        mib = {k: _get(r, k) / MIB for k in ("bound", "baseline_rss", "peak_rss", "final_rss", "allowance")}
        body.append([r["target"], _fmt(_get(r, "messages"), integer=True), _fmt(mib["bound"]),
                     _fmt(mib["baseline_rss"]), _fmt(mib["allowance"]), _fmt(memory_limit(r) / MIB),
                     _fmt(mib["peak_rss"]), _fmt(mib["final_rss"]), _fmt(_get(r, "fill_rate")),
                     _fmt(_get(r, "other_outcomes"), integer=True), _fmt(_get(r, "depth_after"), integer=True),
                     "; ".join(r.get("errors") or []) or "-"])
    return "\n".join([f"Memory bound (durable {rows[0].get('size', '?')}-byte messages filled into one durable queue "
                      "of a broker started with --max-memory; RSS of the broker sampled every 0.25 s; MiB):", "",
                      _table(["target", "messages", "--max-memory", "baseline RSS", "allowance",
                              "limit (bound + baseline + allowance)", "peak RSS", "RSS at the end", "fill msg/s",
                              "refused", "depth after", "errors"], body)])


def durable_sections(summary: dict[str, dict[str, dict[str, float]]], targets: Sequence[str],
                     fsync: dict[str, Any] | None, recoveries: Sequence[dict[str, Any]],
                     memories: Sequence[dict[str, Any]], client: str | None) -> list[str]:
    """The durable-store part of the report; nothing when the run had no durable target or phase."""
    durable_ran = any(t.endswith(DURABLE_SUFFIX) for t in targets) or bool(recoveries) or bool(memories)
    if not durable_ran:
        return []
    parts: list[str] = []
    cost = durable_cost_markdown(summary, targets)
    if cost:
        parts += ["", cost]
    if fsync is not None:
        parts += ["", fsync_line(fsync)]
    if recoveries:
        parts += ["", recovery_markdown(recoveries)]
    if memories:
        parts += ["", memory_markdown(memories)]
    parts += ["", f"Goal verdicts, durable store (same run{f', {client} clients' if client else ''}):", "",
              *verdict_lines(durable_verdicts(summary, fsync, recoveries, memories))]
    return parts


def durable_verdicts(summary: dict[str, dict[str, dict[str, float]]], fsync: dict[str, Any] | None,
                     recoveries: Sequence[dict[str, Any]] = (), memories: Sequence[dict[str, Any]] = ()
                     ) -> list[Verdict]:
    """The goals of "Durable store" (issue 11), each met / NOT met with its numbers, or not measured."""
    out = [_ratio_goal(f"durable confirmed publish >= {DURABLE_PUBLISH_RATIO:g}x non-durable, 1 backup", summary,
                       "ours-replicated-1-durable", "ours-replicated-1", "publish", "rate", DURABLE_PUBLISH_RATIO,
                       True, "msg/s")]
    out += durable_sync_verdicts(summary, fsync)
    out.append(_ratio_goal(f"durable, primary + 2 backups, e2e >= {DURABLE_E2E_RATIO:g}x rabbit-quorum-3 "
                           "(durable messages)", summary, "ours-replicated-2-durable", "rabbit-quorum-3-durable",
                           "e2e", "rate", DURABLE_E2E_RATIO, True, "msg/s"))
    out += recovery_verdicts(recoveries)
    out += memory_verdicts(memories)
    return out


def durable_sync_verdicts(summary: dict[str, dict[str, dict[str, float]]], fsync: dict[str, Any] | None
                          ) -> list[Verdict]:
    fs_ms = float((fsync or {}).get("p50_us", math.nan)) / 1e3
    measured = [t for t in DURABLE_SYNC_TARGETS if not math.isnan(_val(summary, t, "latency", "latency_ms.p50"))]
    out = []
    for t in measured or DURABLE_SYNC_TARGETS[:1]:
        goal = f"{t} sync p50 <= fsync p50 + {DURABLE_SYNC_MARGIN_MS:g} ms"
        v = _val(summary, t, "latency", "latency_ms.p50")
        if math.isnan(v) or math.isnan(fs_ms):
            out.append(_verdict(goal, None, f"no {'fsync' if math.isnan(fs_ms) else 'sync p50'} figure for "
                                            f"{'the disk' if math.isnan(fs_ms) else t}"))
            continue
        bound = fs_ms + DURABLE_SYNC_MARGIN_MS
        out.append(_verdict(goal, v <= bound, f"{v:.3f} ms vs {fs_ms:.3f} + {DURABLE_SYNC_MARGIN_MS:g} = "
                                              f"{bound:.3f} ms"))
    return out


def recovery_verdicts(recoveries: Sequence[dict[str, Any]]) -> list[Verdict]:
    goal = f"recovery of {RECOVERY_GOAL_MESSAGES:,} durable messages <= {RECOVERY_GOAL_SECONDS:g} s"
    rows = [r for r in recoveries if int(r.get("messages") or 0) >= RECOVERY_GOAL_MESSAGES]
    if not rows:
        seen = ", ".join(f"{r['target']} {int(r.get('messages') or 0):,} in {_fmt(_get(r, 'journal_seconds'))} s"
                         for r in recoveries)
        return [_verdict(goal, None, f"no recovery of {RECOVERY_GOAL_MESSAGES:,} in this run"
                                    + (f" (measured: {seen})" if seen else ""))]
    out = []
    for r in rows:
        sec, answer, err = _get(r, "journal_seconds"), _get(r, "answer_seconds"), r.get("errors") or []
        ok = None if math.isnan(sec) else (sec <= RECOVERY_GOAL_SECONDS and not err)
        out.append(_verdict(f"{r['target']}: {goal}", ok,
                            f"journal.recovered {_fmt(sec)} s for {int(r.get('journal_messages') or 0):,} messages; "
                            f"process start to management answer {_fmt(answer)} s"
                            + (f"; errors: {'; '.join(err)}" if err else "")))
    return out


def memory_verdicts(memories: Sequence[dict[str, Any]]) -> list[Verdict]:
    """Peak RSS <= bound + baseline + allowance, with every wanted message accepted; the goal needs 10M queued."""
    goal = f"memory bounded with {MEMORY_GOAL_MESSAGES:,} queued (peak RSS <= --max-memory + baseline + allowance)"
    if not memories:
        return [_verdict(goal, None, "no memory phase in this run (--preset full or durable, or --phases memory)")]
    out = []
    for r in memories:
        peak, limit = _get(r, "peak_rss"), memory_limit(r)
        n, wanted, err = int(r.get("messages") or 0), int(r.get("wanted") or 0), r.get("errors") or []
        detail = (f"peak {_fmt(peak / MIB)} MiB vs {_fmt(_get(r, 'bound') / MIB)} + "
                  f"{_fmt(_get(r, 'baseline_rss') / MIB)} + {_fmt(_get(r, 'allowance') / MIB)} = "
                  f"{_fmt(limit / MIB)} MiB with {n:,} of {wanted:,} queued, fill {_fmt(_get(r, 'fill_rate'))} msg/s"
                  + (f"; errors: {'; '.join(err)}" if err else ""))
        bounded = not math.isnan(peak) and peak <= limit
        if n < MEMORY_GOAL_MESSAGES and wanted < MEMORY_GOAL_MESSAGES:
            out.append(_verdict(goal, None, f"only {wanted:,} asked for ({'bounded' if bounded else 'NOT bounded'}"
                                            f" there): {detail}"))
            continue
        out.append(_verdict(f"{r['target']}: {goal}", bounded and n >= wanted and not err, detail))
    return out
