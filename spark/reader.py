"""Read event-log lines from any Hadoop-compatible location and classify every line.

Nothing here collects rows to the driver: the result is a lazy DataFrame with one row per input line, a ``quality``
column (see ``events.Quality``) and typed fields.
"""

from __future__ import annotations

import datetime as dt
import glob
import os
from dataclasses import dataclass
from functools import reduce
from urllib.parse import urlparse

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from spark import events
from spark.events import Quality

# Files the job reads inside a directory (Hadoop glob syntax, matched against the file name).
DEFAULT_PATTERN = "*.{log,jsonl,json,log.gz,jsonl.gz,json.gz}"
# Logs laid out as .../date=YYYY-MM-DD/... get this partition column from Spark and are pruned on it.
PARTITION_COLUMN = "date"
# A date partition holds the lines its writer rotated into it, which may straddle midnight (local time rotation,
# late flush): read one extra day each side and filter on ``ts`` exactly.
PARTITION_MARGIN = dt.timedelta(days=1)

_RAW_SCHEMA = T.StructType(
    [T.StructField(name, T.StringType()) for name in events.ALL_FIELDS]
    + [T.StructField(events.CORRUPT_COLUMN, T.StringType())]
)


@dataclass(frozen=True)
class DateRange:
    """Inclusive range of UTC days."""

    first: dt.date
    last: dt.date

    def __post_init__(self) -> None:
        if self.last < self.first:
            raise ValueError(f"--until {self.last} is before --date {self.first}")

    @property
    def start(self) -> dt.datetime:
        return dt.datetime.combine(self.first, dt.time(), tzinfo=dt.UTC)

    @property
    def end(self) -> dt.datetime:
        """Exclusive end instant."""
        return dt.datetime.combine(self.last + dt.timedelta(days=1), dt.time(), tzinfo=dt.UTC)

    def __str__(self) -> str:
        return str(self.first) if self.first == self.last else f"{self.first} .. {self.last}"


def is_local(uri: str) -> bool:
    return urlparse(uri).scheme in ("", "file")


def missing_local_input(uris: list[str]) -> str | None:
    """For local paths, explain (without starting Spark) when no file exists; None when input may exist.

    Remote URIs (hdfs://, s3a://, ...) are checked by Spark itself.
    """
    for uri in uris:
        if not is_local(uri):
            return None
        matches = glob.glob(urlparse(uri).path)
        if any(os.path.isfile(m) or _dir_has_files(m) for m in matches):
            return None
    return f"no input: no files at {', '.join(uris)}"


def _dir_has_files(path: str) -> bool:
    return any(files for _root, _dirs, files in os.walk(path))


def read_lines(spark: SparkSession, uris: list[str], dates: DateRange, pattern: str = DEFAULT_PATTERN) -> DataFrame:
    """Raw lines (``value``) with the file they came from, pruned to the date partitions that can hold ``dates``."""
    lines = spark.read.option("pathGlobFilter", pattern).text(uris)
    if PARTITION_COLUMN in lines.columns:
        part = F.col(PARTITION_COLUMN).cast("string")
        lines = lines.where(
            part.between(str(dates.first - PARTITION_MARGIN), str(dates.last + PARTITION_MARGIN))
        )
    return lines.select("value", F.col("_metadata.file_path").alias("file"))


def classify(lines: DataFrame, dates: DateRange) -> DataFrame:
    """One row per non-blank line: ``quality``, ``file``, common fields, typed extra fields, ``lag``, ``weight``."""
    raw = F.from_json("value", _RAW_SCHEMA, {"columnNameOfCorruptRecord": events.CORRUPT_COLUMN})
    parsed = lines.where(F.trim("value") != "").select("file", raw.alias("j"))
    typed = parsed.select(
        "file",
        F.col(f"j.{events.CORRUPT_COLUMN}").isNotNull().alias("malformed"),
        F.try_to_timestamp("j.ts").alias("ts"),
        *[F.col(f"j.{name}").alias(name) for name in ("level", "event", "broker", *events.STRING_FIELDS)],
        *[F.col(f"j.{name}").try_cast("double").alias(name) for name in events.DOUBLE_FIELDS],
        *[F.col(f"j.{name}").try_cast("long").alias(name) for name in events.LONG_FIELDS],
        *[F.col(f"j.{name}").try_cast("boolean").alias(name) for name in events.BOOLEAN_FIELDS],
    )
    lag = F.coalesce(F.col("lag_ms"), (F.col("ack_ts") - F.col("enqueue_ts")) * 1000.0)
    rate = F.col("sample_rate")
    rate_ok = rate.isNull() | ((rate > 0) & (rate <= 1))
    with_lag = typed.withColumns(
        {
            "lag": F.when(F.col("event") == "ha.lag", lag),
            "weight": F.when(rate.isNotNull() & rate_ok, 1.0 / rate).otherwise(F.lit(1.0)),
            "hour": F.date_trunc("hour", "ts"),
        }
    )
    is_lag = F.col("event") == "ha.lag"
    quality = (
        F.when(F.col("malformed"), Quality.MALFORMED.value)
        .when(
            F.col("event").isNull() | F.col("broker").isNull() | F.col("ts").isNull(),
            Quality.MISSING_COMMON.value,
        )
        .when(
            (F.col("ts") < F.lit(dates.start)) | (F.col("ts") >= F.lit(dates.end)),
            Quality.OUT_OF_RANGE.value,
        )
        .when(~F.col("event").isin(*sorted(events.KNOWN_EVENTS)), Quality.UNKNOWN_EVENT.value)
        .when(_missing_required() | (is_lag & (F.col("lag").isNull() | F.isnan("lag") | ~rate_ok)),
              Quality.MISSING_FIELD.value)
        .when(is_lag & (F.col("lag") < 0), Quality.NEGATIVE_LAG.value)
        .otherwise(Quality.OK.value)
    )
    return with_lag.withColumn("quality", quality).drop("malformed")


def _missing_required() -> Column:
    conditions = [
        (F.col("event") == name) & reduce(lambda a, b: a | b, [F.col(f).isNull() for f in fields])
        for name, fields in events.REQUIRED.items()
    ]
    return reduce(lambda a, b: a | b, conditions)


def build_session(master: str | None, app_name: str, conf: dict[str, str]) -> SparkSession:
    """The job's session. ``master=None`` keeps whatever spark-submit (or the default, local[*]) chose."""
    builder = SparkSession.builder.appName(app_name)
    if master:
        builder = builder.master(master)
    # Hours are UTC hours whatever the machine's zone.
    builder = builder.config("spark.sql.session.timeZone", "UTC")
    for key, value in conf.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()
