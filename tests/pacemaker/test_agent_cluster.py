"""Issue 4 end to end: three real Understudy brokers under real Pacemaker + Corosync (one per namespace), the
``ocf:understudy:understudy`` promotable clone and an IPaddr2 VIP set up by ``ha.pacemaker.setup_commands``, and
a client in a fourth namespace that only knows the VIP."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from itertools import combinations
from pathlib import Path

import pytest

from ha.pacemaker import PacemakerSetup, setup_commands
from tests.pacemaker.agent import VENV_BIN, ha_admin_supports
from tests.pacemaker.crm_status import ClusterStatus
from tests.pacemaker.netns import Cluster, Node, wait_for

pytestmark = [
    pytest.mark.pacemaker,
    pytest.mark.skipif(
        not ha_admin_supports("promote", "query", "demote", "ping"),
        reason="needs HA broker: ha-admin ping/query/promote/demote not available yet",
    ),
]

PORT = 5672
VIP = "10.77.0.100"
RSC = "understudy"
PYTHON = str(VENV_BIN / "python")
CLIENT = str(Path(__file__).with_name("vip_client.py"))
FAILOVER_GOAL_S = 5.0


def setup_for(cluster: Cluster) -> PacemakerSetup:
    return PacemakerSetup(
        vip=VIP,
        nic="eth0",
        agent_params={
            "bindir": str(VENV_BIN),
            "brokers_url": ",".join(f"{n.address}:{PORT}" for n in cluster.nodes),
            "public_url": f"{VIP}:{PORT}",
            "data_dir": "/var/lib/understudy",
            "port": str(PORT),
            "monitor_timeout": "3",
            "options": "--auto-create-queues",
        },
    )


def primary_with_vip(s: ClusterStatus) -> bool:
    return len(s.promoted(RSC)) == 1 and s.started("understudy-vip") == s.promoted(RSC)


def query(cluster: Cluster, node: Node) -> dict[str, object]:
    proc = cluster.run(
        node, [str(VENV_BIN / "ha-admin"), "--broker", f"127.0.0.1:{PORT}", "--timeout", "3", "query"]
    )
    result: dict[str, object] = json.loads(proc.stdout)
    return result


def query_vip(cluster: Cluster) -> dict[str, object] | None:
    proc = cluster.client(
        [str(VENV_BIN / "ha-admin"), "--broker", f"{VIP}:{PORT}", "--timeout", "2", "query"], check=False
    )
    return json.loads(proc.stdout) if proc.returncode == 0 else None


def broker_pid(node: Node) -> int | None:
    """The broker's pid from its pid file (None while there is none, e.g. between stop and start)."""
    try:
        return int((node.path("/var/lib/understudy") / "broker.pid").read_text())
    except (OSError, ValueError):
        return None


def settled_windows(cluster: Cluster) -> list[tuple[str, float, float]]:
    """(broker, first_ts, last_ts) of every ``client.settled`` event in every broker's event log."""
    windows = []
    for node in cluster.nodes:
        log = node.path("/var/lib/understudy") / "broker.log"
        if not log.exists():
            continue
        for line in log.read_text(errors="replace").splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if event.get("event") == "client.settled":
                windows.append((str(event["broker"]), float(event["first_ts"]), float(event["last_ts"])))
    return windows


def overlapping_settlers(windows: list[tuple[str, float, float]]) -> list[tuple[str, str]]:
    return [
        (a[0], b[0]) for a, b in combinations(windows, 2) if a[0] != b[0] and a[1] <= b[2] and b[1] <= a[2]
    ]


def crash_and_fail_over(cluster: Cluster, old: Node, survivor: Node) -> ClusterStatus:
    """Crash the primary's node (link down, every process SIGKILLed); wait until another node is promoted and holds
    the VIP (asked through ``survivor``)."""
    cluster.kill_node(old)
    return cluster.wait_status(
        "another node promoted, with the VIP",
        lambda s: primary_with_vip(s) and s.promoted(RSC) != [old.name],
        timeout=90,
        via=survivor,
    )


class Sender:
    """The VIP client, sending numbered messages in the client namespace."""

    def __init__(self, cluster: Cluster, workdir: Path, queue: str, interval: float = 0.005) -> None:
        self.queue = queue
        self.log = workdir / f"{queue}-sent.log"
        self.proc = cluster.client_popen(
            [
                PYTHON,
                CLIENT,
                "send",
                "--url",
                f"{VIP}:{PORT}",
                "--queue",
                queue,
                "--log",
                str(self.log),
                "--interval",
                str(interval),
            ],
            workdir / f"{queue}-client.out",
        )

    def acked(self) -> list[tuple[float, int]]:
        if not self.log.exists():
            return []
        return [
            (float(ts), int(n))
            for ts, n in (line.split() for line in self.log.read_text().splitlines() if line)
        ]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture(scope="module")
