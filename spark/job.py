"""The report job: read, classify, aggregate on the cluster; bring back only the aggregated tables."""

from __future__ import annotations

import datetime as dt

from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from spark import failover, metrics, reader
from spark.events import Quality
from spark.model import ReportData, Row, Table

# Each task reads about this many splits per core at least: a few per core keep both cores busy to the end.
SPLITS_PER_CORE = 4
# Shuffle partitions per core (unless configured). Only the digest's aggregation shuffles data that grows with the
# input, and it is already much smaller than the input; every later stage works on small tables, where Spark's
# default of 200 partitions made each of ~60 stages cost 1-8 s of task overhead on 2 cores.
SHUFFLE_PARTITIONS_PER_CORE = 2
SPARK_DEFAULT_SHUFFLE_PARTITIONS = "200"


class NoInput(Exception):
    """Nothing to report on: the message says why (exit code 1)."""


def run(spark: SparkSession, uris: list[str], dates: reader.DateRange,
        pattern: str = reader.DEFAULT_PATTERN) -> tuple[ReportData, dict[str, DataFrame]]:
    """Compute the report. Returns the collected report data and the (cached, small) result DataFrames.

    The input is read and parsed once, into the stored digest (metrics.digest); every table comes from it.
    """
    _split_input(spark)
    _size_shuffles(spark)
    events = reader.classify(reader.read_lines(spark, uris, dates, pattern), dates)
    # The one scan of the input. A local checkpoint, not a cache: it also cuts the lineage, so that the ~30 queries
    # below are planned over a stored table rather than over the whole parse and classification each time (the
    # self-joins of the failover table re-resolved that plan for seconds each).
    digest = _stored(metrics.digest(events))
    rare = _stored(metrics.rare_events(digest))
    quality = _cached(metrics.input_quality(digest))
    quality_table = collect_table("input_quality", quality)
    data_rows = sum(r["lines"] for r in quality_table.rows)
    if data_rows == 0:
        raise NoInput(f"no input: no event-log lines in {', '.join(uris)} (files matching {pattern})")
    ok = sum(r["lines"] for r in quality_table.rows if r["quality"] == Quality.OK.value)
    if ok == 0:
        raise NoInput(f"no input: none of the {data_rows} lines read is a valid event dated {dates}")
    failovers, ready = failover.failovers(rare)
    frames = {
        "lag_hourly": _cached(metrics.lag_hourly(digest)),
        "catchup_episodes": _cached(metrics.catchup_episodes(rare)),
        "failovers": _cached(failovers),
        "backups_ready": _cached(ready),
        "state_timeline": _cached(metrics.state_timeline(rare, metrics.last_seen(digest))),
        "input_quality": quality,
        "bad_files": _cached(metrics.bad_files(digest)),
    }
    data = ReportData(
        dates=str(dates),
        inputs=tuple(uris),
        percentile_method=metrics.PERCENTILE_METHOD,
        lag=collect_table("lag_hourly", frames["lag_hourly"]),
        catchups=collect_table("catchup_episodes", frames["catchup_episodes"]),
        failovers=collect_table("failovers", frames["failovers"]),
        backups_ready=collect_table("backups_ready", frames["backups_ready"]),
        states=collect_table("state_timeline", frames["state_timeline"]),
        quality=quality_table,
        bad_files=collect_table("bad_files", frames["bad_files"]),
        generated_at=dt.datetime.now(dt.UTC),
    )
    return data, frames


def _split_input(spark: SparkSession) -> None:
    """Split the input in at least SPLITS_PER_CORE pieces per core (unless configured): with Spark's default, a
    few hundred MB on 2 cores is 3 splits, and the third runs alone."""
    key = "spark.sql.files.minPartitionNum"
    if spark.conf.get(key, None) is None:
        spark.conf.set(key, str(SPLITS_PER_CORE * spark.sparkContext.defaultParallelism))


def _size_shuffles(spark: SparkSession) -> None:
    """spark.sql.shuffle.partitions from the cluster's cores (SHUFFLE_PARTITIONS_PER_CORE), unless configured."""
    key = "spark.sql.shuffle.partitions"
    configured = spark.sparkContext.getConf().contains(key) or spark.conf.get(key) != SPARK_DEFAULT_SHUFFLE_PARTITIONS
    if not configured:
        spark.conf.set(key, str(SHUFFLE_PARTITIONS_PER_CORE * spark.sparkContext.defaultParallelism))


def _stored(frame: DataFrame) -> DataFrame:
    """Compute ``frame`` now and keep it on the executors (memory, spilling to disk), without its lineage."""
    return frame.localCheckpoint(eager=True, storageLevel=StorageLevel.MEMORY_AND_DISK)


def _cached(frame: DataFrame) -> DataFrame:
    return frame.cache()


def collect_table(name: str, frame: DataFrame) -> Table:
    """Collect an *aggregated* frame; timestamps come back as aware UTC datetimes whatever the local zone."""
    timestamps = [f.name for f in frame.schema.fields if isinstance(f.dataType, T.TimestampType)]
    selected = frame.select(
        *[F.unix_micros(c).alias(c) if c in timestamps else F.col(c) for c in frame.columns]
    )
    rows: list[Row] = []
    for row in selected.collect():
        values = row.asDict()
        for c in timestamps:
            if values[c] is not None:
                values[c] = dt.datetime(1970, 1, 1, tzinfo=dt.UTC) + dt.timedelta(microseconds=values[c])
        rows.append(values)
    return Table(name, tuple(frame.columns), tuple(rows))
