"""HA over TLS: brokers that accept only TLS and require client certificates replicate, fail over, and are operated
with ha-admin over TLS; a backup that cannot verify its primary (or that its primary cannot verify) does not join,
and both brokers say why."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from proton import ConnectionException, Message

from broker.client import ManagementClient, ManagementError, connect
from broker.tls import ClientTls, client_domain
from tests.support.certs import Certs, make_certs
from tests.support.cluster import Cluster
from tests.support.procs import BIN, BrokerProcess, wait_for

Make = Callable[..., Cluster]


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("certs"))


def flags(certs: Certs, ca: Path | None = None, cert: Path | None = None, key: Path | None = None) -> list[str]:
    return ["--ssl-cert", str(cert or certs.server), "--ssl-key", str(key or certs.server_key),
            "--ssl-ca", str(ca or certs.ca), "--ssl-require-client-cert"]


class TlsOps:
    """What the Cluster helpers do over plain AMQP, over TLS with the client certificate."""

    def __init__(self, certs: Certs) -> None:
        self.certs = certs
        self.tls = ClientTls(certs.ca, certs.client, certs.client_key)

    def client(self, b: BrokerProcess, timeout: float = 5.0) -> ManagementClient:
        return ManagementClient(b.url, timeout, ssl_domain=client_domain(self.tls))

    def status(self, b: BrokerProcess) -> dict[str, Any] | None:
        try:
            with self.client(b, 2.0) as m:
                body: dict[str, Any] = m.call("STATUS", "ha-broker").body
                return body
        except ManagementError:
            return None

    def wait_state(self, b: BrokerProcess, *states: str, timeout: float = 20.0) -> dict[str, Any]:
        def check() -> dict[str, Any] | None:
            st = self.status(b)
            return st if st is not None and st["state"] in states else None

        result: dict[str, Any] = wait_for(check, timeout, 0.05, what=f"{b.name} in {states}")
        return result

    def admin(self, b: BrokerProcess, *args: str) -> subprocess.CompletedProcess[str]:
        c = self.certs
        return subprocess.run([str(BIN / "ha-admin"), "--broker", b.url, "--ssl-ca", str(c.ca), "--ssl-cert",
                               str(c.client), "--ssl-key", str(c.client_key), *args],
                              capture_output=True, text=True, timeout=30)

    def send(self, b: BrokerProcess, queue: str, bodies: list[int]) -> None:
        conn = connect(b.url, 10, "client", None, None, client_domain(self.tls))
        try:
            s = conn.create_sender(queue)
            for body in bodies:
                s.send(Message(body=body))
        finally:
            conn.close()

    def receive(self, b: BrokerProcess, queue: str, n: int) -> list[Any]:
        conn = connect(b.url, 10, "client", None, None, client_domain(self.tls))
        try:
            r = conn.create_receiver(queue, credit=n)
            out = []
            for _ in range(n):
                out.append(r.receive(10).body)
                r.accept()
            return out
        finally:
            conn.close()

    def depth(self, b: BrokerProcess, queue: str) -> int | None:
        try:
            with self.client(b) as m:
                r = m.request("READ", "queue", queue)
                return int(r.body["depth"]) if r.ok else None
        except ManagementError:
            return None


def test_a_tls_only_cluster_with_client_certificates_replicates_and_fails_over(cluster: Make, certs: Certs) -> None:
    c = cluster(2, *flags(certs))
    ops = TlsOps(certs)
    c.start()
    r = ops.admin(c[0], "promote")
    assert r.returncode == 0, r.stderr
    ops.wait_state(c[0], "active")
    ops.wait_state(c[1], "ready")
    with ops.client(c[0]) as m:
        m.call("CREATE", "queue", "orders", {"arguments": {"durable": True}})
    ops.send(c[0], "orders", list(range(50)))
    wait_for(lambda: ops.depth(c[1], "orders") == 50, 10, what="the backup to hold all 50")
    assert not [e for e in c[1].events() if e["event"] == "ha.connect.failed" and "TLS" in e["reason"]]
    assert not [e for e in c[0].events() if e["event"] == "tls.refused"]
    c[0].kill()
    r = ops.admin(c[1], "promote")
    assert r.returncode == 0, r.stderr
    ops.wait_state(c[1], "active")
    assert ops.receive(c[1], "orders", 50) == list(range(50))


@pytest.mark.parametrize("case", ["backup trusts another CA", "backup's certificate from another CA"])
def test_a_backup_that_fails_the_tls_check_does_not_join_and_both_sides_say_why(cluster: Make, certs: Certs,
                                                                                 case: str) -> None:
    c = cluster(2, *flags(certs))
    ops = TlsOps(certs)
    plain_args = c.args()[: -len(flags(certs))]
    if case == "backup trusts another CA":
        c[1].args = [*plain_args, *flags(certs, ca=certs.other_ca)]
        backup_ops = TlsOps(certs)
        backup_ops.tls = ClientTls(certs.ca, certs.other, certs.other_key)  # what that backup's listener takes
        backup_says, primary_says = "the broker's certificate could not be verified", "does not trust our certificate"
    else:
        c[1].args = [*plain_args, *flags(certs, cert=certs.other, key=certs.other_key)]
        backup_ops = TlsOps(certs)
        backup_ops.tls = ClientTls(certs.other_ca, certs.client, certs.client_key)
        backup_says, primary_says = "the broker does not trust our certificate", "client's certificate could not"
    c.start(0)
    assert ops.admin(c[0], "promote").returncode == 0
    ops.wait_state(c[0], "active")
    c.start(1)

    def failed() -> dict[str, Any] | None:
        return next((e for e in c[1].events() if e["event"] == "ha.connect.failed"
                     and backup_says in str(e.get("reason"))), None)

    event = wait_for(failed, 15, what="the backup to log why it cannot connect")
    assert event["reason"].startswith("TLS: ")
    wait_for(lambda: any(e["event"] == "tls.refused" and primary_says in str(e.get("reason"))
                         for e in c[0].events()), 10, what="the primary to log the refusal")
    st = backup_ops.status(c[1])
    assert st is not None and st["state"] == "joining"


def test_brokers_log_in_to_each_other_with_their_certificates(cluster: Make, certs: Certs) -> None:
    """No password anywhere: the replication user is the CN of the brokers' certificate (`localhost`), and a client
    certificate asking to be a backup is refused."""
    c = cluster(2, *flags(certs), "--sasl-mechanisms", "EXTERNAL", "--ha-username", "localhost")
    ops = TlsOps(certs)
    c.start()
    assert ops.admin(c[0], "promote").returncode == 0
    ops.wait_state(c[0], "active")
    ops.wait_state(c[1], "ready")
    backups = [e for e in c[0].events() if e.get("event") == "connection.opened" and e.get("kind") == "ha"]
    assert backups and {e["user"] for e in backups} == {"localhost"}
    with pytest.raises(ConnectionException, match="unauthorized-access"):
        connect(c[0].url, 5, "ha", None, None, client_domain(ops.tls)).close()
    refused = wait_for(lambda: [e for e in c[0].events() if e.get("event") == "access.refused"], 5,
                       what="access.refused")
    assert refused[0]["user"] == "client" and "may not connect as a backup" in refused[0]["description"]
