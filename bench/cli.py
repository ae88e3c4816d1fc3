"""`python -m bench`: start each target in turn, run the phases, write JSON, print the ratio table."""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import os
import platform
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

from bench import fsync, hop, native, procstat, report
from bench.catchup import run_catchup
from bench.membound import run_memory
from bench.ours import OursReplicated, OursStandalone
from bench.phases import PhaseSpec, run_phase
from bench.recovery import run_recovery
from bench.rss import run_rss
from bench.scenarios import DEFAULT, DURABLE, SCENARIOS
from bench.targets import Target

RESULTS = Path(__file__).resolve().parent / "results"
LOAD_PHASES = ("publish", "e2e", "latency")
ALL_PHASES = ("rss", *LOAD_PHASES, "catchup", "recovery", "memory")
#: without --phases: everything but the memory phase (a 10M fill), which the full and durable presets add
DEFAULT_PHASES = ("rss", *LOAD_PHASES, "catchup", "recovery")
PRESETS: dict[str, dict[str, Any]] = {
    # a few minutes for the default targets on a 2-core machine
    "quick": {"messages": 20_000, "latency_messages": 1_000, "repeat": 1, "catchup_messages": "100000",
              "rss_messages": 100_000, "recovery_messages": 100_000, "memory_messages": 1_000_000},
    # longer: the catch-up and the RSS fill of 1M messages per target; medians of 3
    "full": {"messages": 100_000, "latency_messages": 5_000, "repeat": 3, "catchup_messages": "100000,1000000",
             "rss_messages": 1_000_000, "recovery_messages": 1_000_000, "memory_messages": 10_000_000,
             "phases": ",".join(ALL_PHASES)},
    # the durable-store goals (issue 11): durable targets + the non-durable reference, recovery of 1M, 10M bounded
    "durable": {"messages": 100_000, "latency_messages": 5_000, "repeat": 3, "catchup_messages": "",
                "rss_messages": 100_000, "recovery_messages": 1_000_000, "memory_messages": 10_000_000,
                "targets": ",".join(DURABLE), "phases": ",".join((*LOAD_PHASES, "recovery", "memory"))},
}
#: targets other than ours fill at most this many messages for the RSS comparison (cheap, not a goal)
RSS_OTHERS_MAX = 100_000


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bench", description=__doc__)
    p.add_argument("--preset", choices=sorted(PRESETS), default="quick",
                   help="sizes for a quick or a full run; durable: the durable-store goals' targets and phases")
    p.add_argument("--targets",
                   help=f"comma list of {', '.join(SCENARIOS)} [{','.join(DEFAULT)}; durable preset: "
                        f"{','.join(DURABLE)}]")
    p.add_argument("--phases",
                   help=f"comma list of {','.join(ALL_PHASES)} (catchup: replicated targets only; recovery and "
                        "memory: ours-durable only, memory runs last and restarts it with --max-memory; rss runs "
                        f"first, on the freshly started target) [{','.join(DEFAULT_PHASES)}; full: all; durable: "
                        "publish,e2e,latency,recovery,memory]")
    p.add_argument("--client", choices=("c", "python"),
                   help="load generator: c (bench/loadgen, built on demand) or python (bench/client.py) "
                        "[c when it builds]")
    p.add_argument("--catchup-messages",
                   help="comma list of queue depths for the catch-up phase, one run each "
                        "[quick: 100000; full: 100000,1000000]")
    p.add_argument("--catchup-publisher-rate", type=float, default=1000.0,
                   help="msg/s of the live publisher on a second queue during catch-up (C client only; 0 = none) "
                        "[1000]")
    p.add_argument("--rss-messages", type=int,
                   help=f"messages queued for the RSS-per-message figure [quick 100000, full 1000000; targets other "
                        f"than ours at most {RSS_OTHERS_MAX}]")
    p.add_argument("--hop-count", type=int, default=20_000, help="round trips of the loopback hop measurement")
    p.add_argument("--fsync-count", type=int, default=2_000,
                   help="writes (256 B, write + fdatasync) of the disk measurement in the work directory [2000]")
    p.add_argument("--recovery-messages", type=int,
                   help="durable messages filled before the SIGKILL in the recovery phase [quick 100000, full and "
                        "durable 1000000]")
    p.add_argument("--memory-messages", type=int,
                   help="durable messages filled in the memory phase [quick 1000000, full and durable 10000000]")
    p.add_argument("--max-memory", default="256M",
                   help="--max-memory of the broker in the memory phase (bytes, or 256M, 1G) [256M]")
    p.add_argument("--workdir", type=Path,
                   help="parent of the brokers' data dirs (the fsync figure is measured there) [a new dir in $TMPDIR]")
    p.add_argument("--messages", type=int, help="messages per publish / e2e phase (all publishers together)")
    p.add_argument("--latency-messages", type=int, help="messages in the sync latency phase")
    p.add_argument("--duration", type=float, help="cap each publisher at this many seconds (count still caps)")
    p.add_argument("--size", type=int, default=128, help="message body bytes [128]")
    p.add_argument("--durable", action="store_true", help="send durable messages")
    p.add_argument("--publishers", type=int, default=2, help="publisher processes [2]")
    p.add_argument("--consumers", type=int, default=2, help="consumer processes in the e2e phase [2]")
    p.add_argument("--window", type=int, default=200, help="unsettled messages in flight per publisher [200]")
    p.add_argument("--credit", type=int, default=200, help="credit window per consumer [200]")
    p.add_argument("--nice", type=int, default=-10,
                   help="nice value for broker threads and client processes during phases, so that other jobs on "
                        "the machine disturb less (needs root; 0 = leave alone) [-10]")
    p.add_argument("--repeat", type=int, help="run each phase this many times per target (medians are reported)")
    p.add_argument("--ours-arg", action="append", default=[], help="extra ha-broker flag (repeatable)")
    p.add_argument("--out", type=Path, default=RESULTS, help="directory for the JSON results [bench/results]")
    p.add_argument("--keep-workdir", action="store_true", help="keep broker data and logs (path printed)")
    args = p.parse_args(argv)
    for k, v in PRESETS[args.preset].items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    if args.targets is None:
        args.targets = ",".join(DEFAULT)
    if args.phases is None:
        args.phases = ",".join(DEFAULT_PHASES)
    try:
        from broker.config import parse_size

        parse_size(args.max_memory)
    except ValueError as e:
        p.error(f"--max-memory: {e}")
    unknown = [t for t in args.targets.split(",") if t not in SCENARIOS]
    if unknown:
        p.error(f"unknown target(s) {', '.join(unknown)}; known: {', '.join(SCENARIOS)}")
    bad = [ph for ph in args.phases.split(",") if ph not in ALL_PHASES]
    if bad:
        p.error(f"unknown phase(s) {', '.join(bad)}; known: {', '.join(ALL_PHASES)}")
    try:
        args.catchup_sizes = [int(v) for v in str(args.catchup_messages).split(",") if v.strip()]
    except ValueError:
        p.error(f"--catchup-messages: a comma list of integers, not {args.catchup_messages!r}")
    return args


