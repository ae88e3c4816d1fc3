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

from broker import events as catalogue
from spark import events
from spark.events import Quality

# Files the job reads inside a directory (Hadoop glob syntax, matched against the file name).
DEFAULT_PATTERN = "*.{log,jsonl,json,log.gz,jsonl.gz,json.gz}"
# Logs laid out as .../date=YYYY-MM-DD/... get this partition column from Spark and are pruned on it.
PARTITION_COLUMN = "date"
# A date partition holds the lines its writer rotated into it, which may straddle midnight (local time rotation,
# late flush): read one extra day each side and filter on ``ts`` exactly.
PARTITION_MARGIN = dt.timedelta(days=1)

_SPARK_TYPES: dict[catalogue.Type, T.DataType] = {
    catalogue.Type.STRING: T.StringType(),
    catalogue.Type.INT: T.LongType(),
    catalogue.Type.FLOAT: T.DoubleType(),
    catalogue.Type.BOOL: T.BooleanType(),
    catalogue.Type.LIST: T.StringType(),  # kept as its JSON text
    catalogue.Type.OBJECT: T.StringType(),
}
# The one parse of every line: the fields the report reads, typed as the catalogue says, so that Jackson checks the
# types (a string where a number belongs, a fraction where an integer belongs, anything but true/false for a
# boolean). Each line is parsed as the JSON array "[line]": Spark reads only the first JSON value of a string, so
# this is how text after the object (or a second object) makes the line fail instead of being ignored.
FIELDS = T.StructType(
    [T.StructField(name, T.StringType()) for name in ("ts", "event", "broker")]
    + [T.StructField(name, _SPARK_TYPES[events.field_type(name)]) for name in events.READ_FIELDS]
)
LINE_SCHEMA = T.ArrayType(FIELDS)
# The same fields parsed from the line itself (the fast path of classify), with the column Spark fills with the line
# when it does not parse as FIELDS.
CORRUPT = "_line_not_parsed"
PLAIN_SCHEMA = T.StructType([*FIELDS.fields, T.StructField(CORRUPT, T.StringType())])
# For the few lines that fail: the common fields only, as text (to tell a well-formed object with a read field of
# the wrong type, classified by its common fields, from malformed JSON).
COMMON_LINE_SCHEMA = T.ArrayType(T.StructType([T.StructField(name, T.StringType()) for name in ("ts", "event", "broker")]))
# Strict JSON (RFC 8259): no single quotes, no NaN/Infinity.
JSON_OPTIONS = {
    "mode": "PERMISSIVE",
    "allowSingleQuotes": "false",
    "allowNonNumericNumbers": "false",
}
# A field of the wrong type fails the whole line (the default keeps the other fields and hides the failure).
STRICT_CONF = {"spark.sql.json.enablePartialResults": "false"}
# A line that starts with "{" and whose only "}" is its last character: nothing can follow the object. (A regular
# expression: Spark's instr() and length() cost twice as much, per character.)
ONE_FLAT_OBJECT = r"^\{[^}]*\}$"
# ISO 8601 date-time with seconds and a zone; the calendar check (month 13, 30 February) is the cast's.
ISO_TS = r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,9})?(Z|[+-]\d{2}:\d{2})$"


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
    """One row per non-blank line: ``quality``, ``file``, ``event``, ``broker``, ``ts``, ``hour``, the typed fields
    the report reads, ``lag`` and ``weight``. The rules are the table in docs/lag-report.md, in its order."""
    for key, value in STRICT_CONF.items():
        lines.sparkSession.conf.set(key, value)
    # Fast path, taken by almost every line: the line parsed as one object has an event, starts with "{" and its
    # only "}" is its last character (ONE_FLAT_OBJECT), so nothing can follow the object: it is exactly one JSON
    # object and this parse is the record. Only the other lines (blank, malformed, nested values, a "}" inside a string, trailing
    # spaces...) are parsed again as the array "[line]" (CASE WHEN evaluates that only for them): parsing every
    # line as an array costs twice as much.
    plain = F.from_json(F.col("value"), PLAIN_SCHEMA, {**JSON_OPTIONS, "columnNameOfCorruptRecord": CORRUPT})
    simple = (
        F.col(f"p.{CORRUPT}").isNull()  # set when a field has the wrong type (the other fields are still filled)
        & F.col("p.event").isNotNull()
        & F.col("value").rlike(ONE_FLAT_OBJECT)
    )
    wrapped = F.concat(F.lit("["), F.col("value"), F.lit("]"))
    parsed = lines.select("value", "file", plain.alias("p")).select(
        "value", "file", "p", simple.alias("simple"),
        F.when(~simple, F.from_json(wrapped, LINE_SCHEMA, JSON_OPTIONS)).alias("w"),
    )
    parsed = parsed.where(F.col("simple") | F.col("w").isNull() | (F.size("w") > 0))  # blank: the empty array

    def record(name: str) -> Column:
        return F.when(F.col("simple"), F.col("p")[name]).otherwise(F.col("w")[0][name])

    one_object = F.col("simple") | (F.col("w").isNotNull() & (F.size("w") == 1) & F.col("w")[0].isNotNull())
    # The rest (rare) is parsed again with the common fields only, as text (text accepts any JSON value): one JSON
    # object that parses this way has a read field of the wrong type; anything else is malformed. CASE WHEN
    # evaluates the later conditions only for the rows that reach them.
    fallback = F.from_json(wrapped, COMMON_LINE_SCHEMA, JSON_OPTIONS)
    well_formed_object = F.coalesce(
        fallback.isNotNull() & (F.size(fallback) == 1) & fallback[0].isNotNull() & F.col("value").rlike(r"^\s*\{"),
        F.lit(False),
    )
    parse = F.when(one_object, "ok").when(well_formed_object, "wrong_type").otherwise("malformed")

    def common(name: str) -> Column:
        return F.when(one_object, record(name)).when(F.col("parse") == "wrong_type", fallback[0][name])

    typed = parsed.withColumn("parse", parse).select(
        "file",
        "parse",
        F.when(common("ts").rlike(ISO_TS), common("ts").try_cast("timestamp")).alias("ts"),
        common("event").alias("event"),
        common("broker").alias("broker"),
        *[F.when(one_object, record(name)).alias(name) for name in events.READ_FIELDS],
    )
    lag = F.coalesce(F.col("lag_ms"), (F.col("ack_ts") - F.col("enqueue_ts")) * 1000.0)
    rate = F.col("sample_rate")
    rate_ok = rate.isNull() | ((rate > 0) & (rate <= 1))
    is_lag = F.col("event") == "ha.lag"
    with_lag = typed.withColumns(
        {
            "lag": F.when(is_lag, lag),
            "weight": F.when(rate.isNotNull() & rate_ok, 1.0 / rate).otherwise(F.lit(1.0)),
            "hour": F.date_trunc("hour", "ts"),
        }
    )
    finite_lag = F.col("lag").isNotNull() & ~F.isnan("lag") & (F.abs("lag") != float("inf"))
    quality = (
        F.when(F.col("parse") == "malformed", Quality.MALFORMED.value)
        .when(
            F.col("event").isNull() | F.col("broker").isNull() | F.col("ts").isNull(),
            Quality.MISSING_COMMON.value,
        )
        .when(
            (F.col("ts") < F.lit(dates.start)) | (F.col("ts") >= F.lit(dates.end)),
            Quality.OUT_OF_RANGE.value,
        )
        .when(~F.col("event").isin(*sorted(events.KNOWN_EVENTS)), Quality.UNKNOWN_EVENT.value)
        .when((F.col("parse") == "wrong_type") | _missing_required() | (is_lag & (~finite_lag | ~rate_ok)),
              Quality.MISSING_FIELD.value)
        .when(is_lag & (F.col("lag") < 0), Quality.NEGATIVE_LAG.value)
        .otherwise(Quality.OK.value)
    )
    return with_lag.withColumn("quality", quality).drop("parse")


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
