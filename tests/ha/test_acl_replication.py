"""--acl-file in a cluster: the replication user needs no rule (what replication needs is implicit, and only
that), admins may run the HA operations without one, and clients get only what the rules say, on the primary and
after a failover."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from proton import Message
from proton.utils import BlockingConnection, LinkDetached

from broker.client import ManagementClient
from tests.support.cluster import Cluster, kill
from tests.support.procs import wait_for

Make = Callable[..., Cluster]

USERS = """
[users.replicator]
password = "r3plic4te"

[users.ops]
password = "ops-pw"
admin = true

[users.app]
password = "app-pw"
"""

# Nothing for the replication user, and nothing about the HA operations.
RULES = """
[[rule]]
effect = "allow"
users = ["app"]
actions = ["publish", "consume"]
queues = ["orders"]

[[rule]]
effect = "allow"
users = ["ops"]
actions = ["create"]
queues = ["orders"]
"""


def app(url: str) -> BlockingConnection:
    return BlockingConnection(url, timeout=10, reconnect=False, user="app", password="app-pw", sasl_enabled=True,
                              allowed_mechs="PLAIN", allow_insecure_mechs=True)


def ops(url: str) -> ManagementClient:
    return ManagementClient(url, user="ops", password="ops-pw")


def wait_state(url: str, state: str) -> None:
    """As Cluster.wait_state, logged in as an admin (an ANONYMOUS status request is redirected by a backup)."""
    def reached() -> bool:
        with ops(url) as m:
            return bool(m.call("STATUS", "ha-broker").body["state"] == state)

    wait_for(reached, 20, 0.1, what=f"{url} {state}")


def test_a_cluster_replicates_and_fails_over_when_the_rules_grant_the_replication_user_nothing(
        cluster: Make, tmp_path: Path) -> None:
    (tmp_path / "users.toml").write_text(USERS)
    (tmp_path / "acl.toml").write_text(RULES)
    c = cluster(2, "--users-file", str(tmp_path / "users.toml"), "--acl-file", str(tmp_path / "acl.toml"),
                "--ha-username", "replicator", "--ha-password", "r3plic4te")
    c.start()
    with ops(c[0].url) as m:
        assert m.request("PROMOTE", "ha-broker", body={}).ok  # an admin: broker-wide manage is implicit
        wait_state(c[0].url, "active")
        assert m.request("CREATE", "queue", "orders", {"arguments": {"durable": True}}).status == 201
        assert m.request("CREATE", "queue", "elsewhere").status == 403
    wait_state(c[1].url, "ready")
    conn = app(c[0].url)
    try:
        s = conn.create_sender("orders")
        for i in range(10):
            s.send(Message(body=i, durable=True))
        with pytest.raises(LinkDetached):
            conn.create_sender("elsewhere")
    finally:
        conn.close()
    # The replication password opens replication, not the client queues: the rules grant it nothing else.
    thief = BlockingConnection(c[0].url, timeout=10, reconnect=False, user="replicator", password="r3plic4te",
                               sasl_enabled=True, allowed_mechs="PLAIN", allow_insecure_mechs=True)
    try:
        for attach in (lambda: thief.create_sender("orders"), lambda: thief.create_receiver("orders")):
            with pytest.raises(LinkDetached, match="unauthorized-access"):
                attach()
    finally:
        thief.close()
    with ops(c[1].url) as m:  # BROWSE on a backup: what it holds
        wait_for(lambda: m.call("BROWSE", "ha-broker", "orders").body["bodies"] == list(range(10)), 20,
                 what="the backup to hold all 10")

    kill(c[0])
    with ops(c[1].url) as m:
        assert m.request("PROMOTE", "ha-broker", body={}).ok
    wait_state(c[1].url, "active")
    conn = app(c[1].url)
    try:
        r = conn.create_receiver("orders", credit=10)
        got = []
        for _ in range(10):
            got.append(r.receive(10).body)
            r.accept()
        assert got == list(range(10))
    finally:
        conn.close()
    for b in c.brokers:
        assert not [e for e in b.events() if e["event"] == "acl.denied" and e["user"] in ("replicator", "ops")
                    and e["type"] == "broker"]
        # replication itself was never denied: the only denials of the replication user are the two attempts above
        assert [(e["permission"], e["name"]) for e in b.events() if e["event"] == "acl.denied"
                and e["user"] == "replicator"] == ([("publish", "orders"), ("consume", "orders")] if b is c[0] else [])
    assert [e for e in c[0].events() if e["event"] == "acl.denied" and e["user"] == "app"]
