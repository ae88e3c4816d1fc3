"""Inter-broker authentication: replication connections log in with --ha-username/--ha-password (SASL PLAIN)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from proton import Message

from broker.client import ManagementClient
from tests.support.amqp import connect
from tests.support.cluster import Cluster
from tests.support.procs import BrokerFactory, wait_for

Make = Callable[..., Cluster]

USERS = """
[users.replicator]
password = "r3plic4te"
admin = true

[users.app]
password = "app-pw"
"""


def status(url: str) -> dict[str, Any]:
    with ManagementClient(url, user="replicator", password="r3plic4te") as m:
        body: dict[str, Any] = m.call("STATUS", "ha-broker").body
        return body


def test_replication_logs_in_with_the_ha_credentials(cluster: Make, brokers: BrokerFactory,
                                                     tmp_path: Path) -> None:
    users = tmp_path / "users.toml"
    users.write_text(USERS)
    auth = ["--users-file", str(users), "--sasl-mechanisms", "PLAIN"]
    c = cluster(2, *auth, "--ha-username", "replicator", "--ha-password", "r3plic4te")
    c.start()
    with ManagementClient(c[0].url, user="replicator", password="r3plic4te") as m:
        assert m.request("PROMOTE", "ha-broker", body={}).ok
        m.call("CREATE", "queue", "secure", {})
    wait_for(lambda: status(c[1].url)["state"] == "ready", 20, what="backup ready over PLAIN")
    conn = connect(c[0].url, user="app", password="app-pw", allowed_mechs="PLAIN", allow_insecure_mechs=True)
    conn.create_sender("secure").send(Message(body="for the app"))
    conn.close()
    with ManagementClient(c[1].url, user="replicator", password="r3plic4te") as m:
        r = m.call("BROWSE", "ha-broker", "secure")
        assert r.body["bodies"] == ["for the app"]
    # A backup with a wrong password never follows the primary.
    intruder = brokers("--ha-cluster", "--ha-brokers-url", c.brokers_url, *auth, "--ha-username", "replicator",
                       "--ha-password", "wrong", name="intruder")
    wait_for(lambda: any(e["event"] == "ha.connect.failed" and "unauthorized" in e["reason"]
                         for e in intruder.events()), 20, what="the intruder to log its refused login")
    assert any(e["event"] == "connection.refused" and e["condition"] == "amqp:unauthorized-access"
               for e in c[0].events())
    assert status(intruder.url)["state"] == "joining"
    assert not any(e["event"] == "ha.primary.connected" for e in intruder.events())
