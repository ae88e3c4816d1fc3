"""The harness itself, proven with Pacemaker's stock agents: a promotable ``ocf:pacemaker:Stateful`` clone and an
``ocf:heartbeat:IPaddr2`` VIP, configured by ``ha.pacemaker.setup_commands`` (the same commands
``ha-admin pacemaker-setup`` runs), then a crash of the promoted node."""

from __future__ import annotations

import time

import pytest

from ha.pacemaker import PacemakerSetup, setup_commands
from tests.pacemaker.crm_status import ClusterStatus
from tests.pacemaker.netns import Cluster, wait_for

pytestmark = pytest.mark.pacemaker

VIP = "10.77.0.100"
SETUP = PacemakerSetup(vip=VIP, resource="st", vip_resource="vip", agent="ocf:pacemaker:Stateful", nic="eth0")


def vip_answers(cluster: Cluster) -> bool:
    return cluster.client(["ping", "-c1", "-W0.3", VIP], check=False).returncode == 0


def promoted_with_vip(s: ClusterStatus) -> bool:
    return len(s.promoted("st")) == 1 and s.started("vip") == s.promoted("st")


@pytest.fixture(scope="module")
def configured(cluster: Cluster) -> Cluster:
    cluster.pcs_apply(setup_commands(SETUP))
    cluster.wait_status("one promoted instance with the VIP", promoted_with_vip, timeout=90)
    wait_for("VIP answers ping from the client namespace", lambda: vip_answers(cluster), timeout=30)
    return cluster


def test_cluster_forms_with_quorum(cluster: Cluster) -> None:
    status = cluster.status()
    assert status.online == {"node1", "node2", "node3"}
    assert status.quorum


def test_setup_commands_create_clone_vip_and_constraints(configured: Cluster) -> None:
    status = configured.status()
    assert len(status.promoted("st")) == 1
    assert len(status.unpromoted("st")) == 2
    assert status.started("vip") == status.promoted("st")
    constraints = configured.run(configured.nodes[0], ["pcs", "constraint", "--full"]).stdout
    assert "promote st-clone then start vip" in constraints
    assert "demote st-clone then stop vip (kind:Optional)" in constraints
    assert "vip with st-clone (score:INFINITY) (rsc-role:Started) (with-rsc-role:Promoted)" in constraints


def test_crash_of_promoted_node_moves_vip(configured: Cluster) -> None:
    old = configured.node(configured.status().promoted("st")[0])
    survivor = next(n for n in configured.nodes if n is not old)
    started = time.monotonic()
    configured.kill_node(old)
    wait_for("VIP answers again", lambda: vip_answers(configured), timeout=60, interval=0.05)
    failover = time.monotonic() - started
    status = configured.wait_status(
        "a new promoted node with the VIP", promoted_with_vip, timeout=60, via=survivor
    )
    new = status.promoted("st")[0]
    print(
        f"\nStateful failover: VIP answering {failover:.2f}s after node crash; promoted {old.name} -> {new}"
    )
    assert new != old.name
    assert old.name not in status.online

    configured.restart_node(old)
    status = configured.wait_online([n.name for n in configured.nodes])
    status = configured.wait_status(
        f"{old.name} back as unpromoted", lambda s: old.name in s.unpromoted("st") and promoted_with_vip(s)
    )
    assert status.promoted("st") == [new]  # the rejoining node does not steal the role back


def test_partitioned_promoted_node_loses_quorum_and_stops(configured: Cluster) -> None:
    old = configured.node(configured.status().promoted("st")[0])
    majority = next(n for n in configured.nodes if n is not old)
    configured.partition(old)
    try:
        configured.wait_status(
            "minority without quorum and nothing running",
            lambda s: not s.quorum and not s.promoted("st") and not s.started("vip"),
            timeout=60,
            via=old,
        )
        status = configured.wait_status(
            "majority promotes another node", promoted_with_vip, timeout=60, via=majority
        )
        assert status.promoted("st") != [old.name]
    finally:
        configured.heal(old)
    configured.wait_online([n.name for n in configured.nodes])
    configured.wait_status("one promoted after heal", promoted_with_vip)