def for_target(spec: PhaseSpec, target: Target) -> PhaseSpec:
    """The phase as run against `target`: durable messages when the target asks for them (its durable variant)."""
    return dataclasses.replace(spec, durable=True) if target.durable_messages else spec


def phase_specs(args: argparse.Namespace) -> list[PhaseSpec]:
    common = {"duration": args.duration, "size": args.size, "durable": args.durable, "credit": args.credit,
              "nice": args.nice}
    specs = {
        "publish": PhaseSpec("publish", args.publishers, 0, args.messages, window=args.window, **common),
        "e2e": PhaseSpec("e2e", args.publishers, args.consumers, args.messages, window=args.window, **common),
        "latency": PhaseSpec("latency", 1, 0, args.latency_messages, window=1, **common),
    }
    return [specs[name] for name in args.phases.split(",") if name in specs]


def cpu_idle(sys_root: Path = Path("/sys")) -> dict[str, Any]:
    """How an idle CPU waits: the cpuidle driver and governor and, in a KVM guest with the haltpoll driver, how long
    it polls before it halts (`guest_halt_poll_ns`; 0: it halts at once, and waking it from another core costs a
    trip through the hypervisor: ~34 µs a loopback hop on the reference VM against ~5 µs polling,
    docs/performance.md). Empty where the files are not there."""
    def read(path: Path) -> str | None:
        try:
            return path.read_text().strip()
        except OSError:
            return None

    base = sys_root / "devices/system/cpu/cpuidle"
    governor = read(base / "current_governor_ro") or read(base / "current_governor")
    found: dict[str, Any] = {"driver": read(base / "current_driver"), "governor": governor}
    poll = read(sys_root / "module/haltpoll/parameters/guest_halt_poll_ns")
    if poll is not None and poll.isdigit():
        found["guest_halt_poll_ns"] = int(poll)
    return {k: v for k, v in found.items() if v is not None}


def describe_cpu_idle(idle: dict[str, Any]) -> str:
    """One line for the run's header (pure)."""
    if not idle:
        return "CPU idle: not known"
    text = f"CPU idle: {idle.get('driver', '?')} driver, {idle.get('governor', '?')} governor"
    poll = idle.get("guest_halt_poll_ns")
    if poll == 0:
        text += ("; guest_halt_poll_ns 0: an idle vCPU halts at once, so each wake-up of another core goes through "
                 "the hypervisor (latencies and the hop include it)")
    elif poll is not None:
        text += f"; an idle vCPU polls up to {poll / 1000:g} µs before it halts"
    return text


