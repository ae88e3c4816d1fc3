"""--acl-file through real clients: each action allowed and denied, `amqp:unauthorized-access`, the `acl.denied` line
with the user and the object, SIGHUP reloads (a good file and a bad one), and a bad file at start-up (exit 2)."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from proton import Delivery, Message, Timeout
from proton.utils import BlockingConnection, LinkDetached, SendException

from broker.admin_socket import request as socket_request
from broker.client import ManagementClient
from tests.broker.helpers import outcome, send_raw
from tests.support.procs import BIN, BrokerFactory, BrokerProcess, wait_for
from tests.support.txn import Txn

DENIED = "amqp:unauthorized-access"

USERS = """
[users.alice]
password = "a"
admin = true

[users.bob]
password = "b"

[users.carol]
password = "c"

[users.dave]
password = "d"
admin = true
"""

RULES = """
[groups]
apps = ["bob", "carol"]

[[rule]]
effect = "deny"
users = ["carol"]
actions = ["consume"]
queues = ["orders"]

[[rule]]
effect = "allow"
users = ["@apps"]
actions = ["publish", "consume"]
queues = ["orders", "relay.*"]
exchanges = ["events"]

[[rule]]
effect = "allow"
users = ["bob"]
actions = ["browse", "create"]
queues = ["bob.*", "orders"]

[[rule]]
effect = "deny"
users = ["alice"]
actions = ["delete", "manage"]
queues = ["keep.*"]

[[rule]]
effect = "deny"
users = ["alice"]
actions = ["create"]
queues = ["locked.*"]

