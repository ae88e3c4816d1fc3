"""Write the report: Parquet (by Spark), CSV, HTML and summary.txt (small files, from the driver).

``out`` may be a local directory or any Hadoop-compatible URI; small files go through the Hadoop FileSystem API
in the latter case, so the job writes to hdfs:// or s3a:// exactly as it does locally.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession

from spark import reader
from spark.model import Table

LAYOUT = """\
report.html                 self-contained HTML report (plots embedded)
summary.txt                 the text summary printed on stdout
csv/<table>.csv             one CSV file per table (header row, UTC ISO 8601 times)
parquet/<table>/            the same tables as Parquet
"""


def table_csv(table: Table) -> bytes:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(table.columns)
    for row in table.rows:
        writer.writerow([_csv_value(row[c]) for c in table.columns])
    return buffer.getvalue().encode("utf-8")


def _csv_value(value: Any) -> Any:
    if isinstance(value, dt.datetime):
        return value.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return "" if value is None else value


def write_all(spark: SparkSession, out: str, frames: dict[str, DataFrame], tables: tuple[Table, ...],
              html: str, text: str) -> None:
    for name, frame in frames.items():
        frame.coalesce(1).write.mode("overwrite").parquet(_join(out, "parquet", name))
    for table in tables:
        write_bytes(spark, _join(out, "csv", f"{table.name}.csv"), table_csv(table))
    write_bytes(spark, _join(out, "report.html"), html.encode("utf-8"))
    write_bytes(spark, _join(out, "summary.txt"), (text + "\n").encode("utf-8"))


def write_bytes(spark: SparkSession, uri: str, data: bytes) -> None:
    if reader.is_local(uri):
        path = Path(uri.removeprefix("file://").removeprefix("file:"))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        return
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    hadoop_path = jvm.org.apache.hadoop.fs.Path(uri)
    fs = hadoop_path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())  # type: ignore[union-attr]
    stream = fs.create(hadoop_path, True)
    try:
        stream.write(bytearray(data))
    finally:
        stream.close()


def _join(base: str, *parts: str) -> str:
    return "/".join([base.rstrip("/"), *parts])
