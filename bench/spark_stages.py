"""The stage profile of a Spark application from its event log (what the Spark UI's Stages tab shows).

    .venv/bin/python -m bench.spark_stages /tmp/lag/events            # the newest application in the directory
    .venv/bin/python -m bench.spark_stages /tmp/lag/events/local-1795429741070

Prints the application's wall time, the time before its first job (JVM and session start-up, file listing), then
one line per stage: when it started (seconds after the application started), its wall time, tasks, executor run
time (summed over tasks), input read, shuffle written, disk spill, and the stage name (the call site).
Event logs may be uncompressed or zstd-compressed (``zstd`` on the PATH).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click


@dataclass(frozen=True)
class Stage:
    stage_id: int
    name: str
    submitted_ms: int
    completed_ms: int
    tasks: int
    run_ms: int
    input_bytes: int
    shuffle_write_bytes: int
    spill_bytes: int

    @property
    def seconds(self) -> float:
        return (self.completed_ms - self.submitted_ms) / 1000


@dataclass(frozen=True)
class Profile:
    start_ms: int
    end_ms: int | None
    first_job_ms: int | None
    stages: tuple[Stage, ...]


def _files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    apps = sorted((p for p in path.iterdir() if not p.name.startswith(".")), key=lambda p: p.stat().st_mtime)
    if not apps:
        raise click.ClickException(f"no event log in {path}")
    newest = apps[-1]
    return sorted(p for p in newest.iterdir() if p.name.startswith("events_")) if newest.is_dir() else [newest]


def _lines(path: Path) -> Iterator[str]:
    if path.suffix == ".zstd":
        text = subprocess.run(["zstd", "-dc", str(path)], check=True, capture_output=True).stdout.decode()
        yield from text.splitlines()
    else:
        with open(path, encoding="utf-8") as handle:
            yield from handle


def _metric(info: dict[str, Any], name: str) -> int:
    for acc in info.get("Accumulables", []):
        if acc.get("Name") == name:
            return int(acc.get("Value") or 0)
    return 0


def read_profile(path: Path) -> Profile:
    start = 0
    end = first_job = None
    stages = []
    for file in _files(path):
        for line in _lines(file):
            event = json.loads(line)
            kind = event["Event"]
            if kind == "SparkListenerApplicationStart":
                start = event["Timestamp"]
            elif kind == "SparkListenerApplicationEnd":
                end = event["Timestamp"]
            elif kind == "SparkListenerJobStart" and first_job is None:
                first_job = event["Submission Time"]
            elif kind == "SparkListenerStageCompleted":
                info = event["Stage Info"]
                stages.append(Stage(
                    info["Stage ID"], info["Stage Name"], info["Submission Time"], info["Completion Time"],
                    info["Number of Tasks"], _metric(info, "internal.metrics.executorRunTime"),
                    _metric(info, "internal.metrics.input.bytesRead"),
                    _metric(info, "internal.metrics.shuffle.write.bytesWritten"),
                    _metric(info, "internal.metrics.diskBytesSpilled"),
                ))
    return Profile(start, end, first_job, tuple(sorted(stages, key=lambda s: s.submitted_ms)))


def render(profile: Profile) -> str:
    mib = 2**20
    lines = []
    if profile.end_ms is not None:
        lines.append(f"application: {(profile.end_ms - profile.start_ms) / 1000:.1f} s")
    if profile.first_job_ms is not None:
        lines.append(f"before the first job (start-up, listing): {(profile.first_job_ms - profile.start_ms) / 1000:.1f} s")
    lines.append(f"stages: {len(profile.stages)}, wall {sum(s.seconds for s in profile.stages):.1f} s summed")
    lines.append("  id   start    wall  tasks  run(s)  input MiB  shuffle MiB  spill MiB  name")
    for s in profile.stages:
        lines.append(
            f"{s.stage_id:4} {(s.submitted_ms - profile.start_ms) / 1000:7.1f} {s.seconds:7.1f} {s.tasks:6} "
            f"{s.run_ms / 1000:7.1f} {s.input_bytes / mib:10.1f} {s.shuffle_write_bytes / mib:12.1f} "
            f"{s.spill_bytes / mib:10.1f}  {s.name[:70]}"
        )
    return "\n".join(lines)


@click.command()
@click.argument("path", type=click.Path(exists=True, path_type=Path))
def main(path: Path) -> None:
    """Summarise the Spark event log at PATH (a file, an application directory, or a directory of them)."""
    click.echo(render(read_profile(path)))


if __name__ == "__main__":
    main()
