"""One self-contained HTML page: summary, plots as embedded PNG (base64), tables. No external resources."""

from __future__ import annotations

import base64
import datetime as dt
import html
from typing import Any, Final

from spark import plots, summary
from spark.events import Quality
from spark.model import ReportData, Table

MAX_LAG_ROWS: Final = 200  # the full table is in lag_hourly.csv / Parquet

_CSS = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; max-width: 1200px; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 2em; border-bottom: 1px solid #ccc; }
table { border-collapse: collapse; font-size: 0.85em; margin: 0.5em 0; }
th, td { border: 1px solid #ddd; padding: 2px 6px; text-align: right; }
th { background: #f0f0f0; } td.text { text-align: left; }
.bad { color: #b00020; font-weight: bold; } .note { color: #555; font-size: 0.9em; }
img.plot { max-width: 100%; border: 1px solid #eee; }
pre { background: #f7f7f7; padding: 1em; white-space: pre-wrap; }
"""


def render(data: ReportData) -> str:
    images = {
        "Lag percentiles per hour, per queue and backup": plots.lag_percentiles(data),
        "Catch-up durations": plots.catchup_durations(data),
        "Broker states and failovers": plots.state_timeline(data),
    }
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>Replication lag {html.escape(data.dates)}</title><style>{_CSS}</style></head><body>",
        f"<h1>Replication-lag report: {html.escape(data.dates)} (UTC)</h1>",
        f'<p class="note">Generated {summary.fmt_time(data.generated_at)} from '
        f"{html.escape(', '.join(data.inputs))}. Percentiles: {html.escape(data.percentile_method)}.</p>",
        f"<pre>{html.escape(summary.render(data))}</pre>",
        _quality_section(data),
        "<h2>Failovers</h2>",
        _failover_warnings(data),
        _table(data.failovers),
        "<h3>Backups ready again after each failover</h3>",
        _table(data.backups_ready),
    ]
    for title, png in images.items():
        parts.append(f"<h2>{html.escape(title)}</h2>")
        if png is None:
            parts.append('<p class="note">No data for this plot.</p>')
        else:
            encoded = base64.b64encode(png).decode("ascii")
            parts.append(f'<img class="plot" alt="{html.escape(title)}" src="data:image/png;base64,{encoded}">')
    worst = sorted(data.lag.rows, key=lambda r: -r["p99_ms"])[:MAX_LAG_ROWS]
    parts += [
        "<h2>Lag per hour, queue and backup</h2>",
        f'<p class="note">{len(data.lag)} rows; the {len(worst)} with the highest p99 are shown (all rows: '
        "lag_hourly.csv). samples = logged ha.lag lines; acks_estimated = sum of 1/sample_rate.</p>",
        _table(Table(data.lag.name, data.lag.columns, tuple(worst))),
        "<h2>Catch-up episodes</h2>",
        _table(data.catchups),
        "<h2>Broker state timeline</h2>",
        _table(data.states),
        "</body></html>",
    ]
    return "\n".join(parts)


def _quality_section(data: ReportData) -> str:
    bad = data.bad_counts()
    total_bad = sum(bad.values())
    cls = "bad" if total_bad else ""
    items = "".join(f"<li>{html.escape(k)}: <b>{v}</b></li>" for k, v in bad.items())
    out_of_range = data.lines_by_quality().get(Quality.OUT_OF_RANGE.value, 0)
    return (
        f'<h2>Input quality</h2><p class="{cls}">{total_bad} bad line(s) of {data.lines_read} read '
        f"(excluded from the statistics); {out_of_range} valid line(s) outside the date range skipped.</p>"
        f"<ul>{items}</ul>{_table(data.quality)}"
        + (f"<h3>Files with bad lines</h3>{_table(data.bad_files)}" if data.bad_files.rows else "")
    )


def _failover_warnings(data: ReportData) -> str:
    overlaps = [r for r in data.failovers.rows if r["overlap"]]
    if not overlaps:
        return ""
    return "".join(
        f'<p class="bad">Two brokers settled client transfers at once around {summary.fmt_time(r["promoted_at"])}'
        f" (old primary {html.escape(str(r['old_primary']))}, new {html.escape(r['new_primary'])}).</p>"
        for r in overlaps
    )


def _table(table: Table) -> str:
    if not table.rows:
        return '<p class="note">None.</p>'
    head = "".join(f"<th>{html.escape(c)}</th>" for c in table.columns)
    body = []
    for row in table.rows:
        cells = "".join(_cell(row[c]) for c in table.columns)
        body.append(f"<tr>{cells}</tr>")
    return f'<table data-name="{html.escape(table.name)}"><tr>{head}</tr>{"".join(body)}</table>'


def _cell(value: Any) -> str:
    if isinstance(value, dt.datetime):
        return f"<td>{summary.fmt_time(value)}</td>"
    if isinstance(value, float):
        return f"<td>{value:.3f}</td>"
    if value is None:
        return "<td></td>"
    if isinstance(value, bool | int):
        return f"<td>{value}</td>"
    return f'<td class="text">{html.escape(str(value))}</td>'
