"""Fast tests of the pure parts of the lag report (no Spark session): text, HTML, CSV, dates, generator."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest

from spark import generator, outputs, report_html, summary
from spark.model import ReportData, Table
from spark.reader import DateRange, missing_local_input

T0 = dt.datetime(2026, 11, 22, 2, 30, tzinfo=dt.UTC)


def failover_row(**changes: object) -> dict[str, object]:
    row: dict[str, object] = {
        "epoch": 2, "old_primary": "b1", "new_primary": "b2", "forced": False, "primary_lost_at": T0,
        "promoted_at": T0 + dt.timedelta(seconds=1), "active_at": None, "waited_seconds": None, "timed_out": None,
        "backups_ready": 0, "all_backups_ready_at": None, "last_old_settle_at": T0, "first_new_settle_at": T0,
        "outage_seconds": 2.25, "overlap": False, "detection_seconds": 1.0,
    }
    return {**row, **changes}


def report(failovers: tuple[dict[str, object], ...] = (), quality: tuple[dict[str, object], ...] = ()) -> ReportData:
    def empty(name: str, *columns: str) -> Table:
        return Table(name, columns, ())

    return ReportData(
        dates="2026-11-22", inputs=("/logs",), percentile_method="exact",
        lag=empty("lag_hourly", "hour", "queue", "backup", "p99_ms"),
        catchups=empty("catchup_episodes", "backup", "queue", "start", "seconds", "status"),
        failovers=Table("failovers", tuple(failover_row()), failovers),
        backups_ready=empty("backups_ready", "backup"),
        states=empty("state_timeline", "broker"),
        quality=Table("input_quality", ("quality", "event", "lines"), quality),
        bad_files=empty("bad_files", "file", "bad_lines"),
        generated_at=T0,
    )


def test_summary_reports_outage_and_flags_overlap() -> None:
    ok = summary.failover_line(failover_row())
    assert "b1 -> b2 (epoch 2)" in ok and "outage 2.25 s" in ok and "WARNING" not in ok
    bad = summary.failover_line(failover_row(outage_seconds=-0.5, overlap=True))
    assert "WARNING: two brokers settled client transfers at the same time" in bad


def test_summary_lists_every_bad_category_even_when_zero() -> None:
    text = summary.render(report(quality=(
        {"quality": "ok", "event": "ha.lag", "lines": 10},
        {"quality": "unknown_event", "event": "ha.future", "lines": 2},
    )))
    assert "12 lines, 10 valid events" in text
    assert "malformed_json=0" in text and "unknown_event=2" in text and "negative_lag=0" in text
    assert "unknown event types: ha.future" in text
    assert "lag: no ha.lag samples" in text


def test_html_without_data_says_so_and_escapes_values() -> None:
    data = report(failovers=(failover_row(new_primary="<b2>", overlap=True, outage_seconds=-1.0),))
    page = report_html.render(data)
    assert page.count("No data for this plot.") == 3
    assert "&lt;b2&gt;" in page and "<b2>" not in page
    assert "Two brokers settled client transfers at once" in page


def test_csv_uses_utc_iso_times_and_empty_nulls() -> None:
    table = Table("t", ("at", "n", "x"), ({"at": T0, "n": 3, "x": None},))
    assert outputs.table_csv(table).decode() == "at,n,x\n2026-11-22T02:30:00.000000Z,3,\n"


def test_date_range() -> None:
    days = DateRange(dt.date(2026, 11, 22), dt.date(2026, 11, 23))
    assert days.end - days.start == dt.timedelta(days=2)
    assert str(days) == "2026-11-22 .. 2026-11-23"
    with pytest.raises(ValueError, match="before"):
        DateRange(dt.date(2026, 11, 22), dt.date(2026, 11, 21))


def test_missing_local_input(tmp_path: Path) -> None:
    assert missing_local_input([str(tmp_path)]) is not None  # empty directory
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b1.log").write_text("{}\n")
    assert missing_local_input([str(tmp_path)]) is None
    assert missing_local_input([f"file://{tmp_path}/sub/*.log"]) is None
    assert missing_local_input(["hdfs://nn/logs"]) is None  # Spark checks remote URIs


def test_generator_writes_valid_json_lines_and_its_bad_lines(tmp_path: Path) -> None:
    truth = generator.generate(generator.Scenario(lag_samples=200, bad_lines=True, hours=1), tmp_path)
    lines = [line for path in tmp_path.glob("*.jsonl") for line in path.read_text().splitlines()]
    assert len(lines) == truth.lines
    parsed = 0
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        parsed += isinstance(record, dict)
    # 3 malformed lines (one of them a JSON array) and one blank line do not parse as objects
    assert parsed == truth.lines - truth.bad["malformed_json"] - 1
    assert truth.failover.outage_seconds == pytest.approx(4.5)
    assert generator.sample_rate_at(10) == 0.25 and generator.sample_rate_at(15) == 0.5
