"""The report job on real Spark against a synthetic night with known answers."""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pyspark.sql import SparkSession

from spark import generator, job, metrics, reader
from spark.events import Quality
from spark.model import ReportData
from tests.spark.conftest import valid_lag_samples

pytestmark = pytest.mark.spark

SCENARIO = generator.Scenario(lag_samples=6_000, bad_lines=True, partitioned=True, gzipped=True, seed=11)
DAY = SCENARIO.day


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, generator.Truth]:
    root = tmp_path_factory.mktemp("logs")
    truth = generator.generate(SCENARIO, root)
    # A partition far outside the range, full of garbage: pruning must keep it out of the counts.
    far = root / "date=2026-12-20"
    far.mkdir()
    (far / "b1-0.jsonl").write_text("not json\n" * 50)
    return root, truth


@pytest.fixture(scope="module")
def report(spark: SparkSession, logs: tuple[Path, generator.Truth]) -> ReportData:
    data, _frames = job.run(spark, [str(logs[0])], reader.DateRange(DAY, DAY))
    return data


def expected_lag(root: Path) -> dict[tuple[Any, str, str], dict[str, float]]:
    groups: dict[tuple[Any, str, str], list[dict[str, Any]]] = defaultdict(list)
    for sample in valid_lag_samples(root, DAY):
        groups[(sample["hour"], sample["queue"], sample["backup"])].append(sample)
    expected = {}
    for key, samples in groups.items():
        lags = np.array([s["lag_ms"] for s in samples])
        weights = np.array([1.0 / s.get("sample_rate", 1.0) for s in samples])
        expected[key] = {
            **{
                name: float(np.percentile(lags, q * 100, method="inverted_cdf", weights=weights))
                for name, q in metrics.PERCENTILES.items()
            },
            "unweighted_p95": float(np.percentile(lags, 95, method="inverted_cdf")),
            "max_ms": float(lags.max()),
            "samples": len(samples),
            "acks_estimated": round(float(weights.sum())),
            "backlog_peak": max(s["backlog"] for s in samples),
        }
    return expected


def test_lag_table_matches_independent_weighted_percentiles(report: ReportData, logs: tuple[Path, Any]) -> None:
    expected = expected_lag(logs[0])
    got = {(r["hour"], r["queue"], r["backup"]): r for r in report.lag.rows}
    assert set(got) == set(expected)
    for key, want in expected.items():
        row = got[key]
        for name in (*metrics.PERCENTILES, "max_ms"):
            assert row[name] == pytest.approx(want[name], rel=1e-12), (key, name)
        assert row["samples"] == want["samples"]
        assert row["acks_estimated"] == want["acks_estimated"]
        assert row["backlog_peak"] == want["backlog_peak"]
    # The scenario is built so that weighting changes answers: ignoring sample_rate would fail the loop above.
    assert any(w["p95_ms"] != w["unweighted_p95"] for w in expected.values())


def test_slow_hour_stands_out(report: ReportData) -> None:
    by_hour: dict[int, list[float]] = defaultdict(list)
    for row in report.lag.rows:
        by_hour[row["hour"].hour].append(row["p50_ms"])
    assert min(by_hour[2]) > 2 * max(by_hour[1])


def test_failover_timeline(report: ReportData, logs: tuple[Path, generator.Truth]) -> None:
    want = logs[1].failover
    assert len(report.failovers.rows) == 1
    row = report.failovers.rows[0]
    assert (row["old_primary"], row["new_primary"], row["epoch"]) == (want.old_primary, want.new_primary, want.epoch)
    assert row["primary_lost_at"] == want.primary_lost_at
    assert row["promoted_at"] == want.promoted_at
    assert row["active_at"] == want.active_at
    assert row["outage_seconds"] == pytest.approx(want.outage_seconds, abs=1e-6)
    assert row["overlap"] is False
    assert row["backups_ready"] == len(want.backup_ready_at)
    ready = {r["backup"]: r["ready_at"] for r in report.backups_ready.rows}
    assert ready == want.backup_ready_at


def test_catchup_episodes_use_the_primary_view(report: ReportData, logs: tuple[Path, generator.Truth]) -> None:
    rows = report.catchups.rows
    assert len(rows) == logs[1].catchup_episodes
    assert {r["observer_role"] for r in rows} == {"primary"}
    assert {r["status"] for r in rows} == {"completed"}
    for r in rows:
        assert (r["end"] - r["start"]).total_seconds() == pytest.approx(r["seconds"], abs=1e-6)
    after = [r for r in rows if r["start"] > logs[1].failover.promoted_at]
    assert {(r["observer"], r["backup"]) for r in after} == {("b2", "b3")}


def test_state_timeline_ends_crashed_broker_at_its_last_event(report: ReportData,
                                                              logs: tuple[Path, generator.Truth]) -> None:
    b1 = [r for r in report.states.rows if r["broker"] == "b1"]
    assert [r["to_state"] for r in b1] == ["active"]
    assert b1[0]["until"] < logs[1].failover.primary_lost_at
    b2 = [r["to_state"] for r in report.states.rows if r["broker"] == "b2"]
    assert b2 == ["catchup", "ready", "recovering", "active"]


def test_bad_input_counted_and_pruned_partition_ignored(report: ReportData,
                                                        logs: tuple[Path, generator.Truth]) -> None:
    truth = logs[1]
    assert report.bad_counts() == {q.value: truth.bad.get(q.value, 0) for q in
                                   (Quality.MALFORMED, Quality.MISSING_COMMON, Quality.UNKNOWN_EVENT,
                                    Quality.MISSING_FIELD, Quality.NEGATIVE_LAG)}
    assert report.lines_by_quality()[Quality.OUT_OF_RANGE.value] == truth.out_of_range
    assert report.lines_read == truth.lines - 1  # the one blank line is not an event
    assert report.unknown_event_names() == ["ha.mystery"]
    assert [r["bad_lines"] for r in report.bad_files.rows] == [sum(truth.bad.values())]


def test_range_without_events_is_no_input(spark: SparkSession, logs: tuple[Path, Any]) -> None:
    later = DAY + dt.timedelta(days=3)
    with pytest.raises(job.NoInput, match="no input"):
        job.run(spark, [str(logs[0])], reader.DateRange(later, later))