def brokers(cluster: Cluster) -> Cluster:
    cluster.pcs_apply(setup_commands(setup_for(cluster)))
    cluster.wait_status("one primary broker with the VIP", primary_with_vip, timeout=120)
    wait_for(
        "a primary answering on the VIP", lambda: (q := query_vip(cluster)) and q["role"] == "primary", 60
    )
    return cluster


@pytest.fixture(autouse=True)
def steady(brokers: Cluster) -> Cluster:
    """Each test starts from a whole cluster (an earlier failed test may have left a node down or cut off)."""
    for node in brokers.nodes:
        if node.alive:
            brokers.heal(node)
        else:
            brokers.restart_node(node)
    brokers.wait_online([n.name for n in brokers.nodes])
    brokers.run(brokers.nodes[0], ["crm_resource", "--cleanup", "-r", RSC], check=False)
    brokers.wait_status(
        "one primary with the VIP, two backups",
        lambda s: primary_with_vip(s) and len(s.unpromoted(RSC)) == len(brokers.nodes) - 1,
        timeout=120,
    )
    return brokers


@pytest.fixture
def sender(brokers: Cluster, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Sender]:
    s = Sender(brokers, tmp_path, queue=request.node.name[:40].replace("[", "-").rstrip("]"))
    try:
        yield s
    finally:
        s.stop()


def test_clone_starts_one_primary_and_the_vip_follows_it(brokers: Cluster) -> None:
    status = brokers.status()
    primary = status.promoted(RSC)[0]
    assert sorted(status.unpromoted(RSC)) == sorted(n.name for n in brokers.nodes if n.name != primary)
    vip_view = query_vip(brokers)
    assert vip_view is not None and vip_view["role"] == "primary" and vip_view["name"] == primary
    for node in brokers.nodes:
        if node.name != primary:
            assert query(brokers, node)["role"] == "backup"


def test_crash_of_the_primary_node_fails_over_without_losing_acknowledged_messages(
    brokers: Cluster, sender: Sender
) -> None:
    wait_for("100 messages acknowledged before the crash", lambda: len(sender.acked()) >= 100, 60)
    old = brokers.node(brokers.status().promoted(RSC)[0])
    survivor = next(n for n in brokers.nodes if n is not old)
    crashed_at = time.time()
    new = crash_and_fail_over(brokers, old, survivor).promoted(RSC)[0]

    def first_settled_by_new_primary() -> float | None:
        starts = [
            first for broker, first, _ in settled_windows(brokers) if broker == new and first > crashed_at
        ]
        return min(starts) if starts else None

    first = wait_for("the new primary settles a client message", first_settled_by_new_primary, 90)
    failover = first - crashed_at
    print(
        f"\nunderstudy failover: {failover:.2f}s from SIGKILL of {old.name} to the first client message "
        f"settled by {new} (goal <= 5 s)"
    )
    # The goal is 5 s (3-4.5 s measured on an idle 2-core machine); twice that catches a regression without
    # failing a loaded CI machine.
    assert failover <= 2 * FAILOVER_GOAL_S, f"failover took {failover:.1f}s"
    wait_for(
        "100 messages through the new primary",
        lambda: sum(ts > crashed_at for ts, _ in sender.acked()) >= 100,
        60,
    )
    sender.stop()
    acked = {n for _, n in sender.acked()}
    drained = brokers.client([PYTHON, CLIENT, "drain", "--url", f"{VIP}:{PORT}", "--queue", sender.queue])
    received = {int(x) for x in drained.stdout.split()}
    assert acked - received == set(), f"acknowledged but lost: {sorted(acked - received)[:20]}"

    # the old primary's node comes back as a backup and catches up
    brokers.restart_node(old)
    brokers.wait_online([n.name for n in brokers.nodes])
    brokers.wait_status(f"{old.name} back as Unpromoted", lambda s: old.name in s.unpromoted(RSC), timeout=90)
    wait_for(f"{old.name} ready", lambda: query(brokers, old)["state"] == "ready", 90)


