"""The chaos run's I/O edge: a cluster of real brokers under load from publishers with message-ids and a consumer
that accepts, hurt by the faults of a seeded schedule (tests/chaos/model.py).

Two coordinators: ZooKeeper (the default), where each broker reaches ZooKeeper through its own `TcpProxy`, so
cutting a broker off (`cut-primary`) black-holes its ZooKeeper session too; or `local`, understudy-cluster's
manager (ha.local_cluster) turning in a thread of the run, with no coordinator in the brokers (the path Pacemaker
takes too): the manager promotes, fences a primary that stops answering and restarts the dead, so the run kills and
stops brokers but restarts none. `cut-primary` drops the primary's AMQP port with iptables (INPUT, both directions,
on loopback); every rule is removed at the end. After each fault the run waits until the cluster is whole again
(one active primary, every other broker ready) before the next one, and records how long publishers went without a
confirmation.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from broker.client import ManagementClient, ManagementError
from ha.local_cluster import Manager, Member, make_members
from tests.chaos.model import Fault, Kind, Verdict, check, recovery_table, schedule
from tests.support.cluster import Cluster, free_port_run
from tests.support.numbered import numbers, spawn
from tests.support.procs import BrokerFactory, BrokerProcess
from tests.zk.harness import TcpProxy, ZooKeeperServer, ensure_installed

QUEUE = "chaos"
SECOND = 10_000_000  # the second publisher's numbers start here
FIRSTS = (1, SECOND)
SUPERVISOR_DELAY = 10.0  # seconds after which a killed primary nobody replaced is restarted
# Message-ids the queue remembers: a publisher resends only the message it had in flight, seconds after a failure,
# so minutes of traffic is ample (ActiveMQ Artemis keeps 20,000 by default). 1,000,000 (more than a run sent) made
# every catch-up carry up to 25 MB of ids in one pass of each loop, longer than the 1 s the 0.5 s heartbeat allows:
# backups flapped from ~550k messages on (docs/reliability.md, docs/replication.md).
WINDOW = 100_000


class ChaosError(AssertionError):
    """The cluster did not recover from a fault in time (the message names the seed and the fault)."""


class LocalCluster:
    """understudy-cluster's brokers (`Member`s, which the run's faults use like `BrokerProcess`es) and its manager,
    turning every 0.25 s in a thread, as `understudy-cluster` does every 0.5 s."""

    def __init__(self, workdir: Path, heartbeat: float, fence_after: float, log: Callable[[str], None]) -> None:
        self.brokers: list[Member] = make_members(3, free_port_run(3), workdir, heartbeat,
                                                  extra=["--ha-backup-timeout", "2"])
        self.manager = Manager(self.brokers, fence_after=fence_after, out=log)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._turn, name="manager", daemon=True)

    def _turn(self) -> None:
        while not self._stop.wait(0.25):
            self.manager.step(timeout=1.0)

    def start(self) -> None:
        for m in self.brokers:
            m.start()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(30)
        for m in self.brokers:
            m.kill()  # (stopped ones too)

    def kill_all_at_once(self) -> None:
        procs = [m.proc for m in self.brokers if m.alive and m.proc is not None]
        for p in procs:
            p.kill()
        for p in procs:
            p.wait(10)

    def __getitem__(self, i: int) -> Member:
        return self.brokers[i]

    @property
    def urls(self) -> list[str]:
        return [m.url for m in self.brokers]


def _size(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


def iptables_usable() -> bool:
    return shutil.which("iptables") is not None and os.geteuid() == 0 and subprocess.run(
        ["iptables", "-L", "INPUT", "-n"], capture_output=True).returncode == 0


@dataclass
class Run:
    seed: int
    faults: int
    workdir: Path
    session: float = 1.5
    recover_timeout: float = 90.0
    coordinator: str = "zookeeper"  # or "local": understudy-cluster's manager (module docstring)
    fence_after: float = 2.0  # local: seconds a silent primary lives before the manager kills it
    log: Callable[[str], None] = print
    kinds: set[Kind] | None = None
    cover: bool = False  # each kind once first (model.schedule)
    recovery: dict[Kind, list[float]] = field(default_factory=lambda: defaultdict(list))
    whole: dict[Kind, list[float]] = field(default_factory=lambda: defaultdict(list))
    done: list[dict[str, Any]] = field(default_factory=list)
    rules: list[list[str]] = field(default_factory=list)
    supervised: int = 0  # killed primaries the cluster could not do without (restarted, as a supervisor would)

    # ----- set-up ---------------------------------------------------------------------------------------------
    def execute(self) -> dict[str, Any]:
        """Run the whole schedule; return the report (verdict, recovery table, fault log)."""
        if self.local:
            if self.kinds is None:
                self.kinds = {k for k in Kind if k is not Kind.STOP_ZOOKEEPER}
            self.kinds.discard(Kind.STOP_ZOOKEEPER)
        else:
            ensure_installed()
        if not iptables_usable():
            self.kinds = (self.kinds or set(Kind)) - {Kind.CUT_PRIMARY}
            self.log("iptables is not usable here (root and iptables needed): no cut-primary faults")
        plan = schedule(self.seed, self.faults, self.session, only=self.kinds, cover=self.cover)
        zk = None if self.local else ZooKeeperServer(self.workdir / "zookeeper")
        if zk is not None:
            zk.start()
            self.zk = zk
        self.proxies: list[TcpProxy] = []
        factory = BrokerFactory(self.workdir)
        started = time.monotonic()
        try:
            c: Cluster | LocalCluster
            c = LocalCluster(self.workdir, 0.5, self.fence_after, self.log) if zk is None else self._cluster(factory, zk)
            self.cluster = c
            c.start()
            self._wait_whole("start")
            with ManagementClient(self._primary_url()) as m:
                # publishers resend what was not confirmed, with the same message-id: the window drops the copies
                m.call("CREATE", "queue", QUEUE, {"arguments": {"durable": True, "duplicate-window": WINDOW}})
            self.acked = [self.workdir / "acked-a.txt", self.workdir / "acked-b.txt"]
            received = self.workdir / "received.txt"
            common = ["--patience", "600", "--timeout", "3"]
            senders = [spawn("send", c.urls, QUEUE, self.acked[0], "--count", "5000000", "--id-prefix", "a-", *common),
                       spawn("send", c.urls, QUEUE, self.acked[1], "--count", "5000000", "--first", str(SECOND),
                             "--id-prefix", "b-", *common)]
            self.flagged = self.workdir / "redelivered.txt"
            consumer = spawn("receive", c.urls, QUEUE, received, "--idle", "600", "--patience", "600",
                             "--redelivered-out", str(self.flagged),
                             "--times-out", str(self.workdir / "received-times.txt"),
                             "--history-out", str(self.workdir / "history.txt"))
            self.children = [*senders, consumer]
            try:
                self._confirming(time.monotonic(), "load start")
                for f in plan:
                    self._one(f)
            finally:
                for s in senders:
                    s.kill()
                    s.wait(10)
            self._drain(received, consumer)
            verdict = self._verdict(received)
        finally:
            for child in getattr(self, "children", []):
                if child.poll() is None:
                    child.kill()
                    child.wait(10)
            self._heal_all()
            local = getattr(self, "cluster", None)
            if isinstance(local, LocalCluster):
                local.stop()
            for b in factory.brokers:
                if b.alive and b.proc is not None:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(b.proc.pid, signal.SIGCONT)
            for _ in factory.cleanup():
                pass
            for p in self.proxies:
                p.close()
            if zk is not None:
                zk.stop()
        return self._report(verdict, time.monotonic() - started)

    @property
    def local(self) -> bool:
        return self.coordinator == "local"

    def _cluster(self, factory: BrokerFactory, zk: ZooKeeperServer) -> Cluster:
        chroot = f"/chaos-{self.seed}"
        c = Cluster(factory, 3, ["--ha-coordinator", "zookeeper", "--zk-hosts", "PROXY", "--zk-path", chroot,
                                 "--zk-session-timeout", str(self.session),
                                 # never settle alone: a primary that lost its backups (e.g. stopped, then
                                 # resumed after the others moved on) must not confirm what they will not have
                                 "--ha-min-ready-backups", "1"], heartbeat=0.5)
        for b in c.brokers:
            proxy = TcpProxy(zk.port)
            self.proxies.append(proxy)
            b.args[b.args.index("PROXY")] = proxy.address
        return c

    # ----- one fault --------------------------------------------------------------------------------------------
    def _one(self, f: Fault) -> None:
        c = self.cluster
        time.sleep(f.pause)
        p = self._primary_index()
        backups = [i for i in range(len(c.brokers)) if i != p]
        backup = backups[int(f.pick * len(backups))]
        t0 = time.monotonic()
        what = f"fault {f.index} {f.kind.value} (seed {self.seed})"
        confirm: float | None = None
        if f.kind is Kind.KILL_PRIMARY:
            c[p].kill()
            if not self.local:  # (local: the manager promotes a ready backup and restarts this one as a backup)
                confirm = self._restart_killed_primary(p, t0, what)
        elif f.kind is Kind.STOP_PRIMARY:
            self._pause(c[p], f.duration)
        elif f.kind is Kind.KILL_BACKUP:
            c[backup].kill()
            time.sleep(f.duration)
            if not self.local:  # (the manager restarts it at once)
                c[backup].start()
        elif f.kind is Kind.STOP_BACKUP:
            self._pause(c[backup], f.duration)
        elif f.kind is Kind.CUT_PRIMARY:
            self._cut(p)
            time.sleep(f.duration)
            self._heal_all()
        elif f.kind is Kind.STOP_ZOOKEEPER:
            self.zk.stop()
            time.sleep(f.duration)
            self.zk.start()
        elif f.kind is Kind.KILL_ALL:
            c.kill_all_at_once()
            if isinstance(c, Cluster):  # (local: the manager restarts them all and promotes the newest store)
                order = random.Random(f.pick).sample(range(len(c.brokers)), len(c.brokers))
                for i in order:
                    c[i].start(wait=False)
                for b in c.brokers:
                    b.wait_started()
        if confirm is None:
            confirm = self._confirming(t0, what)
        whole = self._wait_whole(what) - t0
        self.recovery[f.kind].append(confirm)
        self.whole[f.kind].append(whole)
        self.done.append({"index": f.index, "fault": f.kind.value, "duration": f.duration,
                          "at": round(time.time() - (time.monotonic() - t0), 3), "target":
                          "all" if f.kind is Kind.KILL_ALL else c[p if "primary" in f.kind.value else backup].name,
                          "confirming_after": round(confirm, 3), "whole_after": round(whole, 3)})
        self.log(f"{what}: confirming after {confirm:.2f}s, whole after {whole:.2f}s")

    def _restart_killed_primary(self, p: int, t0: float, what: str) -> float:
        c = self.cluster
        try:  # the others take over: it comes back as a backup
            confirm = self._confirming(t0, what, timeout=2 * self.session + SUPERVISOR_DELAY)
            c[p].start()
        except ChaosError:
            # Nobody else may take over (no backup was ready with it: it had dropped them and settled alone).
            # A supervisor (Pacemaker, systemd, understudy-cluster) restarts it; its store is the newest.
            self.supervised += 1
            c[p].start()
            confirm = self._confirming(t0, what)
        return confirm

    @staticmethod
    def _pause(b: BrokerProcess | Member, seconds: float) -> None:
        assert b.proc is not None
        pid = b.proc.pid
        os.killpg(pid, signal.SIGSTOP)
        try:
            time.sleep(seconds)
        finally:
            with contextlib.suppress(ProcessLookupError):  # the local manager may have killed it (fenced)
                os.killpg(pid, signal.SIGCONT)

    def _cut(self, i: int) -> None:
        port = self.cluster[i].port
        for rule in (["-p", "tcp", "--dport", str(port), "-j", "DROP"],
                     ["-p", "tcp", "--sport", str(port), "-j", "DROP"]):
            subprocess.run(["iptables", "-I", "INPUT", *rule], check=True)
            self.rules.append(rule)
        if self.proxies:  # ZooKeeper: its session too
            self.proxies[i].blackhole()

    def _heal_all(self) -> None:
        while self.rules:
            rule = self.rules.pop()
            subprocess.run(["iptables", "-D", "INPUT", *rule], check=False)
        for p in getattr(self, "proxies", []):
            p.heal()

    # ----- waiting ----------------------------------------------------------------------------------------------
    def _status(self, b: BrokerProcess | Member) -> dict[str, Any] | None:
        if not b.alive:
            return None
        try:
            with ManagementClient(b.url, timeout=1.0) as m:
                body: dict[str, Any] = m.call("STATUS", "ha-broker").body
                return body
        except (ManagementError, OSError):
            return None

    def _statuses(self) -> list[dict[str, Any] | None]:
        return [self._status(b) for b in self.cluster.brokers]

    def _primary_index(self) -> int:
        for i, st in enumerate(self._statuses()):
            if st is not None and st["role"] == "primary" and st["state"] == "active":
                return i
        raise ChaosError(f"no active primary (seed {self.seed})")

    def _primary_url(self) -> str:
        return self.cluster[self._primary_index()].url

    def _until(self, cond: Callable[[], bool], what: str, timeout: float | None = None) -> float:
        limit = self.recover_timeout if timeout is None else timeout
        deadline = time.monotonic() + limit
        while not cond():
            if time.monotonic() > deadline:
                states = [(s or {}).get("state") for s in self._statuses()]
                raise ChaosError(f"{what}: not recovered in {limit:.0f}s (states {states})")
            time.sleep(0.05)
        return time.monotonic()

    def _wait_whole(self, what: str) -> float:
        def whole() -> bool:
            """One active primary whose own member list has every other broker ready (a backup's own 'ready'
            is not enough: after losing its primary it stays ready, for the election, until it rejoins)."""
            sts = self._statuses()
            prim = [s for s in sts if s is not None and s["role"] == "primary"]
            if len(prim) != 1 or prim[0]["state"] != "active":
                return False
            listed = {m.get("name"): m.get("state") for m in prim[0].get("members") or []}
            others = [b.name for b in self.cluster.brokers if b.name != prim[0]["name"]]
            return all(s is not None for s in sts) and all(listed.get(n) == "ready" for n in others)

        return self._until(whole, f"{what}: cluster whole")

    def _confirming(self, t0: float, what: str, timeout: float | None = None) -> float:
        """Seconds from t0 until both publishers confirmed a message after t0."""
        base = [_size(a) for a in self.acked]

        def moved() -> bool:  # the files only grow, a line per confirmation: their sizes tell (cheap at 20 Hz)
            return all(_size(a) > n for a, n in zip(self.acked, base, strict=True))

        return self._until(moved, f"{what}: publishers confirming", timeout) - t0

    def _drain(self, received: Path, consumer: subprocess.Popen[bytes]) -> None:
        """Wait until the consumer accepted everything on the queue, then stop it."""
        def empty() -> bool:
            try:
                with ManagementClient(self._primary_url(), timeout=2.0) as m:
                    q = m.call("READ", "queue", QUEUE).body
                return bool(q["depth"] == 0 and q.get("acquired", 0) == 0)
            except (ManagementError, OSError, ChaosError):
                return False

        self._until(empty, f"drain (seed {self.seed})")
        time.sleep(0.5)
        consumer.kill()
        consumer.wait(10)

    # ----- verdict ----------------------------------------------------------------------------------------------
    def _verdict(self, received: Path) -> Verdict:
        confirmed: list[str] = []
        attempted: list[str] = []
        for path, first in zip(self.acked, FIRSTS, strict=True):
            got = numbers(path)
            confirmed += [str(n) for n in got]
            top = max(got, default=first - 1)
            attempted += [str(n) for n in range(first, top + 2)]  # in order; the next was in flight at the end
        history_file = self.workdir / "history.txt"
        history = [(k, n) for k, n in (line.split() for line in history_file.read_text().splitlines())]
        return check(attempted, confirmed, [str(n) for n in numbers(received)], history)

    def _report(self, v: Verdict, seconds: float) -> dict[str, Any]:
        counts: dict[str, int] = defaultdict(int)
        for d in self.done:
            counts[d["fault"]] += 1
        return {
            "seed": self.seed, "coordinator": self.coordinator, "faults": len(self.done), "cover": self.cover,
            "session_timeout": self.session, "fence_after": self.fence_after if self.local else None,
            "seconds": round(seconds, 1), "mix": dict(sorted(counts.items())), "verdict": v.summary(),
            "primary_restarted_to_recover": self.supervised,
            # duplicates whose second delivery said so (delivery-count > 0): a consumer can tell them
            "duplicated_flagged": len(v.duplicated.keys() & {str(n) for n in numbers(self.flagged)}),
            "lost": v.lost[:50], "duplicated": dict(list(v.duplicated.items())[:50]), "unexpected": v.unexpected[:50],
            "redelivered": dict(list(v.redelivered.items())[:50]),
            "confirming_after": recovery_table(self.recovery), "whole_after": recovery_table(self.whole),
            "log": self.done,
        }


def markdown(report: dict[str, Any]) -> Iterator[str]:
    v = report["verdict"]
    how = (f"understudy-cluster's manager, fencing after {report['fence_after']} s"
           if report.get("coordinator") == "local" else f"ZooKeeper session {report['session_timeout']} s")
    first = ", every kind once first" if report.get("cover") else ""
    yield f"seed {report['seed']}, {report['faults']} faults in {report['seconds']:.0f} s ({how}{first})"
    if report.get("primary_restarted_to_recover"):
        yield (f"{report['primary_restarted_to_recover']} killed primaries had to be restarted before the cluster "
               "recovered (no backup was ready with them: they had dropped their backups and settled alone)")
    yield ""
    yield "| attempted | confirmed | delivered | lost | duplicated | redelivered (accept unconfirmed) | unexpected | recovered |"
    yield "|---|---|---|---|---|---|---|---|"
    yield (f"| {v['attempted']} | {v['confirmed']} | {v['delivered']} | {v['lost']} | {v['duplicated']} "
           f"({report['duplicated_flagged']} flagged redelivered) | {v.get('redelivered', 0)} | {v['unexpected']} "
           f"| {v['recovered']} |")
    yield ""
    yield "| fault | count | confirming again p50 / p99 (s) | cluster whole p50 / p99 (s) |"
    yield "|---|---|---|---|"
    whole = {r["fault"]: r for r in report["whole_after"]}
    for r in report["confirming_after"]:
        w = whole[r["fault"]]
        yield f"| {r['fault']} | {r['count']} | {r['p50']:.2f} / {r['p99']:.2f} | {w['p50']:.2f} / {w['p99']:.2f} |"


def write_report(report: dict[str, Any], out: Path) -> None:
    out.write_text(json.dumps(report, indent=1) + "\n")
