"""Benchmark of the nightly lag report (ha-lag-report) on local Spark. Not run in CI.

Generates N events of a synthetic night (streamed to files by spark.generator, never held in memory), runs the
report as a separate process exactly as an operator would, and prints events/s and the peak resident memory of the
whole process tree (Python driver + JVM), sampled every 0.2 s. Give several --events to check that memory stays
flat as the input grows:

    .venv/bin/python -m bench.lag_report_bench --events 1000000
    .venv/bin/python -m bench.lag_report_bench --events 1000000 --events 10000000 --gzip
    .venv/bin/python -m bench.lag_report_bench --events 1000000 --work-dir /tmp/lag --keep --reuse \
        --event-log /tmp/lag/events && .venv/bin/python -m bench.spark_stages /tmp/lag/events
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
    cpu_seconds: float
    load_average: float


def tree_rss(root: psutil.Process, cpu: dict[int, float]) -> int:
    """Resident memory of the tree; records each process's CPU seconds so far in ``cpu`` (by pid)."""
    total = 0
    for proc in [root, *root.children(recursive=True)]:
        with contextlib.suppress(psutil.Error):
            total += proc.memory_info().rss
            times = proc.cpu_times()
            cpu[proc.pid] = times.user + times.system
    return total


def run_report(logs: Path, out: Path, day: str, master: str, driver_memory: str,
               event_log: Path | None = None, conf: tuple[str, ...] = ()) -> tuple[float, int, float, str]:
    """(seconds, peak tree RSS bytes, CPU seconds of the tree, stdout) of one ha-lag-report run.

    The CPU seconds (sampled every 0.2 s, so the last fraction of a second is missed) are the figure to compare on
    a machine loaded by other work, where the wall time is not."""
    command = [sys.executable, "-m", "spark.cli", "--logs", str(logs), "--date", day, "--out", str(out),
               "--master", master, "--conf", "spark.ui.enabled=false",
               "--conf", f"spark.driver.memory={driver_memory}"]
    for item in conf:
        command += ["--conf", item]
    if event_log is not None:  # the stage profile (Spark UI data): summarise with bench/spark_stages.py
        event_log.mkdir(parents=True, exist_ok=True)
        command += ["--conf", "spark.eventLog.enabled=true", "--conf", f"spark.eventLog.dir={event_log}",
                    "--conf", "spark.eventLog.compress=false"]
    env = {**os.environ, "SPARK_LOCAL_IP": os.environ.get("SPARK_LOCAL_IP", "127.0.0.1")}
    started = time.monotonic()
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    watched = psutil.Process(proc.pid)
    peak = 0
    cpu: dict[int, float] = {}
    while proc.poll() is None:
        peak = max(peak, tree_rss(watched, cpu))
        time.sleep(0.2)  # sampling interval of the memory probe, not a wait for an event
    stdout, stderr = proc.communicate()
    seconds = time.monotonic() - started
    if proc.returncode != 0:
        raise click.ClickException(f"ha-lag-report failed ({proc.returncode}):\n{stderr[-3000:]}")
    return seconds, peak, sum(cpu.values()), stdout


def bench_one(events: int, work: Path, gzipped: bool, master: str, driver_memory: str, reuse: bool,
              event_log: Path | None, conf: tuple[str, ...] = ()) -> Result:
    logs = work / f"logs-{events}{'-gz' if gzipped else ''}"
    done = logs / "GENERATED"  # written last: a half-generated directory is never reused
    scenario = generator.Scenario(lag_samples=events, hours=24, start_hour=0, partitioned=True, gzipped=gzipped,
                                  lines_per_file=max(events // 16, 10_000))
    generate_seconds = 0.0
    if not (reuse and done.exists()):
        shutil.rmtree(logs, ignore_errors=True)
        started = time.monotonic()
        generator.generate(scenario, logs)
        generate_seconds = time.monotonic() - started
        done.write_text("")
    size = sum(p.stat().st_size for p in logs.rglob("*") if p.is_file())
    seconds, peak, cpu, stdout = run_report(logs, work / f"out-{events}", str(scenario.day), master, driver_memory,
                                       event_log, conf)
    match = re.search(r"input: (\d+) lines", stdout)
    if match is None:
        raise click.ClickException(f"no input count in the report's output:\n{stdout[-2000:]}")
    lines = int(match.group(1))
    return Result(events=events, lines_read=lines, generate_seconds=round(generate_seconds, 1),
                  report_seconds=round(seconds, 1), events_per_second=round(lines / seconds),
                  peak_rss_mib=round(peak / 2**20), input_mib=round(size / 2**20, 1), cpu_seconds=round(cpu, 1),
                  load_average=round(os.getloadavg()[0], 1))


@click.command()
@click.option("--events", "counts", type=int, multiple=True, default=[10_000_000], show_default=True,
              help="ha.lag samples to generate (plus ~100k other events for a 24 h night). Repeatable.")
@click.option("--gzip/--no-gzip", "gzipped", default=False, help="Gzip the generated logs (not splittable).")
@click.option("--master", default="local[2]", show_default=True)
@click.option("--driver-memory", default="2g", show_default=True)
@click.option("--work-dir", type=click.Path(path_type=Path), default=None, help="Default: a temporary directory.")
@click.option("--keep", is_flag=True, help="Keep the generated logs and reports.")
@click.option("--reuse", is_flag=True, help="Reuse logs generated by an earlier --keep run in --work-dir.")
@click.option("--event-log", type=click.Path(path_type=Path), default=None,
              help="Write Spark's event log (the stage profile) under this directory.")
@click.option("--conf", "conf", multiple=True, metavar="KEY=VALUE", help="Extra Spark setting for the report.")
def main(counts: tuple[int, ...], gzipped: bool, master: str, driver_memory: str, work_dir: Path | None,
         keep: bool, reuse: bool, event_log: Path | None, conf: tuple[str, ...]) -> None:
    work = work_dir or Path(tempfile.mkdtemp(prefix="lag-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        for count in counts:
            result = bench_one(count, work, gzipped, master, driver_memory, reuse, event_log, conf)
            click.echo(
                f"{result.lines_read:>11,} events ({result.input_mib} MiB{' gz' if gzipped else ''}) on {master}: "
                f"{result.report_seconds} s, {result.events_per_second:,} events/s, "
                f"peak RSS {result.peak_rss_mib} MiB, CPU {result.cpu_seconds} s, load average {result.load_average} "
                f"(generation {result.generate_seconds} s)"
            )
            click.echo(json.dumps(asdict(result)))
    finally:
        if not keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