def test_hung_backup_fails_monitor_and_pacemaker_restarts_it(brokers: Cluster) -> None:
    status = brokers.wait_status("steady state", primary_with_vip)
    victim = brokers.node(status.unpromoted(RSC)[0])
    pid = broker_pid(victim)
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)
    try:
        # only a failed monitor makes Pacemaker restart a running broker
        wait_for("broker restarted with a new pid", lambda: broker_pid(victim) not in (None, pid), 90)
    finally:
        if Path(f"/proc/{pid}").exists():
            os.kill(pid, signal.SIGCONT)
    failures = brokers.run(victim, ["crm_mon", "-1", "--include=failures"]).stdout
    assert "does not answer management" in failures and victim.name in failures
    brokers.wait_status(
        f"{victim.name} Unpromoted again", lambda s: victim.name in s.unpromoted(RSC), timeout=90
    )
    brokers.run(victim, ["crm_resource", "--cleanup", "-r", RSC])


def test_promote_of_a_backup_in_catchup_is_refused(brokers: Cluster, tmp_path: Path) -> None:
    status = brokers.status()
    primary = brokers.node(status.promoted(RSC)[0])
    victim = brokers.node(status.unpromoted(RSC)[0])
    backlog = Sender(brokers, tmp_path, queue="backlog", interval=0.0)
    wait_for("5000 messages on the backlog queue", lambda: len(backlog.acked()) >= 5000, 180)
    backlog.stop()
    victim_log = victim.path("/var/lib/understudy") / "broker.log"
    seen = len(victim_log.read_text().splitlines())
    victim_pid = broker_pid(victim)
    assert victim_pid is not None
    os.kill(victim_pid, signal.SIGKILL)  # Pacemaker restarts it (monitor failure); it must catch up again

    def entered_catchup() -> bool:
        return any('"to_state": "catchup"' in line for line in victim_log.read_text().splitlines()[seen:])

    wait_for(f"{victim.name} restarted and catching up", entered_catchup, 90, interval=0.01)
    primary_pid = broker_pid(primary)
    assert primary_pid is not None
    os.kill(primary_pid, signal.SIGSTOP)  # freeze catch-up (briefly: Pacemaker monitors the primary)
    try:
        proc = brokers.run(
            victim,
            [str(VENV_BIN / "ha-admin"), "--broker", f"127.0.0.1:{PORT}", "--timeout", "2", "promote"],
            check=False,
        )
    finally:
        os.kill(primary_pid, signal.SIGCONT)
    assert proc.returncode == 1, proc.stdout
    assert (
        "refusing to promote a backup in state" in proc.stderr
    )  # catchup (or joining once it lost the primary)
    assert query(brokers, victim)["role"] == "backup"
    wait_for(f"{victim.name} ready again", lambda: query(brokers, victim)["state"] == "ready", 120)
    assert brokers.status().promoted(RSC) == [primary.name]


def test_partitioned_primary_loses_quorum_and_never_settles_alongside_the_new_one(
    brokers: Cluster, sender: Sender
) -> None:
    wait_for("messages flowing", lambda: len(sender.acked()) >= 50, 60)
    old = brokers.node(brokers.wait_status("steady state", primary_with_vip).promoted(RSC)[0])
    majority = next(n for n in brokers.nodes if n is not old)
    partitioned_at = time.time()
    brokers.partition(old)
    try:
        brokers.wait_status(
            "minority stops its broker",
            lambda s: not s.quorum and not s.promoted(RSC) and not s.unpromoted(RSC),
            timeout=90,
            via=old,
        )
        wait_for(
            "broker process gone on the minority",
            lambda: (pid := broker_pid(old)) is None or not Path(f"/proc/{pid}").exists(),
            60,
        )
        brokers.wait_status("majority promotes another broker", primary_with_vip, timeout=90, via=majority)
        wait_for(
            "messages acknowledged after the partition",
            lambda: [a for a in sender.acked() if a[0] > partitioned_at],
            90,
        )
    finally:
        brokers.heal(old)
    sender.stop()
    assert overlapping_settlers(settled_windows(brokers)) == []
    brokers.wait_online([n.name for n in brokers.nodes])
    brokers.wait_status("old primary back as backup", lambda s: old.name in s.unpromoted(RSC), timeout=120)


def create_durable_queue(cluster: Cluster, queue: str) -> None:
    code = (
        f"import sys; sys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r}); "
        "from tests.support.amqp import mgmt; "
        f"c = mgmt({VIP + ':' + str(PORT)!r}); "
        f"c.call('CREATE', 'queue', {queue!r}, {{'arguments': {{'durable': True}}}}); c.close()"
    )
    cluster.client([PYTHON, "-c", code])


