"""SASL PLAIN with a users file, and the admin role for management writes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from proton import ConnectionException, Message
from proton.utils import BlockingConnection

from broker.client import ManagementClient, ManagementError
from tests.support.procs import BrokerFactory, BrokerProcess

USERS = """
[users.alice]
password = "alice-secret"
admin = true

[users.bob]
password = "bob-secret"
"""


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    d = tmp_path_factory.mktemp("sasl")
    users = d / "users.toml"
    users.write_text(USERS)
    f = BrokerFactory(d)
    yield f("--users-file", str(users), "--auto-create-queues", name="secured")
    for _ in f.cleanup():
        pass


def login(url: str, user: str, password: str, timeout: float = 10.0) -> BlockingConnection:
    return BlockingConnection(url, timeout=timeout, reconnect=False, user=user, password=password,
                              sasl_enabled=True, allowed_mechs="PLAIN", allow_insecure_mechs=True)


def as_user(url: str, user: str | None, password: str | None = None) -> ManagementClient:
    return ManagementClient(url, user=user, password=password)


def test_plain_login_sends_and_receives(secured: BrokerProcess) -> None:
    for user, pw in (("alice", "alice-secret"), ("bob", "bob-secret")):
        c = login(secured.url, user, pw)
        try:
            c.create_sender(f"sasl-{user}").send(Message(body=f"from {user}"))
            r = c.create_receiver(f"sasl-{user}", credit=1)
            assert r.receive(10).body == f"from {user}"
            r.accept()
        finally:
            c.close()
    opened = [e for e in secured.events() if e["event"] == "connection.opened" and e.get("user") in ("alice", "bob")]
    assert {e["user"] for e in opened} == {"alice", "bob"}


@pytest.mark.parametrize(("user", "password"), [("alice", "wrong"), ("mallory", "x"), ("bob", "alice-secret")])
def test_wrong_credentials_are_refused(secured: BrokerProcess, user: str, password: str) -> None:
    with pytest.raises(ConnectionException) as exc:
        login(secured.url, user, password).close()
    assert "amqp:unauthorized-access" in str(exc.value)


def test_non_admin_reads_but_cannot_write(secured: BrokerProcess) -> None:
    url = secured.url
    with as_user(url, "alice", "alice-secret") as admin:
        assert admin.request("CREATE", "queue", "owned-by-alice", {"arguments": {"max-count": 5}}).status == 201
    with as_user(url, "bob", "bob-secret") as bob:
        attempts: dict[str, Any] = {
            "create queue": bob.request("CREATE", "queue", "bobs-queue", {}),
            "create exchange": bob.request("CREATE", "exchange", "bobs-x", {"exchange-type": "fanout"}),
            "update": bob.request("UPDATE", "queue", "owned-by-alice", {"max-count": 50}),
            "delete": bob.request("DELETE", "queue", "owned-by-alice"),
        }
        assert {k: r.status for k, r in attempts.items()} == dict.fromkeys(attempts, 403)
        assert "admin" in attempts["create queue"].description
        read = bob.request("READ", "queue", "owned-by-alice")
        assert read.status == 200
        assert read.body["arguments"] == {"max-count": 5}
        names = [row["name"] for row in bob.call("QUERY", "queue", body={"attributeNames": ["name"]}).rows()]
        assert "owned-by-alice" in names and "bobs-queue" not in names
        assert bob.request("READ", "broker").status == 200


def test_anonymous_may_read_but_not_write_when_users_are_configured(secured: BrokerProcess) -> None:
    with as_user(secured.url, None) as anon:
        assert anon.request("CREATE", "queue", "anon-queue", {}).status == 403
        assert anon.request("READ", "broker").status == 200
        assert anon.request("READ", "queue", "anon-queue").status == 404


def test_admin_can_create_update_and_delete(secured: BrokerProcess) -> None:
    with as_user(secured.url, "alice", "alice-secret") as alice:
        assert alice.request("CREATE", "exchange", "alice-x", {"exchange-type": "topic"}).status == 201
        assert alice.request("CREATE", "queue", "alice-q", {}).status == 201
        assert alice.request("CREATE", "binding", None, {"source": "alice-x", "destination": "alice-q",
                                                         "binding-key": "a.#"}).status == 201
        assert alice.request("UPDATE", "queue", "alice-q", {"max-count": 9}).status == 200
        assert alice.request("DELETE", "exchange", "alice-x").status == 204
        assert alice.request("DELETE", "queue", "alice-q").status == 204


def test_only_plain_offered_refuses_anonymous(brokers: BrokerFactory, tmp_path: Path) -> None:
    users = tmp_path / "users.toml"
    users.write_text(USERS)
    b = brokers("--users-file", str(users), "--sasl-mechanisms", "PLAIN")
    with pytest.raises(ManagementError):
        ManagementClient(b.url, timeout=10).close()  # ANONYMOUS is not offered
    with as_user(b.url, "bob", "bob-secret") as bob:
        assert bob.request("READ", "broker").status == 200
