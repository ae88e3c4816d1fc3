"""`python -m bench.profile`: sample our broker with py-spy while the bench loads it; print the hot path.

Starts a target (default `ours`), runs `py-spy record` on its broker process(es) during the chosen phase, writes
the collapsed stacks and a flame graph (SVG) under bench/results/, and prints the top functions by own time
("self") and by time including callees ("total"). py-spy is a PyPI package (`pip install py-spy`).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from bench import native
from bench.cli import RESULTS
from bench.phases import PhaseSpec, run_phase
from bench.scenarios import SCENARIOS

_LINE = re.compile(r":\d+\)$")


def function_of(frame: str) -> str:
    """"Server.on_delivery (broker/server.py:489)" -> "Server.on_delivery (broker/server.py)"."""
    return _LINE.sub(")", frame)


def file_of(frame: str) -> str:
    """"Server.on_delivery (broker/server.py:489)" -> "broker/server.py"."""
    inner = frame[frame.rfind("(") + 1 :].rstrip(")")
    return inner.rsplit(":", 1)[0]


def parse_collapsed(text: str, key: Callable[[str], str] = function_of) -> tuple[Counter[str], Counter[str], int]:
    """Collapsed stacks ("a;b;c 12" per line) -> (self samples, inclusive samples, total samples) per key(frame)."""
    own: Counter[str] = Counter()
    incl: Counter[str] = Counter()
    total = 0
    for line in text.splitlines():
        stack, _, n = line.rpartition(" ")
        if not stack or not n.isdigit():
            continue
        count = int(n)
        frames = [key(f) for f in stack.split(";")]
        total += count
        own[frames[-1]] += count
        for f in set(frames):
            incl[f] += count
    return own, incl, total


def top_table(counts: Counter[str], total: int, n: int) -> str:
    lines = [f"{'share':>6}  frame"]
    for frame, c in counts.most_common(n):
        lines.append(f"{c / total:6.1%}  {frame}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="bench.profile", description=__doc__)
    p.add_argument("--target", default="ours", choices=[t for t in SCENARIOS if t.startswith("ours")])
    p.add_argument("--phase", default="e2e", choices=["publish", "e2e", "latency"],
                   help="latency: one publisher, one message at a time")
    p.add_argument("--messages", type=int, default=30_000)
    p.add_argument("--publishers", type=int, default=2)
    p.add_argument("--consumers", type=int, default=2)
    p.add_argument("--window", type=int, default=200)
    p.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--native", action="store_true", help="include native (C) frames (py-spy --native)")
    p.add_argument("--client", choices=("c", "python"), default="c",
                   help="load generator: c (bench/loadgen; falls back to python if it does not build) or python [c]")
    args = p.parse_args(argv)
    loadgen = native.try_loadgen()[0] if args.client == "c" else None
    pyspy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    RESULTS.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="understudy-profile-"))
    sync = args.phase == "latency"
    spec = PhaseSpec(args.phase, 1 if sync else args.publishers, args.consumers if args.phase == "e2e" else 0,
                     args.messages, None, 1 if sync else args.window, 200, 128, False)
    target = SCENARIOS[args.target]()
    spec = dataclasses.replace(spec, durable=target.durable_messages)  # the *-durable targets: durable messages
    try:
        with target:
            target.start(workdir)
            groups = target.pid_groups()
            recorders = []
            for role, pids in groups.items():
                base = RESULTS / f"profile-{stamp}-{args.target}-{role}"
                for fmt, suffix in (("raw", ".txt"), ("flamegraph", ".svg")):
                    cmd = [pyspy, "record", "--pid", str(pids[0]), "--rate", str(args.rate), "--format", fmt,
                           "-o", str(base) + suffix, "--nonblocking"] + (["--native"] if args.native else [])
                    with open(str(base) + f".{fmt}.log", "wb") as log:
                        rec = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log)
                    recorders.append((role, fmt, Path(str(base) + suffix), rec))
            result = run_phase(target, spec, loadgen=loadgen)
            for _, _, _, rec in recorders:
                rec.send_signal(2)  # SIGINT: py-spy writes its output and exits
            for _, _, _, rec in recorders:
                rec.wait(60)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"{args.target} {args.phase}: {result.messages} msgs, {result.rate:,.0f} msg/s, "
          f"broker {result.broker_us_per_msg:.1f} µs/msg\n")
    for role, fmt, path, _ in recorders:
        if fmt != "raw":
            continue
        if not path.exists():
            print(f"### {role}: py-spy wrote nothing; see {path.with_suffix('.raw.log')}\n")
            continue
        text = path.read_text()
        own, incl, total = parse_collapsed(text)
        by_file, _, _ = parse_collapsed(text, file_of)
        print(f"### {role}: {total} samples ({path})\n")
        print(f"self time by file:\n{top_table(by_file, total, 12)}\n")
        print(f"self time by function:\n{top_table(own, total, args.top)}\n")
        print(f"total time (with callees) by function:\n{top_table(incl, total, args.top)}\n")


if __name__ == "__main__":
    main()