def test_after_every_broker_is_sigkilled_the_newest_store_is_promoted_and_nothing_confirmed_is_lost(
    brokers: Cluster, tmp_path: Path
) -> None:
    create_durable_queue(brokers, "restart")
    sender = Sender(brokers, tmp_path, queue="restart", interval=0.0)
    try:
        wait_for("300 durable messages acknowledged", lambda: len(sender.acked()) >= 300, 120)
        pids = {node.name: broker_pid(node) for node in brokers.nodes}
        assert None not in pids.values()
        for pid in pids.values():  # every broker at once, under load
            assert pid is not None
            os.kill(pid, signal.SIGKILL)
    finally:
        sender.stop()
    acked = {n for _, n in sender.acked()}

    def restarted_with_a_primary(s: ClusterStatus) -> bool:
        return primary_with_vip(s) and all(broker_pid(n) not in (None, pids[n.name]) for n in brokers.nodes)

    status = brokers.wait_status(
        "every broker restarted, one promoted, the VIP on it", restarted_with_a_primary, timeout=240
    )
    new = brokers.node(status.promoted(RSC)[0])
    log = (new.path("/var/lib/understudy") / "broker.log").read_text(errors="replace")
    assert "promoted with the newest store" in log  # newest_store, not --force, not bootstrap
    drained = brokers.client([PYTHON, CLIENT, "drain", "--url", f"{VIP}:{PORT}", "--queue", "restart"])
    received = {int(x) for x in drained.stdout.split()}
    assert acked - received == set(), f"acknowledged but lost: {sorted(acked - received)[:20]}"
    for node in brokers.nodes:
        if node is not new:
            wait_for(f"{node.name} ready again", lambda n=node: query(brokers, n)["state"] == "ready", 120)
    brokers.run(brokers.nodes[0], ["crm_resource", "--cleanup", "-r", RSC], check=False)


def test_a_backup_cut_off_from_the_primary_is_never_promoted_over_the_backup_that_stayed(brokers: Cluster) -> None:
    """A backup whose AMQP traffic to the primary is cut (corosync still up) is dropped by the primary but stays
    ready; the primary carries on, answering consumers' accepts with the other backup. Then the primary's node
    crashes: Pacemaker must promote the backup that stayed (it holds the newer member list), never the cut one,
    which still holds the messages whose accepts were answered -- they would be delivered again."""
    vip, queue = f"{VIP}:{PORT}", "cut-backup"
    brokers.client([PYTHON, CLIENT, "fill", "--url", vip, "--queue", queue, "--count", "20"])
    old = brokers.node(brokers.wait_status("steady state", primary_with_vip).promoted(RSC)[0])
    kept, cut = sorted((n for n in brokers.nodes if n is not old), key=lambda n: n.name)
    for node in (cut, kept):
        wait_for(f"{node.name} ready", lambda n=node: query(brokers, n)["state"] == "ready", 60)
    cut_name = query(brokers, cut)["name"]

    def members() -> set[str]:
        rows = query(brokers, old)["members"]
        assert isinstance(rows, list)
        return {str(m["name"]) for m in rows}

    for rule in (["OUTPUT", "-o", "eth0", "-p", "tcp", "--dport"], ["INPUT", "-i", "eth0", "-p", "tcp", "--sport"]):
        brokers.netns_exec(cut.ns, ["iptables", "-A", *rule, str(PORT), "-j", "DROP"])  # its own clients still reach it
    try:
        wait_for(f"the primary drops {cut.name}", lambda: cut_name not in members(), 30)
        taken = brokers.client([PYTHON, CLIENT, "take", "--url", vip, "--queue", queue, "--count", "5"])
        assert [int(x) for x in taken.stdout.split()] == [1, 2, 3, 4, 5]
        assert query(brokers, cut)["state"] == "ready"  # a candidate still, with the accepted messages on it

        def score(node: Node) -> int | None:
            out = brokers.run(kept, ["crm_attribute", "--promotion", RSC, "-N", node.name, "-G", "-q"], check=False)
            return int(out.stdout) if out.returncode == 0 and out.stdout.strip().isdigit() else None

        # Once both monitors ran: the one that stayed is the best candidate; the cut one gets no score at all, as the
        # other's published standing holds the member list that dropped it (were the other's broker to die too, it
        # must still not be promoted: agent_core.dropped_ready).
        wait_for("scores that leave the cut backup out", lambda: score(kept) == 1000 and score(cut) is None, 30)
        status = crash_and_fail_over(brokers, old, kept)
    finally:
        brokers.heal(cut)
    assert status.promoted(RSC) == [kept.name]
    drained = brokers.client([PYTHON, CLIENT, "drain", "--url", vip, "--queue", queue])
    assert [int(x) for x in drained.stdout.split()] == list(range(6, 21))  # none of the accepted ones again
    brokers.restart_node(old)
    brokers.wait_online([n.name for n in brokers.nodes])
    brokers.wait_status(f"{old.name} back as Unpromoted", lambda s: old.name in s.unpromoted(RSC), timeout=120)
