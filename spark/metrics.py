"""Aggregations over classified events (reader.classify): lag table, catch-up episodes, states, input quality.

Percentiles are exact and weighted: within a group, pX is the smallest lag ``v`` such that the samples with lag <= v
carry at least X% of the group's weight, where a sample's weight is ``1 / sample_rate`` (1 when absent). With all
weights 1 this is numpy's ``percentile(method="inverted_cdf")``. They are computed with a sorted window per group,
which Spark spills to disk, so memory does not grow with the input.
"""

from __future__ import annotations

from typing import Final

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from spark.events import Quality

PERCENTILES: Final = {"p50_ms": 0.50, "p95_ms": 0.95, "p99_ms": 0.99}
LAG_KEYS: Final = ("hour", "queue", "backup")
PERCENTILE_METHOD: Final = (
    "exact weighted percentiles (inverted CDF; each sample weighted by 1/sample_rate), "
    "equal to numpy.percentile(method='inverted_cdf', weights=1/sample_rate)"
)


def ok_events(events: DataFrame, *names: str) -> DataFrame:
    return events.where((F.col("quality") == Quality.OK.value) & F.col("event").isin(*names))


def lag_hourly(events: DataFrame) -> DataFrame:
    """Per (hour, queue, backup): samples, estimated acks, weighted p50/p95/p99, max and mean lag, backlog peak."""
    samples = ok_events(events, "ha.lag").select(*LAG_KEYS, "lag", "weight", "backlog")
    group = Window.partitionBy(*LAG_KEYS)
    running = group.orderBy("lag").rowsBetween(Window.unboundedPreceding, Window.currentRow)
    ranked = samples.withColumn("cdf", F.sum("weight").over(running) / F.sum("weight").over(group))
    percentiles = [F.min(F.when(F.col("cdf") >= q, F.col("lag"))).alias(name) for name, q in PERCENTILES.items()]
    return (
        ranked.groupBy(*LAG_KEYS)
        .agg(
            F.count(F.lit(1)).alias("samples"),
            F.round(F.sum("weight")).cast("long").alias("acks_estimated"),
            *percentiles,
            F.max("lag").alias("max_ms"),
            (F.sum(F.col("lag") * F.col("weight")) / F.sum("weight")).alias("mean_ms"),
            F.max("backlog").alias("backlog_peak"),
        )
        .orderBy(*LAG_KEYS)
    )


def catchup_episodes(events: DataFrame) -> DataFrame:
    """Pair ha.catchup.start/end per (observer, backup, queue).

    Both the primary and the backup may log an episode; the primary's view is kept when it exists. An episode with
    no end in range is ``unfinished``; an end without a start is ``end_only`` (start derived from ``seconds``).
    """
    marks = ok_events(events, "ha.catchup.start", "ha.catchup.end").select(
        F.col("broker").alias("observer"),
        "backup",
        "queue",
        "ts",
        "event",
        "messages",
        "seconds",
        F.when(F.col("event") == "ha.catchup.start", 0).otherwise(1).alias("order"),
    )
    series = Window.partitionBy("observer", "backup", "queue").orderBy("ts", "order")
    linked = marks.select(
        "*",
        F.lead("event").over(series).alias("next_event"),
        F.lead("ts").over(series).alias("next_ts"),
        F.lead("messages").over(series).alias("next_messages"),
        F.lead("seconds").over(series).alias("next_seconds"),
        F.lag("event").over(series).alias("prev_event"),
    )
    is_start = F.col("event") == "ha.catchup.start"
    paired = is_start & (F.col("next_event") == "ha.catchup.end")
    orphan_end = ~is_start & F.coalesce(F.col("prev_event") != "ha.catchup.start", F.lit(True))
    elapsed = _seconds_between(F.col("ts"), F.col("next_ts"))
    episodes = linked.where(is_start | orphan_end).select(
        "observer",
        F.when(F.col("observer") == F.col("backup"), "backup").otherwise("primary").alias("observer_role"),
        "backup",
        "queue",
        F.when(is_start, F.col("ts"))
        .otherwise(F.timestamp_micros(F.unix_micros("ts") - (F.coalesce("seconds", F.lit(0.0)) * 1e6).cast("long")))
        .alias("start"),
        F.when(paired, F.col("next_ts")).when(~is_start, F.col("ts")).alias("end"),
        F.when(is_start, F.col("messages")).alias("messages_to_send"),
        F.when(paired, F.col("next_messages")).when(~is_start, F.col("messages")).alias("messages_sent"),
        F.when(paired, F.coalesce("next_seconds", elapsed)).when(~is_start, F.col("seconds")).alias("seconds"),
        F.when(paired, "completed").when(is_start, "unfinished").otherwise("end_only").alias("status"),
    )
    per_pair = Window.partitionBy("backup", "queue")
    has_primary_view = F.max((F.col("observer_role") == "primary").cast("int")).over(per_pair) == 1
    return (
        episodes.withColumn("has_primary_view", has_primary_view)
        .where((F.col("observer_role") == "primary") | ~F.col("has_primary_view"))
        .drop("has_primary_view")
        .orderBy("start", "backup", "queue")
    )


def state_timeline(events: DataFrame) -> DataFrame:
    """Per broker, each ha.state transition and how long the state it entered lasted (until the next one, or
    until the broker's last event in range)."""
    states = ok_events(events, "ha.state").select(
        "broker", F.col("ts").alias("since"), "from_state", "to_state", "role", "epoch", "reason"
    )
    per_broker = Window.partitionBy("broker").orderBy("since")
    # The last state lasts until the broker's last log line in range (a crashed broker logs no final transition).
    last_seen = (
        events.where(F.col("quality") == Quality.OK.value).groupBy("broker").agg(F.max("ts").alias("last_seen"))
    )
    until = F.coalesce(F.lead("since").over(per_broker), F.col("last_seen"))
    return (
        states.join(last_seen, "broker", "left")
        .withColumn("until", until)
        .drop("last_seen")
        .withColumn("seconds", _seconds_between(F.col("since"), F.col("until")))
        .orderBy("broker", "since")
    )


def input_quality(events: DataFrame) -> DataFrame:
    """Line counts per (quality, event); event is null for lines that had none."""
    return events.groupBy("quality", "event").agg(F.count(F.lit(1)).alias("lines")).orderBy("quality", "event")


def bad_files(events: DataFrame, limit: int = 10) -> DataFrame:
    """Files holding the most bad lines (malformed JSON, missing fields, unknown events, negative lag)."""
    bad = events.where(~F.col("quality").isin(Quality.OK.value, Quality.OUT_OF_RANGE.value))
    return (
        bad.groupBy("file").agg(F.count(F.lit(1)).alias("bad_lines")).orderBy(F.desc("bad_lines")).limit(limit)
    )


def _seconds_between(start: Column, end: Column) -> Column:
    return (F.unix_micros(end) - F.unix_micros(start)) / 1e6
