"""Aggregations over classified events (reader.classify): the digest, lag table, catch-up episodes, states, input
quality.

The input is read once: ``digest`` aggregates every line into what the report needs (counts per quality, event
and bad file; valid lag samples per distinct lag value; the few other valid events whole), and everything else is
computed from the cached digest, which is small whatever the input size (its lag part has at most one row per
broker, hour, queue, backup and distinct lag value).

Percentiles are exact and weighted: within a group, pX is the smallest lag ``v`` such that the samples with lag <= v
carry at least X% of the group's weight, where a sample's weight is ``1 / sample_rate`` (1 when absent). With all
weights 1 this is numpy's ``percentile(method="inverted_cdf")``. They are computed with a sorted window per group
over the digest's distinct lag values (each carrying the summed weight of its samples), which Spark spills to disk,
so memory does not grow with the input.
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
# Fields of the valid events other than ha.lag that the catch-up, state and failover tables read.
RARE_FIELDS: Final = (
    "ts", "queue", "backup", "primary", "role", "from_state", "to_state", "reason", "timed_out", "seconds",
    "waited_seconds", "first_ts", "last_ts", "epoch", "messages", "forced",
)
_OK, _OUT = Quality.OK.value, Quality.OUT_OF_RANGE.value


def digest(events: DataFrame) -> DataFrame:
    """One aggregation over every classified line (one scan of the input).

    Rows of three kinds, told apart by which columns are set:
    - ``lag`` set: valid ``ha.lag`` samples of one (broker, hour, queue, backup, lag value): ``lines``, summed
      ``weight``, ``backlog`` peak;
    - ``rare`` set: one other valid event, whole (a struct of ``RARE_FIELDS``), keyed by a unique ``rare_id``;
    - neither: a count of lines per (quality, event), per ``file`` for bad lines.
    Every row has ``quality``, ``event`` and ``lines``; ``last_ts`` is the latest ``ts`` of its valid lines.
    """
    ok = F.col("quality") == _OK
    bad = ~F.col("quality").isin(_OK, _OUT)
    is_lag = ok & (F.col("event") == "ha.lag")
    is_rare = ok & (F.col("event") != "ha.lag")
    return (
        events.groupBy(
            "quality",
            "event",
            F.when(bad, F.col("file")).alias("file"),
            F.when(ok, F.col("broker")).alias("broker"),
            *[F.when(is_lag, F.col(c)).alias(c) for c in (*LAG_KEYS, "lag")],
            # Keeps identical rare lines apart; a number, not the event itself, is the key: cheaper to hash.
            F.when(is_rare, F.monotonically_increasing_id()).alias("rare_id"),
        )
        .agg(
            F.any_value(F.when(is_rare, F.struct(*RARE_FIELDS))).alias("rare"),
            F.count(F.lit(1)).alias("lines"),
            F.sum(F.when(is_lag, F.col("weight"))).alias("weight"),
            F.max(F.when(is_lag, F.col("backlog"))).alias("backlog"),
            F.max(F.when(ok, F.col("ts"))).alias("last_ts"),
        )
    )


def rare_events(digest: DataFrame) -> DataFrame:
    """The valid events other than ha.lag, one row each, with the columns ``ok_events`` callers read."""
    return digest.where(F.col("rare").isNotNull()).select(
        F.lit(_OK).alias("quality"), "event", "broker", *[F.col(f"rare.{c}").alias(c) for c in RARE_FIELDS]
    )


def last_seen(digest: DataFrame) -> DataFrame:
    """Per broker, the ts of its last valid event in range."""
    return digest.where(F.col("broker").isNotNull()).groupBy("broker").agg(F.max("last_ts").alias("last_seen"))


def ok_events(events: DataFrame, *names: str) -> DataFrame:
    return events.where((F.col("quality") == _OK) & F.col("event").isin(*names))


def lag_hourly(digest: DataFrame) -> DataFrame:
    """Per (hour, queue, backup): samples, estimated acks, weighted p50/p95/p99, max and mean lag, backlog peak."""
    samples = digest.where(F.col("lag").isNotNull()).select(*LAG_KEYS, "lag", "lines", "weight", "backlog")
    group = Window.partitionBy(*LAG_KEYS)
    running = group.orderBy("lag").rowsBetween(Window.unboundedPreceding, Window.currentRow)
    ranked = samples.withColumn("cdf", F.sum("weight").over(running) / F.sum("weight").over(group))
    percentiles = [F.min(F.when(F.col("cdf") >= q, F.col("lag"))).alias(name) for name, q in PERCENTILES.items()]
    return (
        ranked.groupBy(*LAG_KEYS)
        .agg(
            F.sum("lines").alias("samples"),
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


def state_timeline(events: DataFrame, last_seen: DataFrame) -> DataFrame:
    """Per broker, each ha.state transition and how long the state it entered lasted (until the next one, or
    until the broker's last event in range: ``last_seen``, a crashed broker logs no final transition)."""
    states = ok_events(events, "ha.state").select(
        "broker", F.col("ts").alias("since"), "from_state", "to_state", "role", "epoch", "reason"
    )
    per_broker = Window.partitionBy("broker").orderBy("since")
    until = F.coalesce(F.lead("since").over(per_broker), F.col("last_seen"))
    return (
        states.join(last_seen, "broker", "left")
        .withColumn("until", until)
        .drop("last_seen")
        .withColumn("seconds", _seconds_between(F.col("since"), F.col("until")))
        .orderBy("broker", "since")
    )


def input_quality(digest: DataFrame) -> DataFrame:
    """Line counts per (quality, event); event is null for lines that had none."""
    return (
        digest.groupBy("quality", "event").agg(F.sum("lines").alias("lines")).orderBy("quality", "event")
    )


def bad_files(digest: DataFrame, limit: int = 10) -> DataFrame:
    """Files holding the most bad lines (malformed JSON, missing fields, unknown events, negative lag)."""
    return (
        digest.where(F.col("file").isNotNull())
        .groupBy("file")
        .agg(F.sum("lines").alias("bad_lines"))
        .orderBy(F.desc("bad_lines"), "file")
        .limit(limit)
    )


def _seconds_between(start: Column, end: Column) -> Column:
    return (F.unix_micros(end) - F.unix_micros(start)) / 1e6