def machine() -> dict[str, Any]:
    model = ""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            model = line.split(":", 1)[1].strip()
            break
    mem = Path("/proc/meminfo").read_text().splitlines()[0].split()[1]
    import proton

    return {"cpu": model, "cores": os.cpu_count(), "mem_gib": round(int(mem) / 2**20, 1),
            "kernel": platform.release(), "python": platform.python_version(), "cpu_idle": cpu_idle(),
            "proton": getattr(proton, "VERSION", None) and ".".join(map(str, proton.VERSION))}


def source_commit() -> str | None:
    """The checked-out commit of the tree the brokers run from, '+dirty' when files differ from it."""
    import subprocess

    root = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return (head + ("+dirty" if dirty else "")) if head else None


def background_busy_share(seconds: float = 1.0) -> float:
    """Share of the machine's CPU busy with other work while the bench is idle (other jobs skew every figure)."""
    b0, t0 = procstat.machine_busy()
    time.sleep(seconds)
    b1, t1 = procstat.machine_busy()
    return (b1 - b0) / (t1 - t0) if t1 > t0 else 0.0


def choose_loadgen(args: argparse.Namespace) -> Path | None:
    """The C load generator when --client c (or by default, when it builds); None for the Python clients."""
    if args.client == "python":
        return None
    binary, why = native.try_loadgen()
    if binary is None:
        if args.client == "c":
            sys.exit(f"bench: --client c, but the C load generator does not build: {why}")
        print(f"bench: C load generator not available ({why}); using the Python clients", file=sys.stderr)
        args.client = "python"
        return None
    args.client = "c"
    return binary