[[rule]]
effect = "allow"
users = ["alice"]
actions = ["all"]
"""

PASSWORDS = {"alice": "a", "bob": "b", "carol": "c", "dave": "d"}


def login(url: str, user: str | None) -> BlockingConnection:
    if user is None:
        return BlockingConnection(url, timeout=10, reconnect=False)
    return BlockingConnection(url, timeout=10, reconnect=False, user=user, password=PASSWORDS[user],
                              sasl_enabled=True, allowed_mechs="PLAIN", allow_insecure_mechs=True)


def mgmt(url: str, user: str) -> ManagementClient:
    return ManagementClient(url, user=user, password=PASSWORDS[user])


def refused(fn: Any) -> str:
    """The description of the refusal an attach gets; fails unless the condition is unauthorized-access."""
    with pytest.raises(LinkDetached) as exc:
        fn()
    cond = exc.value.link.remote_condition
    assert cond is not None and cond.name == DENIED, cond
    return str(cond.description)


def denials(b: BrokerProcess, **match: Any) -> list[dict[str, Any]]:
    return [e for e in b.events() if e["event"] == "acl.denied" and all(e.get(k) == v for k, v in match.items())]


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    d = tmp_path_factory.mktemp("acl")
    (d / "users.toml").write_text(USERS)
    (d / "acl.toml").write_text(RULES)
    f = BrokerFactory(d)
    b = f("--users-file", str(d / "users.toml"), "--acl-file", str(d / "acl.toml"), "--auto-create-queues",
          "--admin-socket", str(d / "admin.sock"), name="guarded")
    with mgmt(b.url, "alice") as m:
        assert m.request("CREATE", "queue", "orders").status == 201
        assert m.request("CREATE", "queue", "keep.1").status == 201
        assert m.request("CREATE", "exchange", "events", {"exchange-type": "fanout"}).status == 201
        assert m.request("CREATE", "exchange", "other", {"exchange-type": "fanout"}).status == 201
    yield b
    for _ in f.cleanup():
        pass


def test_the_rules_are_logged_as_loaded_at_start(guarded: BrokerProcess) -> None:
    loaded = [e for e in guarded.events() if e["event"] == "acl.loaded"]
    assert [(e["count"], e["reason"]) for e in loaded] == [(6, "start")]


def test_publish_allowed_and_denied(guarded: BrokerProcess) -> None:
    c = login(guarded.url, "carol")
    try:
        c.create_sender("orders").send(Message(body="from carol"))
        c.create_sender("events").send(Message(body="to the exchange"))
        why = refused(lambda: c.create_sender("keep.1"))
        assert "user 'carol' may not publish queue 'keep.1'" in why and "default deny" in why
        assert "may not publish exchange 'other'" in refused(lambda: c.create_sender("other"))
    finally:
        c.close()
    line = denials(guarded, user="carol", permission="publish", name="keep.1")[-1]
    assert (line["type"], line["rule"], line["via"]) == ("queue", None, "attach")
    assert not [e for e in guarded.events() if e["event"] == "access.refused" and e.get("user") == "carol"]


def test_consume_allowed_and_denied_first_match_wins(guarded: BrokerProcess) -> None:
    c = login(guarded.url, "bob")
    try:
        c.create_sender("orders").send(Message(body="for bob"))
        r = c.create_receiver("orders", credit=1)
        assert r.receive(10).body in ("from carol", "for bob")
        r.accept()
        sub = c.create_receiver("events", credit=1)  # subscribe to the exchange: consume on it
        c.create_sender("events").send(Message(body="fanned"))
        assert sub.receive(10).body == "fanned"
    finally:
        c.close()
    c = login(guarded.url, "carol")
    try:
        why = refused(lambda: c.create_receiver("orders"))  # rule 1 denies before rule 2 allows
        assert "may not consume queue 'orders': rule 1 in --acl-file" in why
    finally:
        c.close()
    assert denials(guarded, user="carol", permission="consume", name="orders", rule=1)


def test_browse_allowed_and_denied(guarded: BrokerProcess) -> None:
    from proton.reactor import Copy

    c = login(guarded.url, "bob")
    try:
        c.create_receiver("orders", options=Copy()).close()
        c.create_receiver("bob.inbox", options=Copy()).close()  # browse + create (auto-create)
        assert "may not browse $events" in refused(lambda: c.create_receiver("$events"))
    finally:
        c.close()
    c = login(guarded.url, "carol")
    try:
        assert "may not browse queue 'orders'" in refused(lambda: c.create_receiver("orders", options=Copy()))
    finally:
        c.close()
    c = login(guarded.url, "alice")
    try:
        c.create_receiver("$events").close()
    finally:
        c.close()


def test_auto_create_needs_create_and_a_refused_attach_creates_nothing(guarded: BrokerProcess) -> None:
    c = login(guarded.url, "bob")
    try:
        assert "may not create queue 'relay.new'" in refused(lambda: c.create_receiver("relay.new"))
    finally:
        c.close()
    with mgmt(guarded.url, "alice") as m:
        assert m.request("READ", "queue", "relay.new").status == 404
        assert m.request("READ", "queue", "bob.inbox").status == 200


def test_management_create_delete_manage(guarded: BrokerProcess) -> None:
    with mgmt(guarded.url, "alice") as m:
        assert m.request("CREATE", "queue", "scratch").status == 201
        assert m.request("PURGE", "queue", "scratch").status == 200
        assert m.request("DELETE", "queue", "scratch").status == 204
        r = m.request("CREATE", "queue", "locked.1")
        assert (r.status, "may not create queue 'locked.1': rule 5" in r.description) == (403, True)
        r = m.request("DELETE", "queue", "keep.1")
        assert (r.status, "may not delete queue 'keep.1': rule 4" in r.description) == (403, True)
        assert m.request("PURGE", "queue", "keep.1").status == 403
        assert m.request("UPDATE", "queue", "keep.1", {"max-count": 5}).status == 403
        assert m.request("MOVE", "queue", "orders", {"destination": "keep.1"}).status == 403
        assert m.request("READ", "queue", "keep.1").status == 200  # reads are open
        r = m.request("CREATE", "binding", None, {"source": "events", "destination": "keep.1"})
        assert r.status == 201
    with mgmt(guarded.url, "dave") as m:  # an admin with no rules: may manage the broker, nothing named
        assert m.request("CREATE", "queue", "daves").status == 403
        assert m.request("DELETE", "binding", None, {"source": "events", "destination": "keep.1"}).status == 403
        conns = m.request("QUERY", "connection").rows()
        other = login(guarded.url, "carol")
        try:
            cid = max(r["id"] for r in conns) + 1  # carol's, opened after the query
            assert m.request("DELETE", "connection", str(cid)).status == 200
        finally:
            other.close()
    line = denials(guarded, user="alice", permission="delete", name="keep.1")[-1]
    assert (line["via"], line["operation"], line["rule"]) == ("management", "DELETE", 4)
    # the admin socket is the operator's own way in: the rules do not apply to it
    assert socket_request(guarded.workdir / "admin.sock", "CREATE", "queue", "locked.2").status == 201


def test_anonymous_relay_checks_each_address(guarded: BrokerProcess) -> None:
    c = login(guarded.url, "bob")
    try:
        d = send_raw(c, None, bytes(Message(body="relayed", address="orders").encode()))
        assert outcome(d) == (Delivery.ACCEPTED, None)
        d = send_raw(c, None, bytes(Message(body="nope", address="keep.1").encode()))
        assert outcome(d) == (Delivery.REJECTED, DENIED)
        s = c.create_sender(None)
        for _ in range(3):
            with pytest.raises(SendException) as exc:
                s.send(Message(body="nope", address="keep.1"))
            assert exc.value.state == Delivery.REJECTED
        s.send(Message(body="relayed", address="orders"))  # the link stays
    finally:
        c.close()
    assert len(denials(guarded, user="bob", via="relay", name="keep.1")) == 2  # once per link and address


def test_a_transactional_send_on_the_anonymous_relay_is_checked_too(guarded: BrokerProcess) -> None:
    c = login(guarded.url, "bob")
    try:
        s = c.create_sender(None)
        txn = Txn(c)
        d = txn.send(s, Message(body="nope", address="keep.1"))
        assert d.remote_state == Delivery.REJECTED and d.remote.condition.name == DENIED, d.remote.condition
        assert "may not publish queue 'keep.1'" in d.remote.condition.description
        d = txn.send(s, Message(body="relayed in a transaction", address="orders"))
        assert d.remote_state == 0x34  # held in the transaction
        assert txn.commit() == "committed"  # the refused message was never part of it
    finally:
        c.close()
    assert len(denials(guarded, user="bob", via="relay", name="keep.1")) >= 1
    c = login(guarded.url, "alice")
    try:
        r = c.create_receiver("keep.1", credit=1)
        with pytest.raises(Timeout):
            r.receive(0.5)
    finally:
        c.close()


def test_anonymous_login_gets_nothing_by_default(guarded: BrokerProcess) -> None:
    c = login(guarded.url, None)
    try:
        assert "user 'anonymous' may not consume queue 'orders'" in refused(lambda: c.create_receiver("orders"))
    finally:
        c.close()


# ----- SIGHUP ------------------------------------------------------------------------------------------------------
BEFORE = """
[[rule]]
effect = "allow"
users = ["bob"]
actions = ["create", "publish", "consume"]
queues = ["work"]

