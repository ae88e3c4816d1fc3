"""Failover timeline: one row per promotion, plus when each backup became ready again.

A failover is anchored on ``ha.promoted`` (new primary = the broker that logged it). Around it:

- ``primary_lost_at``: first ``ha.primary.lost`` logged by any backup after the previous promotion and at most
  ``LOOKBACK_SECONDS`` before this one; ``old_primary`` is the primary it names (or, without one, the last other
  broker that settled client transfers).
- ``active_at``: the new primary's first ``ha.active`` after the promotion.
- backups ready: each ``ha.backup.ready`` logged by the new primary before the next promotion.
- client-visible outage: from the end of the last ``client.settled`` window of any other broker with a lower epoch
  (``last_ts``) to the start of the new primary's first ``client.settled`` window (``first_ts``). A negative outage
  means two brokers settled client transfers at once: ``overlap`` is set and the report flags it.

Promotions are few, so they are broadcast and joined against the (larger) event tables on time ranges.
"""

from __future__ import annotations

import datetime as dt
from typing import Final

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from spark.metrics import ok_events

LOOKBACK_SECONDS: Final = 600
_FAR_PAST: Final = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_FAR_FUTURE: Final = dt.datetime(9999, 12, 31, tzinfo=dt.UTC)
_PROMO_KEYS: Final = ("epoch", "new_primary", "promoted_at")


def promotions(events: DataFrame) -> DataFrame:
    ordered = Window.orderBy("promoted_at")  # promotions are a handful of rows: one partition is fine
    promos = ok_events(events, "ha.promoted").select(
        "epoch", F.col("broker").alias("new_primary"), F.col("ts").alias("promoted_at"), "forced"
    )
    return F.broadcast(
        promos.withColumns(
            {
                "prev_at": F.coalesce(F.lag("promoted_at").over(ordered), F.lit(_FAR_PAST)),
                "next_at": F.coalesce(F.lead("promoted_at").over(ordered), F.lit(_FAR_FUTURE)),
            }
        )
    )


def backups_ready(events: DataFrame, promos: DataFrame) -> DataFrame:
    """Per promotion and backup: when the new primary reported it ready."""
    ready = ok_events(events, "ha.backup.ready").select(
        F.col("broker").alias("reporter"), "backup", F.col("ts").alias("ready_at"), "seconds"
    )
    joined = promos.join(
        ready,
        (ready.reporter == promos.new_primary)
        & (ready.ready_at >= promos.promoted_at)
        & (ready.ready_at < promos.next_at),
    )
    return (
        joined.groupBy(*_PROMO_KEYS, "backup")
        .agg(F.min("ready_at").alias("ready_at"), F.min_by("seconds", "ready_at").alias("seconds_connected"))
        .withColumn("after_promotion_s", _seconds(F.col("promoted_at"), F.col("ready_at")))
        .orderBy("promoted_at", "ready_at")
    )


def failovers(events: DataFrame) -> tuple[DataFrame, DataFrame]:
    """(failover timeline, backups ready per failover)."""
    promos = promotions(events)
    lost = ok_events(events, "ha.primary.lost").select(F.col("ts").alias("lost_at"), "primary")
    lost_agg = (
        promos.join(
            lost,
            (lost.lost_at <= promos.promoted_at)
            & (lost.lost_at > promos.prev_at)
            & (lost.lost_at >= promos.promoted_at - F.expr(f"INTERVAL {LOOKBACK_SECONDS} SECONDS")),
        )
        .groupBy(*_PROMO_KEYS)
        .agg(F.min("lost_at").alias("primary_lost_at"), F.min_by("primary", "lost_at").alias("lost_primary"))
    )
    active = ok_events(events, "ha.active").select(
        F.col("broker").alias("reporter"), F.col("ts").alias("active_at"), "waited_seconds", "timed_out"
    )
    active_agg = (
        promos.join(
            active,
            (active.reporter == promos.new_primary)
            & (active.active_at >= promos.promoted_at)
            & (active.active_at < promos.next_at),
        )
        .groupBy(*_PROMO_KEYS)
        .agg(
            F.min("active_at").alias("active_at"),
            F.min_by("waited_seconds", "active_at").alias("waited_seconds"),
            F.min_by("timed_out", "active_at").alias("timed_out"),
        )
    )
    settled = ok_events(events, "client.settled").select(
        F.col("broker").alias("settler"),
        F.col("ts").alias("settled_logged_at"),
        F.col("epoch").alias("settle_epoch"),
        "first_ts",
        "last_ts",
    )
    old_settle = (
        promos.join(
            settled,
            (settled.settler != promos.new_primary)
            & (settled.settled_logged_at > promos.prev_at)
            & (settled.settled_logged_at < promos.next_at)
            & F.coalesce(settled.settle_epoch < promos.epoch, F.lit(True)),
        )
        .groupBy(*_PROMO_KEYS)
        .agg(F.max("last_ts").alias("last_old_ts"), F.max_by("settler", "last_ts").alias("settled_primary"))
    )
    new_settle = (
        promos.join(
            settled,
            (settled.settler == promos.new_primary)
            & (settled.settled_logged_at >= promos.promoted_at)
            & (settled.settled_logged_at < promos.next_at),
        )
        .groupBy(*_PROMO_KEYS)
        .agg(F.min("first_ts").alias("first_new_ts"))
    )
    ready = backups_ready(events, promos)
    ready_agg = ready.groupBy(*_PROMO_KEYS).agg(
        F.max("ready_at").alias("all_backups_ready_at"), F.count(F.lit(1)).alias("backups_ready")
    )
    timeline = promos.select(*_PROMO_KEYS, "forced")
    for part in (lost_agg, active_agg, old_settle, new_settle, ready_agg):
        timeline = timeline.join(part, list(_PROMO_KEYS), "left")
    outage = F.col("first_new_ts") - F.col("last_old_ts")
    timeline = timeline.select(
        "epoch",
        F.coalesce("lost_primary", "settled_primary").alias("old_primary"),
        "new_primary",
        "forced",
        "primary_lost_at",
        "promoted_at",
        "active_at",
        "waited_seconds",
        "timed_out",
        F.coalesce("backups_ready", F.lit(0)).alias("backups_ready"),
        "all_backups_ready_at",
        F.timestamp_seconds("last_old_ts").alias("last_old_settle_at"),
        F.timestamp_seconds("first_new_ts").alias("first_new_settle_at"),
        outage.alias("outage_seconds"),
        (outage < 0).alias("overlap"),
        _seconds(F.col("primary_lost_at"), F.col("promoted_at")).alias("detection_seconds"),
    ).orderBy("promoted_at")
    return timeline, ready


def _seconds(start: Column, end: Column) -> Column:
    return (F.unix_micros(end) - F.unix_micros(start)) / 1e6
