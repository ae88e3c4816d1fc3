"""`python -m tests.chaos --faults 1000 [--seed N] [--out report.json]`: the chaos run from the command line (the
soak's figures for docs/reliability.md). Exit status 0 when nothing was lost, duplicated or unexpected, 1 otherwise,
2 when the cluster did not recover from a fault."""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
from pathlib import Path

from tests.chaos.model import Kind
from tests.chaos.runner import ChaosError, Run, markdown, write_report
from tests.support.signals import interrupt_on_sigterm


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.chaos", description=__doc__)
    ap.add_argument("--faults", type=int, default=30)
    ap.add_argument("--seed", type=int, default=None, help="names the run (random if not given; always printed)")
    ap.add_argument("--session", type=float, default=1.5,
                    help="ZooKeeper session timeout in seconds (the unit of fault durations either way)")
    ap.add_argument("--coordinator", choices=["zookeeper", "local"], default="zookeeper",
                    help="who promotes: ZooKeeper, or understudy-cluster's manager (no coordinator in the brokers)")
    ap.add_argument("--fence-after", type=float, default=2.0,
                    help="local: seconds a silent primary lives before the manager kills it")
    ap.add_argument("--only", default="", help="comma list of fault kinds: " + ", ".join(k.value for k in Kind))
    ap.add_argument("--cover", action="store_true",
                    help="each fault kind once first, then weighted draws (what the default suite runs)")
    ap.add_argument("--out", type=Path, help="write the JSON report here")
    ap.add_argument("--workdir", type=Path, help="keep brokers' logs and data here (default: a temporary dir)")
    a = ap.parse_args()
    seed = a.seed if a.seed is not None else random.randrange(1 << 30)
    interrupt_on_sigterm()  # clean up (processes, iptables rules) when stopped
    kinds = {Kind(x.strip()) for x in a.only.split(",") if x.strip()} or None
    print(f"chaos: {a.faults} faults, seed {seed}, coordinator {a.coordinator}"
          f"{', every kind once first' if a.cover else ''}", flush=True)
    workdir = a.workdir or Path(tempfile.mkdtemp(prefix="chaos-"))
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        report = Run(seed, a.faults, workdir, session=a.session, kinds=kinds, coordinator=a.coordinator,
                     cover=a.cover, fence_after=a.fence_after, log=lambda s: print(s, flush=True)).execute()
    except ChaosError as e:
        print(f"chaos: {e} (workdir {workdir})", file=sys.stderr)
        return 2
    if a.out:
        write_report(report, a.out)
    print("\n".join(markdown(report)))
    print(json.dumps(report["verdict"]))
    v = report["verdict"]
    return 0 if not (v["lost"] or v["duplicated"] or v["unexpected"]) else 1


if __name__ == "__main__":
    sys.exit(main())