[[rule]]
effect = "allow"
users = ["alice"]
actions = ["all"]
"""

AFTER = """
[[rule]]
effect = "allow"
users = ["bob"]
actions = ["publish", "create"]
queues = ["work"]

[[rule]]
effect = "allow"
users = ["alice"]
actions = ["all"]
"""


def test_sighup_reloads_a_good_file_and_keeps_the_rules_on_a_bad_one(brokers: BrokerFactory, tmp_path: Path) -> None:
    (tmp_path / "users.toml").write_text(USERS)
    acl = tmp_path / "acl.toml"
    acl.write_text(BEFORE)
    b = brokers("--users-file", str(tmp_path / "users.toml"), "--acl-file", str(acl), "--auto-create-queues")
    c = login(b.url, "bob")
    try:
        s = c.create_sender("work")
        s.send(Message(body="w1"))
        r = c.create_receiver("work", credit=1)
        assert r.receive(10).body == "w1"
        r.accept()
        acl.write_text(AFTER)
        b.signal(signal.SIGHUP)
        wait_for(lambda: [e for e in b.events() if e["event"] == "acl.loaded" and e["reason"] == "sighup"])
        # bob's receiver was attached under the old rules: detached now, with the reason
        assert "may not consume queue 'work'" in refused(lambda: r.receive(10))
        assert denials(b, user="bob", permission="consume", via="reload")
        assert "may not consume queue 'work'" in refused(lambda: c.create_receiver("work", name="again"))
        s.send(Message(body="w2"))  # publishing is still allowed: that link stays
    finally:
        c.close()

    acl.write_text(AFTER.replace('"publish", "create"', '"publsh"'))
    b.signal(signal.SIGHUP)
    failed = wait_for(lambda: [e for e in b.events() if e["event"] == "acl.reload_failed"])
    assert "rule 1 (line 2): unknown action 'publsh'" in failed[-1]["description"]
    assert "previous rules stay" in failed[-1]["description"]
    c = login(b.url, "bob")
    try:
        c.create_sender("work").send(Message(body="w3"))  # the rules loaded before are in force
        assert "may not consume" in refused(lambda: c.create_receiver("work"))
    finally:
        c.close()
    assert b.alive


# ----- start-up ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("text", "words"), [
    ('[[rule]]\neffect = "allow"\nusers = ["*"]\nactions = ["publsh"]\n', "rule 1 (line 1): unknown action 'publsh'"),
    ("[[rule\n", "not valid TOML"),
    (None, "No such file"),
])
def test_a_bad_acl_file_at_start_is_exit_2_with_the_reason(tmp_path: Path, text: str | None, words: str) -> None:
    acl = tmp_path / "acl.toml"
    if text is not None:
        acl.write_text(text)
    for extra in (["--validate-config"], ["--port", "0", "--data-dir", str(tmp_path / "d")]):
        r = subprocess.run([str(BIN / "ha-broker"), "--acl-file", str(acl), *extra], capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 2, (r.stdout, r.stderr)
        assert f"ha-broker: --acl-file {acl}: " in r.stderr and words in r.stderr, r.stderr


def test_an_ha_cluster_with_rules_needs_a_replication_user(tmp_path: Path) -> None:
    acl = tmp_path / "acl.toml"
    acl.write_text(BEFORE)
    r = subprocess.run([str(BIN / "ha-broker"), "--acl-file", str(acl), "--ha-cluster", "--ha-brokers-url",
                        "127.0.0.1:1,127.0.0.1:2", "--validate-config"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--ha-cluster with --acl-file needs --ha-username" in r.stderr, r.stderr


def test_a_management_reply_needs_publish_on_the_queue_it_names(guarded: BrokerProcess) -> None:
    """Management reads are open to every user, but a reply puts a message on its `reply-to` queue: naming a queue
    the user may not send to would be a way round the rules. Refused before the request is carried out."""
    with mgmt(guarded.url, "alice") as m:
        before = m.call("READ", "queue", "keep.1").body["depth"]
    c = login(guarded.url, "bob")
    try:
        msg = Message(properties={"operation": "READ", "type": "queue", "name": "orders"}, reply_to="keep.1", id=1)
        d = send_raw(c, "$management", bytes(msg.encode()))
    finally:
        c.close()
    assert outcome(d) == (Delivery.REJECTED, DENIED)
    assert "user 'bob' may not publish queue 'keep.1'" in d.remote.condition.description
    line = denials(guarded, user="bob", permission="publish", name="keep.1")[-1]
    assert line["via"] == "management-reply"
    with mgmt(guarded.url, "alice") as m:
        assert m.call("READ", "queue", "keep.1").body["depth"] == before
    with mgmt(guarded.url, "bob") as m:  # its own temporary reply queue: anyone's
        assert m.request("READ", "queue", "orders").status == 200
