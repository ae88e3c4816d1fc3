"""Fixtures for the lag-report tests: one real local Spark session per test module, synthetic logs."""

from __future__ import annotations

import datetime as dt
import gzip
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")

from pyspark.sql import SparkSession

from spark import reader

TEST_CONF = {
    "spark.ui.enabled": "false",
    "spark.sql.shuffle.partitions": "4",
    "spark.ui.showConsoleProgress": "false",
    "spark.driver.memory": "1g",
}


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    session = reader.build_session("local[2]", "understudy-tests", TEST_CONF)
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


def read_log_lines(root: Path) -> Iterator[str]:
    """Every line of every log file under root, plain or gzipped (independent of the job's reader)."""
    for path in sorted(root.rglob("*")):
        if not path.is_file():
            continue
        opener: Any = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rt", encoding="utf-8") as handle:
            yield from (line.rstrip("\n") for line in handle)


def valid_lag_samples(root: Path, day: dt.date) -> list[dict[str, Any]]:
    """ha.lag samples a correct report must use: well-formed, on ``day``, non-negative lag."""
    samples = []
    for line in read_log_lines(root):
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if not isinstance(record, dict) or record.get("event") != "ha.lag":
            continue
        try:
            ts = dt.datetime.strptime(record["ts"], "%Y-%m-%dT%H:%M:%S.%fZ")
        except (KeyError, ValueError):
            continue
        lag = record.get("lag_ms")
        if ts.date() != day or not record.get("queue") or not record.get("backup"):
            continue
        if not isinstance(lag, int | float) or lag < 0 or record.get("broker") is None:
            continue
        samples.append({**record, "hour": ts.replace(minute=0, second=0, microsecond=0, tzinfo=dt.UTC)})
    return samples