def make_target(name: str, args: argparse.Namespace) -> Target:
    t = SCENARIOS[name]()
    if name.startswith("ours") and args.ours_arg:
        t.extra_args = list(args.ours_arg)  # type: ignore[attr-defined]
    return t


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    started = dt.datetime.now(dt.UTC)
    if args.workdir is not None:
        args.workdir.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="understudy-bench-", dir=args.workdir))
    specs = phase_specs(args)
    runs: list[dict[str, Any]] = []
    catchups: list[dict[str, Any]] = []
    recoveries: list[dict[str, Any]] = []
    memories: list[dict[str, Any]] = []
    do_catchup = "catchup" in args.phases.split(",")
    infos: dict[str, dict[str, Any]] = {}
    failures: dict[str, str] = {}
    names = args.targets.split(",")
    loadgen = choose_loadgen(args)
    phases = args.phases.split(",")
    commit = source_commit()  # at the start: brokers started later run the code of this moment or newer
    print(f"== source: {commit}", file=sys.stderr, flush=True)
    print(f"== {describe_cpu_idle(cpu_idle())}", file=sys.stderr, flush=True)
    hop_result = hop.measure(loadgen or native.try_loadgen()[0], args.hop_count)  # in C whenever it builds
    print(f"== loopback one-way hop: {hop_result['hop_us']:.1f} µs (half the median TCP round trip of 1-byte "
          f"messages, {hop_result['method']})", file=sys.stderr, flush=True)
    fsync_result = fsync.measure(workdir, args.fsync_count)
    print(f"== disk: write + fdatasync p50 {fsync_result['p50_us']:.0f} µs, p99 {fsync_result['p99_us']:.0f} µs "
          f"({fsync_result['size']}-byte writes into a zero-filled file, {fsync_result['filesystem']}; appending: "
          f"p50 {fsync_result.get('append_p50_us', float('nan')):.0f} µs)"
          + "".join(f", {w} writers at once p50 {v:.0f} µs"
                    for w, v in (fsync_result.get("concurrent_p50_us") or {}).items())
          + (f", ERROR {fsync_result['error']}" if fsync_result["error"] else ""), file=sys.stderr, flush=True)
    try:
        for name in names:
            target = make_target(name, args)
            background = background_busy_share()
            print(f"== {name}: starting (machine busy before start: {background:.0%})", file=sys.stderr, flush=True)
            try:
                with target:
                    target.start(workdir)
                    infos[name] = dataclasses.asdict(target.info())
                    infos[name]["background_busy_share"] = background
                    if "rss" in phases:
                        n = args.rss_messages if name.startswith("ours") else min(args.rss_messages, RSS_OTHERS_MAX)
                        rr = run_rss(target, n, args.size, args.durable or target.durable_messages,
                                     loadgen).as_dict()
                        runs.append(rr)
                        print(f"   {name} rss {n}: {rr['overhead_bytes_per_msg']:.0f} B/msg over the "
                              f"{args.size}-byte body (per role: "
                              + ", ".join(f"{k} {v:.0f}" for k, v in rr["bytes_per_msg"].items()) + " B/msg)"
                              + (f", ERRORS {rr['errors']}" if rr["errors"] else ""), file=sys.stderr, flush=True)
                    for rep in range(args.repeat):
                        for spec in specs:
                            r = run_phase(target, for_target(spec, target), loadgen=loadgen).as_dict()
                            r["repeat"] = rep
                            runs.append(r)
                            print(f"   {name} {spec.name} #{rep + 1}: {r['messages']} msgs, {r['rate']:,.0f} msg/s, "
                                  f"broker {r['broker_us_per_msg']:.1f} µs/msg"
                                  + (f", {'sync' if spec.name == 'latency' else 'confirm'} p50 "
                                     f"{r['latency_ms']['p50']:.3f} ms" if r["latency_ms"] else "")
                                  + (f", e2e p50 {r['e2e_latency_ms']['p50']:.1f} ms" if r["e2e_latency_ms"] else "")
                                  + f", client {r['client_us_per_msg']:.1f} µs/msg"
                                  + (f", ERRORS {r['errors']}" if r["errors"] else ""), file=sys.stderr, flush=True)
                    if do_catchup and isinstance(target, OursReplicated):
                        for n in args.catchup_sizes:
                            c = run_catchup(target, n, args.size, args.durable or target.durable_messages,
                                            loadgen=loadgen or
                                            native.try_loadgen()[0], publisher_rate=args.catchup_publisher_rate
                                            ).as_dict()
                            catchups.append(c)
                            print(f"   {name} catchup {n}: ready after {c['seconds']:.1f} s "
                                  f"(start-up {c['startup_seconds']:.1f} s), {c['catchup_rate']:,.0f} msg/s, "
                                  f"broker {c['broker_us_per_msg']:.1f} µs/msg, live publisher "
                                  f"{c['publisher_rate']:,.0f} msg/s"
                                  + (f", ERRORS {c['errors']}" if c["errors"] else ""), file=sys.stderr, flush=True)
                    standalone_durable = type(target) is OursStandalone and target.durable
                    if "recovery" in phases and standalone_durable and args.recovery_messages > 0:
                        assert isinstance(target, OursStandalone)
                        rc = run_recovery(target, args.recovery_messages, args.size,
                                          loadgen or native.loadgen()).as_dict()
                        recoveries.append(rc)
                        print(f"   {name} recovery {rc['messages']:,}: journal.recovered "
                              f"{rc['journal_seconds']:.2f} s ({rc['journal_messages']:,} messages), start to "
                              f"management answer {rc['answer_seconds']:.2f} s, depth {rc['depth_after']:,}"
                              + (f", ERRORS {rc['errors']}" if rc["errors"] else ""), file=sys.stderr, flush=True)
                    if "memory" in phases and standalone_durable and args.memory_messages > 0:
                        assert isinstance(target, OursStandalone)
                        print(f"   {name} memory: filling {args.memory_messages:,} durable messages with "
                              f"--max-memory {args.max_memory}", file=sys.stderr, flush=True)
                        mr = run_memory(target, args.memory_messages, args.size, args.max_memory,
                                        loadgen or native.loadgen()).as_dict()
                        memories.append(mr)
                        print(f"   {name} memory {mr['messages']:,}: peak RSS {mr['peak_rss'] / 2**20:.0f} MiB "
                              f"(baseline {mr['baseline_rss'] / 2**20:.0f} MiB, bound {mr['bound'] / 2**20:.0f} "
                              f"MiB), fill {mr['fill_rate']:,.0f} msg/s, depth {mr['depth_after']:,}"
                              + (f", ERRORS {mr['errors']}" if mr["errors"] else ""), file=sys.stderr, flush=True)
            except Exception as e:
                failures[name] = f"{type(e).__name__}: {e}"
                traceback.print_exc()
    finally:
        if args.keep_workdir:
            print(f"work directory kept: {workdir}", file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    kinds = {n: i["kind"] for n, i in infos.items()}
    table = report.markdown(runs, names, kinds, catchups, hop=hop_result, client=args.client, fsync=fsync_result,
                            recoveries=recoveries, memories=memories)
    out = {"started": started.isoformat(), "commit": commit, "machine": machine(), "config": {k: (str(v) if isinstance(v, Path) else v)
                                                                           for k, v in vars(args).items()},
           "client": args.client, "loadgen": str(loadgen) if loadgen else None, "hop": hop_result,
           "fsync": fsync_result, "targets": infos, "failures": failures, "runs": runs, "catchup": catchups,
           "recovery": recoveries, "memory": memories, "table_markdown": table}
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{started.strftime('%Y%m%dT%H%M%SZ')}.json"
    path.write_text(json.dumps(out, indent=2, default=str) + "\n")
    print(table)
    print(f"\nresults: {path}")
    if failures:
        print(f"failed targets: {failures}", file=sys.stderr)
        sys.exit(1)
