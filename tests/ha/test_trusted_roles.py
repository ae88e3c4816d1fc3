"""Who may do what in a cluster, tried through every way in with real brokers: a connection's role comes from its
login (broker.auth.admit), never from the properties it declares; a backup takes no publishers."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from proton import ConnectionException, LinkException, Message
from proton.utils import BlockingConnection

from broker.client import KIND_PROPERTY, ManagementClient
from ha import protocol as P
from tests.support.amqp import connect, send
from tests.support.cluster import Cluster
from tests.support.procs import BIN, BrokerProcess, wait_for

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
REPLICATION = ("replicator", "r3plic4te")
OPS = ("ops", "ops-pw")
IMPOSTOR = {KIND_PROPERTY: "ha", P.PROP_BROKER: "impostor", P.PROP_ADDRESS: "127.0.0.1:1", P.PROP_EPOCH: 99}
Login = tuple[str, str] | None  # None: ANONYMOUS


def opened(url: str, props: dict[str, Any], login: Login = None) -> BlockingConnection:
    kw: dict[str, Any] = {"properties": props}
    if login is not None:
        kw.update(user=login[0], password=login[1], allowed_mechs="PLAIN", allow_insecure_mechs=True,
                  sasl_enabled=True)
    return connect(url, 10.0, **kw)


def refusal(url: str, props: dict[str, Any], login: Login = None) -> str:
    """The error a connection with `props` gets at open; fails if it opens."""
    with pytest.raises(ConnectionException) as exc:
        opened(url, props, login).close()
    return str(exc.value)


def status(url: str, login: Login = OPS) -> dict[str, Any]:
    user, pw = login or (None, None)
    with ManagementClient(url, user=user, password=pw) as m:
        body: dict[str, Any] = m.call("STATUS", "ha-broker").body
        return body


def denied(b: BrokerProcess) -> list[dict[str, Any]]:
    return [e for e in b.events() if e["event"] == "access.refused"]


def secured(cluster: Make, tmp_path: Path) -> Cluster:
    """Two brokers with a users file (ANONYMOUS still offered, the default), replicating as `replicator`."""
    users = tmp_path / "users.toml"
    users.write_text(USERS)
    c = cluster(2, "--users-file", str(users), "--ha-username", REPLICATION[0], "--ha-password", REPLICATION[1])
    c.start()
    with ManagementClient(c[0].url, user=OPS[0], password=OPS[1]) as m:
        assert m.request("PROMOTE", "ha-broker", body={}).ok
        m.call("CREATE", "queue", "orders", {})
    wait_for(lambda: status(c[1].url)["state"] == "ready", 20, what="the real backup ready")
    wait_for(lambda: status(c[0].url)["state"] == "active", 20, what="the primary active")
    return c


def test_with_a_users_file_only_the_replication_login_is_a_backup_and_only_admins_pass_a_backup(
        cluster: Make, tmp_path: Path) -> None:
    c = secured(cluster, tmp_path)
    primary, backup = c[0], c[1]
    epoch = status(primary.url)["epoch"]
    # On the primary: an impostor announcing epoch 99, as ANONYMOUS, as a client user, as an admin user.
    for login, who in ((None, "an ANONYMOUS login"), (("app", "app-pw"), "user 'app'"), (OPS, "user 'ops'")):
        text = refusal(primary.url, IMPOSTOR, login)
        assert "amqp:unauthorized-access" in text, text
        assert f"{who} may not connect as a backup" in text and "'replicator'" in text, text
    st = status(primary.url)
    assert (st["role"], st["state"], st["epoch"]) == ("primary", "active", epoch)  # it did not step down
    assert sorted(m["name"] for m in st["members"]) == ["b1", "b2"]  # nobody else became a guard
    assert not any(e["event"] in ("ha.demoted", "ha.epoch.refused") for e in primary.events())
    logged = denied(primary)
    assert [(e["user"], e["kind"], e["condition"]) for e in logged] == [
        ("anonymous", "ha", "amqp:unauthorized-access"), ("app", "ha", "amqp:unauthorized-access"),
        ("ops", "ha", "amqp:unauthorized-access")]
    # The replication links themselves are refused to a client connection (they need a backup's connection).
    conn = opened(primary.url, {}, OPS)
    try:
        with pytest.raises(LinkException) as exc:
            conn.create_receiver(P.QUEUE_PREFIX + "orders")
        assert "amqp:unauthorized-access" in str(exc.value) and "not one" in str(exc.value)
    finally:
        conn.close()
    # On the backup: claiming ha is refused the same way; claiming admin without being one is a client's redirect.
    assert "amqp:unauthorized-access" in refusal(backup.url, IMPOSTOR)
    for login in (None, ("app", "app-pw")):
        text = refusal(backup.url, {KIND_PROPERTY: "admin"}, login)
        assert "amqp:connection:redirect" in text and f"127.0.0.1:{c.ports[0]}" in text, text
    # The real backup replicates; admins and the replication user are served by the backup.
    send(primary.url, "orders", ["one"])  # ANONYMOUS may publish to the primary
    wait_for(lambda: c.queue_bodies(0, "orders") == ["one"], 10, what="the message on the primary")
    with ManagementClient(backup.url, user=REPLICATION[0], password=REPLICATION[1]) as m:
        wait_for(lambda: m.call("BROWSE", "ha-broker", "orders").body["bodies"] == ["one"], 10,
                 what="the message on the real backup")
    query = subprocess.run([str(BIN / "ha-admin"), "--broker", backup.url, "--user", "ops", "--password", "ops-pw",
                            "query"], capture_output=True, text=True, timeout=30)
    assert query.returncode == 0, query.stderr
    assert json.loads(query.stdout)["state"] == "ready"
    table = subprocess.run([str(BIN / "ha-status"), "--broker", backup.url, "--user", "replicator", "--password",
                            "r3plic4te", "-f", "json"], capture_output=True, text=True, timeout=30)
    assert table.returncode == 0, table.stderr
    assert "b1" in table.stdout and "b2" in table.stdout


def test_a_backup_takes_no_publisher_even_from_an_admin(cluster: Make) -> None:
    """Without a users file everyone is an admin and passes a backup's redirect: it still cannot write there."""
    c = cluster(2)
    c.start_with_primary(0)
    with ManagementClient(c[0].url) as m:
        m.call("CREATE", "queue", "orders", {})
    wait_for(lambda: c.queue_bodies(1, "orders") == [], 10, what="the queue on the backup")
    conn = opened(c[1].url, {KIND_PROPERTY: "admin"})
    try:
        for address in ("orders", None):  # a queue, and the anonymous relay
            with pytest.raises(LinkException) as exc:
                conn.create_sender(address)
            text = str(exc.value)
            assert "amqp:unauthorized-access" in text and "is a backup" in text, text
    finally:
        conn.close()
    send(c[0].url, "orders", ["from the primary"])
    wait_for(lambda: c.queue_bodies(1, "orders") == ["from the primary"], 10, what="the backup to follow")
    assert [(e["kind"], e["address"]) for e in denied(c[1])] == [("admin", "orders"), ("admin", None)]
    assert Cluster.status(c[1])["state"] == "ready"  # management still served


