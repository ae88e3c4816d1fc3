"""``ha-lag-report``: the nightly replication-lag report (see docs/lag-report.md).

Exit codes: 0 report written (bad input lines are counted in it, not fatal); 1 no input (nothing matched, or no
valid event in the date range); 2 usage error.
"""

from __future__ import annotations

import datetime as dt
import sys

import click

from spark import reader

EXIT_NO_INPUT = 1


def _parse_conf(values: tuple[str, ...]) -> dict[str, str]:
    conf = {"spark.ui.showConsoleProgress": "false"}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"expected KEY=VALUE, got {item!r}", param_hint="--conf")
        conf[key] = value
    return conf


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--logs", "logs", multiple=True, required=True, metavar="URI",
              help="Event-log file, directory, glob or Hadoop URI (file://, hdfs://, s3a://). Repeatable. "
                   "Directories are read recursively; date=YYYY-MM-DD sub-directories are pruned to the range.")
@click.option("--date", "first", required=True, type=click.DateTime(["%Y-%m-%d"]), help="First UTC day.")
@click.option("--until", "last", type=click.DateTime(["%Y-%m-%d"]), help="Last UTC day (inclusive; default --date).")
@click.option("--out", required=True, metavar="DIR", help="Output directory or Hadoop URI.")
@click.option("--master", default=None, metavar="URL",
              help="Spark master, e.g. local[*], yarn, k8s://... Default: whatever spark-submit chose, else local[*].")
@click.option("--pattern", default=reader.DEFAULT_PATTERN, show_default=True,
              help="Hadoop glob for file names inside directories.")
@click.option("--conf", "conf", multiple=True, metavar="KEY=VALUE", help="Extra Spark configuration. Repeatable.")
def main(logs: tuple[str, ...], first: dt.datetime, last: dt.datetime | None, out: str, master: str | None,
         pattern: str, conf: tuple[str, ...]) -> None:
    """Replication lag per hour, queue and backup; catch-ups; failovers; broker states."""
    try:
        dates = reader.DateRange(first.date(), (last or first).date())
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--until") from e
    spark_conf = _parse_conf(conf)
    uris = list(logs)
    missing = reader.missing_local_input(uris)
    if missing:
        click.echo(f"ha-lag-report: {missing}", err=True)
        sys.exit(EXIT_NO_INPUT)
    code = _run(uris, dates, out, master, pattern, spark_conf)
    sys.exit(code)


def _run(uris: list[str], dates: reader.DateRange, out: str, master: str | None, pattern: str,
         conf: dict[str, str]) -> int:
    # Imported here so that --help and the input check answer without loading Spark.
    from pyspark.errors import AnalysisException
    from pyspark.sql import SparkSession

    from spark import job, outputs, report_html, summary

    owned = SparkSession.getActiveSession() is None
    spark = reader.build_session(master, "ha-lag-report", conf)
    if owned:
        spark.sparkContext.setLogLevel("ERROR")
    try:
        try:
            data, frames = job.run(spark, uris, dates, pattern)
        except job.NoInput as e:
            click.echo(f"ha-lag-report: {e}", err=True)
            return EXIT_NO_INPUT
        except AnalysisException as e:
            if e.getCondition() != "PATH_NOT_FOUND":
                raise
            click.echo(f"ha-lag-report: no input: {e.getMessage()}", err=True)
            return EXIT_NO_INPUT
        text = summary.render(data)
        outputs.write_all(spark, out, frames, data.tables(), report_html.render(data), text)
        click.echo(text)
        click.echo(f"report: {out.rstrip('/')}/report.html")
        return 0
    finally:
        if owned:
            spark.stop()


if __name__ == "__main__":
    main()
