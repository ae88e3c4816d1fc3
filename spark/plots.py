"""PNG plots for the HTML report (matplotlib, Agg backend; pure: report data in, PNG bytes out)."""

from __future__ import annotations

import io
from collections import defaultdict
from typing import Any, Final

import matplotlib
import matplotlib.dates as mdates
import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from spark.model import ReportData, Row

matplotlib.use("Agg")  # no display on report hosts; must precede the first figure

MAX_QUEUES: Final = 8  # lag panels: the queues with the worst p99
MAX_EPISODES: Final = 40
STATE_COLOURS: Final = {
    "joining": "#f4a261",
    "catchup": "#e9c46a",
    "ready": "#2a9d8f",
    "recovering": "#e76f51",
    "active": "#264653",
    "standalone": "#8d99ae",
}
_LINESTYLES: Final = {"p50_ms": "-", "p95_ms": "--", "p99_ms": ":"}


def lag_percentiles(data: ReportData) -> bytes | None:
    """One panel per queue: p50/p95/p99 per backup per hour, log scale, failovers as red lines."""
    by_queue: dict[str, list[Row]] = defaultdict(list)
    for row in data.lag.rows:
        by_queue[row["queue"]].append(row)
    if not by_queue:
        return None
    worst = sorted(by_queue, key=lambda q: -max(r["p99_ms"] for r in by_queue[q]))[:MAX_QUEUES]
    fig, axes = plt.subplots(len(worst), 1, figsize=(10, 2.6 * len(worst) + 0.6), squeeze=False, sharex=True)
    for ax, queue in zip(axes[:, 0], worst, strict=True):
        per_backup: dict[str, list[Row]] = defaultdict(list)
        for row in by_queue[queue]:
            per_backup[row["backup"]].append(row)
        for colour, (backup, rows) in zip(_colours(), sorted(per_backup.items()), strict=False):
            rows.sort(key=lambda r: r["hour"])
            hours = [r["hour"] for r in rows]
            for column, style in _LINESTYLES.items():
                ax.plot(hours, [r[column] for r in rows], style, marker="o", markersize=3, color=colour,
                        label=f"{backup} {column.removesuffix('_ms')}")
        ax.set_yscale("log")
        ax.set_ylabel("lag (ms)")
        ax.set_title(f"queue {queue}", fontsize=10, loc="left")
        _failover_markers(ax, data)
        ax.legend(fontsize=7, ncol=3, loc="upper left")
        ax.grid(alpha=0.3)
    _time_axis(axes[-1, 0])
    return _png(fig)


def catchup_durations(data: ReportData) -> bytes | None:
    """Each catch-up episode as a bar of its duration, in start order, labelled backup/queue."""
    episodes = [r for r in data.catchups.rows if r["seconds"] is not None][:MAX_EPISODES]
    if not episodes:
        return None
    fig, ax = plt.subplots(figsize=(10, 0.3 * len(episodes) + 1.2))
    labels = [f"{r['backup']}/{r['queue']} {r['start']:%H:%M:%S}" for r in episodes]
    colours = ["#2a9d8f" if r["status"] == "completed" else "#e76f51" for r in episodes]
    ax.barh(range(len(episodes)), [r["seconds"] for r in episodes], color=colours)
    ax.set_yticks(range(len(episodes)), labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("catch-up duration (s)")
    ax.grid(axis="x", alpha=0.3)
    return _png(fig)


def state_timeline(data: ReportData) -> bytes | None:
    """Per broker, coloured bands for its HA states; failovers as red lines."""
    per_broker: dict[str, list[Row]] = defaultdict(list)
    for row in data.states.rows:
        per_broker[row["broker"]].append(row)
    if not per_broker:
        return None
    last_seen = max(r["until"] or r["since"] for r in data.states.rows)
    ends = [r["hour"] for r in data.lag.rows]
    horizon = max([last_seen, *ends])
    fig, ax = plt.subplots(figsize=(10, 0.7 * len(per_broker) + 1.5))
    brokers = sorted(per_broker)
    for y, broker in enumerate(brokers):
        for row in per_broker[broker]:
            start = mdates.date2num(row["since"])
            end = mdates.date2num(row["until"] or horizon)
            ax.broken_barh([(start, max(end - start, 1e-6))], (y - 0.35, 0.7),
                           color=STATE_COLOURS.get(row["to_state"], "#adb5bd"))
    ax.set_yticks(range(len(brokers)), brokers)
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in STATE_COLOURS.values()]
    ax.legend(handles, list(STATE_COLOURS), fontsize=7, ncol=len(STATE_COLOURS), loc="upper left",
              bbox_to_anchor=(0, 1.25))
    _failover_markers(ax, data)
    _time_axis(ax)
    return _png(fig)


def _failover_markers(ax: Axes, data: ReportData) -> None:
    for row in data.failovers.rows:
        ax.axvline(row["promoted_at"], color="red", linewidth=1.2, alpha=0.8)
        ax.annotate(f"failover -> {row['new_primary']}", (mdates.date2num(row["promoted_at"]), 1.0),
                    xycoords=("data", "axes fraction"), fontsize=7, color="red", ha="left", va="top")


def _time_axis(ax: Axes) -> None:
    ax.xaxis.set_major_formatter(mdates.DateFormatter("%m-%d %H:%M", tz="UTC"))
    ax.set_xlabel("time (UTC)")


def _colours() -> list[Any]:
    return list(plt.get_cmap("tab10").colors)  # type: ignore[attr-defined]


def _png(fig: Figure) -> bytes:
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=90)
    plt.close(fig)
    return buffer.getvalue()