def test_a_demoted_primary_detaches_the_publishers_its_demotion_kept(cluster: Make) -> None:
    c = cluster(2)
    c.start_with_primary(0)
    with ManagementClient(c[0].url) as m:
        m.call("CREATE", "queue", "orders", {})
    conn = opened(c[0].url, {KIND_PROPERTY: "admin"})  # an admin connection survives a demotion
    try:
        sender = conn.create_sender("orders")
        sender.send(Message(body="while primary"))
        r = Cluster.admin(c[0], "demote")
        assert r.returncode == 0, r.stderr
        wait_for(lambda: denied(c[0]), 10, what="the publisher detached")
        with pytest.raises(Exception):  # noqa: B017 - proton raises LinkDetached or a send failure
            sender.send(Message(body="into a replica"))
    finally:
        conn.close()
    (e,) = denied(c[0])
    assert (e["kind"], e["address"], e["condition"]) == ("admin", "orders", "amqp:unauthorized-access")
    assert "became a backup" in e["description"]


def test_the_brokers_own_credentials_without_a_users_file(cluster: Make) -> None:
    """--ha-username/--ha-password alone: brokers log in to each other with PLAIN; anonymous tools still work, but
    an anonymous connection is no backup (and cannot depose the primary with a higher epoch)."""
    c = cluster(2, "--ha-username", REPLICATION[0], "--ha-password", REPLICATION[1])
    c.start_with_primary(0)  # ha-admin promote and the status polls are anonymous
    epoch = Cluster.status(c[0])["epoch"]
    text = refusal(c[0].url, IMPOSTOR)
    assert "amqp:unauthorized-access" in text and "an ANONYMOUS login may not connect as a backup" in text, text
    st = Cluster.status(c[0])
    assert (st["state"], st["epoch"], len(st["members"])) == ("active", epoch, 2)
    assert [e["user"] for e in denied(c[0])] == ["anonymous"]
    opened_as = [e for e in c[0].events() if e["event"] == "connection.opened" and e["kind"] == "ha"]
    assert opened_as and {e["user"] for e in opened_as} == {"replicator"}
    assert not any(e["event"] == "access.open" for b in c.brokers for e in b.events())


def test_with_nothing_authenticated_the_cluster_says_so(cluster: Make) -> None:
    c = cluster(2)
    c.start_with_primary(0)
    for b in c.brokers:
        assert any(e["event"] == "access.open" for e in b.events()), b.name


def test_a_backup_refuses_management_writes_to_replicated_objects(cluster: Make) -> None:
    c = cluster(2)
    c.start_with_primary(0)
    with ManagementClient(c[0].url) as m:
        m.call("CREATE", "queue", "orders", {})
    send(c[0].url, "orders", ["kept"])
    wait_for(lambda: c.queue_bodies(1, "orders") == ["kept"], 10, what="the replica")
    with ManagementClient(c[1].url) as m:
        assert m.request("DELETE", "queue", "orders").status == 409
        assert m.request("PURGE", "queue", "orders").status == 409
        r = m.request("CREATE", "exchange", "local-x", {"type": "fanout"})
        assert r.status == 409 and r.description.startswith("this broker is a backup") and "primary" in r.description
        assert m.request("CREATE", "queue", "local-only", {"arguments": {"qpid.replicate": "none"}}).status == 201
        assert m.request("DELETE", "queue", "local-only").status == 204  # not replicated: the backup's own
    assert c.queue_bodies(1, "orders") == ["kept"]
    refused = [e for e in c[1].events() if e["event"] == "management.refused"]
    assert {(e["operation"], e["type"]) for e in refused} >= {("DELETE", "queue"), ("PURGE", "queue")}
    with ManagementClient(c[0].url) as m:  # the primary still takes them, and the backup follows
        assert m.request("DELETE", "queue", "orders").status == 204
    wait_for(lambda: not any(q == "orders" for q in _queues(c[1].url)), 10, what="the backup to follow")


def _queues(url: str) -> list[str]:
    with ManagementClient(url) as m:
        return [r["name"] for r in m.call("QUERY", "queue").rows()]
