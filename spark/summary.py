"""The short text summary printed on stdout (and written as summary.txt)."""

from __future__ import annotations

import datetime as dt

from spark.events import Quality
from spark.model import ReportData, Row


def fmt_time(value: dt.datetime | None) -> str:
    if value is None:
        return "-"
    text = value.strftime("%Y-%m-%d %H:%M:%S.%f").rstrip("0").rstrip(".")
    return text + "Z"


def fmt_seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} s"


def failover_line(row: Row) -> str:
    outage = row["outage_seconds"]
    text = (
        f"{fmt_time(row['promoted_at'])} {row['old_primary'] or '?'} -> {row['new_primary']} (epoch {row['epoch']}"
        f"{', forced' if row['forced'] else ''}): primary lost {fmt_time(row['primary_lost_at'])}, "
        f"active {fmt_time(row['active_at'])}, {row['backups_ready']} backup(s) ready by "
        f"{fmt_time(row['all_backups_ready_at'])}, client-visible outage {fmt_seconds(outage)}"
    )
    if row["overlap"]:
        text += "  WARNING: two brokers settled client transfers at the same time"
    return text


def render(data: ReportData) -> str:
    counts = data.lines_by_quality()
    bad = data.bad_counts()
    lines = [
        f"Replication-lag report for {data.dates} (UTC) from {', '.join(data.inputs)}",
        f"input: {data.lines_read} lines, {data.ok_events} valid events; bad input: "
        + ", ".join(f"{k}={v}" for k, v in bad.items())
        + f"; outside the date range: {counts.get(Quality.OUT_OF_RANGE.value, 0)}",
    ]
    if data.unknown_event_names():
        lines.append(f"unknown event types: {', '.join(data.unknown_event_names())}")
    lines.append(_lag_line(data))
    lines.append(_catchup_line(data))
    lines.append(f"failovers: {len(data.failovers)}")
    lines.extend("  " + failover_line(row) for row in data.failovers.rows)
    lines.append(f"percentiles: {data.percentile_method}")
    return "\n".join(lines)


def _lag_line(data: ReportData) -> str:
    if not data.lag.rows:
        return "lag: no ha.lag samples"
    worst = max(data.lag.rows, key=lambda r: r["p99_ms"])
    peak = max(data.lag.rows, key=lambda r: r["max_ms"])
    queues = {r["queue"] for r in data.lag.rows}
    backups = {r["backup"] for r in data.lag.rows}
    samples = sum(r["samples"] for r in data.lag.rows)
    return (
        f"lag: {samples} samples, {len(queues)} queue(s), {len(backups)} backup(s); worst hourly p99 "
        f"{worst['p99_ms']:.1f} ms ({worst['queue']} -> {worst['backup']}, hour {worst['hour']:%Y-%m-%d %H:00}); "
        f"max {peak['max_ms']:.1f} ms ({peak['queue']} -> {peak['backup']})"
    )


def _catchup_line(data: ReportData) -> str:
    rows = data.catchups.rows
    if not rows:
        return "catch-ups: none"
    unfinished = sum(1 for r in rows if r["status"] != "completed")
    timed = [r for r in rows if r["seconds"] is not None]
    text = f"catch-ups: {len(rows)} episode(s), {unfinished} not completed"
    if timed:
        longest = max(timed, key=lambda r: r["seconds"])
        text += f"; longest {longest['seconds']:.2f} s ({longest['backup']}/{longest['queue']} at " \
                f"{fmt_time(longest['start'])})"
    return text
