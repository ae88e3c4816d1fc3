"""Benchmark of the nightly lag report (ha-lag-report) on local Spark. Not run in CI.

Generates N events of a synthetic night (streamed to files by spark.generator, never held in memory), runs the
report as a separate process exactly as an operator would, and prints events/s and the peak resident memory of the
whole process tree (Python driver + JVM), sampled every 0.2 s. Give several --events to check that memory stays
flat as the input grows:

    .venv/bin/python -m bench.lag_report_bench --events 1000000
    .venv/bin/python -m bench.lag_report_bench --events 1000000 --events 10000000 --gzip
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import click
import psutil

from spark import generator


@dataclass(frozen=True)
class Result:
    events: int
    lines_read: int
    generate_seconds: float
    report_seconds: float
    events_per_second: float
    peak_rss_mib: float
    input_mib: float


def tree_rss(root: psutil.Process) -> int:
    total = 0
    for proc in [root, *root.children(recursive=True)]:
        with contextlib.suppress(psutil.Error):
            total += proc.memory_info().rss
    return total


def run_report(logs: Path, out: Path, day: str, master: str, driver_memory: str) -> tuple[float, int, str]:
    """(seconds, peak tree RSS bytes, stdout) of one ha-lag-report run."""
    command = [sys.executable, "-m", "spark.cli", "--logs", str(logs), "--date", day, "--out", str(out),
               "--master", master, "--conf", "spark.ui.enabled=false",
               "--conf", f"spark.driver.memory={driver_memory}"]
    env = {**os.environ, "SPARK_LOCAL_IP": os.environ.get("SPARK_LOCAL_IP", "127.0.0.1")}
    started = time.monotonic()
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    watched = psutil.Process(proc.pid)
    peak = 0
    while proc.poll() is None:
        peak = max(peak, tree_rss(watched))
        time.sleep(0.2)  # sampling interval of the memory probe, not a wait for an event
    stdout, stderr = proc.communicate()
    seconds = time.monotonic() - started
    if proc.returncode != 0:
        raise click.ClickException(f"ha-lag-report failed ({proc.returncode}):\n{stderr[-3000:]}")
    return seconds, peak, stdout


def bench_one(events: int, work: Path, gzipped: bool, master: str, driver_memory: str) -> Result:
    logs = work / f"logs-{events}"
    shutil.rmtree(logs, ignore_errors=True)
    scenario = generator.Scenario(lag_samples=events, hours=24, start_hour=0, partitioned=True, gzipped=gzipped,
                                  lines_per_file=max(events // 16, 10_000))
    started = time.monotonic()
    truth = generator.generate(scenario, logs)
    generate_seconds = time.monotonic() - started
    size = sum(p.stat().st_size for p in logs.rglob("*") if p.is_file())
    seconds, peak, stdout = run_report(logs, work / f"out-{events}", str(scenario.day), master, driver_memory)
    match = re.search(r"input: (\d+) lines", stdout)
    lines = int(match.group(1)) if match else truth.lines
    return Result(events=events, lines_read=lines, generate_seconds=round(generate_seconds, 1),
                  report_seconds=round(seconds, 1), events_per_second=round(lines / seconds),
                  peak_rss_mib=round(peak / 2**20), input_mib=round(size / 2**20, 1))


@click.command()
@click.option("--events", "counts", type=int, multiple=True, default=[10_000_000], show_default=True,
              help="ha.lag samples to generate (plus ~100k other events for a 24 h night). Repeatable.")
@click.option("--gzip/--no-gzip", "gzipped", default=False, help="Gzip the generated logs (not splittable).")
@click.option("--master", default="local[2]", show_default=True)
@click.option("--driver-memory", default="2g", show_default=True)
@click.option("--work-dir", type=click.Path(path_type=Path), default=None, help="Default: a temporary directory.")
@click.option("--keep", is_flag=True, help="Keep the generated logs and reports.")
def main(counts: tuple[int, ...], gzipped: bool, master: str, driver_memory: str, work_dir: Path | None,
         keep: bool) -> None:
    work = work_dir or Path(tempfile.mkdtemp(prefix="lag-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        for count in counts:
            result = bench_one(count, work, gzipped, master, driver_memory)
            click.echo(
                f"{result.lines_read:>11,} events ({result.input_mib} MiB{' gz' if gzipped else ''}) on {master}: "
                f"{result.report_seconds} s, {result.events_per_second:,} events/s, "
                f"peak RSS {result.peak_rss_mib} MiB (generation {result.generate_seconds} s)"
            )
            click.echo(json.dumps(asdict(result)))
    finally:
        if not keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
