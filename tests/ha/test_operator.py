"""Operator commands against real brokers: ha-status never shows a stale primary, scripted checks (--expect,
--is-primary), URLs changed at run time, queue purge/move on a replicated cluster, connections listed and closed."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from functools import partial
from typing import Any

from proton import ConnectionException, Timeout
from proton.utils import LinkDetached

from broker.client import ManagementClient
from tests.support.amqp import connect, drain, mgmt, send
from tests.support.cluster import Cluster, free_ports
from tests.support.procs import BIN, BrokerFactory, BrokerProcess, read_events, wait_for

Make = Callable[..., Cluster]


def run(*cmd: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / cmd[0]), *cmd[1:]], capture_output=True, text=True, timeout=timeout)


def status_json(url: str, *extra: str) -> dict[str, Any]:
    r = run("ha-status", "--broker", url, "-f", "json", *extra)
    assert r.returncode == 0, r.stderr
    view: dict[str, Any] = json.loads(r.stdout)
    return view


def rows(view: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {m["name"]: m for m in view["members"]}


def own(url: str) -> dict[str, Any]:
    r = run("ha-admin", "--broker", url, "query")
    assert r.returncode == 0, r.stderr
    body: dict[str, Any] = json.loads(r.stdout)
    return body


def events(b: BrokerProcess, name: str) -> list[dict[str, Any]]:
    return [e for e in read_events(b.log_file) if e["event"] == name]


# ----- ha-status: every row is the member's own answer ---------------------------------------------------------
def test_demoted_primary_is_shown_as_the_backup_it_is_and_the_header_says_no_primary(cluster: Make) -> None:
    c = cluster(3)
    c.start_with_primary(0)
    assert run("ha-admin", "--broker", c[0].url, "demote").returncode == 0
    c.wait_state(0, "joining", "catchup")
    # The demoted broker still holds the list in which it was the active primary: the table must not show that.
    for asked in (c[0], c[1]):
        view = status_json(asked.url)
        assert view["primary"] is None and view["primaries"] == []
        members = rows(view)
        assert set(members) == {"b1", "b2", "b3"}
        for b in c.brokers:
            mine = own(b.url)
            row = members[b.name]
            assert (row["role"], row["state"], row["epoch"]) == (mine["role"], mine["state"], mine["epoch"])
            assert row["source"] == "self"
        assert members["b1"]["role"] == "backup"
        table = run("ha-status", "--broker", asked.url)
        assert table.returncode == 0, table.stderr
        assert "NO PRIMARY" in table.stdout
        assert "primary" not in table.stdout.replace("NO PRIMARY", ""), table.stdout

    # A member that does not answer: `unreachable`, with what the asked broker last knew of it and since when.
    c[2].kill()
    since = own(c[0].url)["membership_since"]
    view = status_json(c[0].url)
    b3 = rows(view)["b3"]
    assert b3["state"] == "unreachable" and b3["role"] is None and b3["source"] == "unreachable"
    assert b3["stale"] == {"role": "backup", "state": "ready", "by": "b1", "since": since}
    assert "cannot reach" in b3["error"]
    table = run("ha-status", "--broker", c[0].url, "--all")
    assert "unreachable" in table.stdout and "stale since" in table.stdout, table.stdout

    # The old primary gone too: a backup's list still names it primary; the header says so, the row does not.
    c[0].kill()
    view = status_json(c[1].url)
    b1 = rows(view)["b1"]
    assert b1["state"] == "unreachable" and b1["stale"]["role"] == "primary"
    assert view["primary"] is None
    table = run("ha-status", "--broker", c[1].url)
    assert "NO PRIMARY (last known primary b1 does not answer)" in table.stdout, table.stdout

    c.promote(1)
    c.wait_state(1, "active")
    view = status_json(c[1].url)
    assert view["primary"] == "b2" and view["primaries"] == ["b2"] and view["epoch"] == 2
    assert "primary b2" in run("ha-status", "--broker", c[1].url).stdout


def test_expect_and_is_primary_answer_scripts_with_exit_codes(cluster: Make, brokers: BrokerFactory) -> None:
    c = cluster(2)
    c.start_with_primary(0)
    p, b = c[0].url, c[1].url
    r = run("ha-status", "--broker", p, "--is-primary")
    assert (r.returncode, r.stdout, r.stderr) == (0, "b1 is primary active\n", "")
    r = run("ha-status", "--broker", b, "--is-primary")
    assert (r.returncode, r.stdout, r.stderr) == (1, "", "ha-status: b2 is backup ready, expected primary\n")
    for url, state, code in ((b, "ready", 0), (b, "backup", 0), (b, "active", 1), (p, "active", 0),
                             (p, "primary", 0), (p, "ready", 1)):
        r = run("ha-status", "--broker", url, "--expect", state)
        assert r.returncode == code, (url, state, r.stdout, r.stderr)
        assert (r.stdout if code == 0 else r.stderr).count("\n") == 1
    r = run("ha-status", "--broker", b, "--expect", "primray")
    assert r.returncode == 2 and "'primray' is not one of" in r.stderr
    r = run("ha-status", "--broker", b, "--expect", "ready", "--is-primary")
    assert r.returncode == 2 and "not with --expect" in r.stderr
    (dead,) = free_ports(1)
    r = run("ha-status", "--broker", f"127.0.0.1:{dead}", "--timeout", "2", "--is-primary")
    assert r.returncode == 1 and r.stderr.count("\n") == 1 and "cannot reach" in r.stderr
    plain = brokers(name="plain")
    r = run("ha-status", "--broker", plain.url, "--expect", "ready")
    assert r.returncode == 1 and "not an HA broker" in r.stderr


# ----- URLs at run time ----------------------------------------------------------------------------------------
def test_public_url_changed_at_run_time_is_in_status_and_in_the_backups_redirects(cluster: Make) -> None:
    c = cluster(2)
    c.start_with_primary(0)
    r = run("ha-admin", "--broker", c[0].url, "set", "--public-url", "10.9.9.9:5672")
    assert r.returncode == 0, r.stderr
    assert own(c[0].url)["public_url"] == "10.9.9.9:5672"
    wait_for(lambda: own(c[1].url)["public_url"] == "10.9.9.9:5672", what="the backup learnt the public URL")
    try:
        connect(c[1].url).close()
        raise AssertionError("a backup accepted a client")
    except ConnectionException as e:
        assert "10.9.9.9:5672" in str(e)
    assert events(c[0], "ha.settings.changed")[-1]["public_url"] == "10.9.9.9:5672"

    before = own(c[0].url)
    for bad, why in (("nohost", "is not host:port"), ("h:70000", "out of range"), ("", "empty list of brokers")):
        r = run("ha-admin", "--broker", c[0].url, "set", "--brokers-url", bad)
        assert r.returncode == 1 and why in r.stderr and "--ha-brokers-url" in r.stderr, r.stderr
    r = run("ha-admin", "--broker", c[0].url, "set")
    assert r.returncode == 2 and "--brokers-url and/or --public-url" in r.stderr
    with ManagementClient(c[0].url) as m:
        assert m.request("SET", "ha-broker", body={"brokers-url": "a:1"}).status == 400
        assert m.request("SET", "ha-broker", body={"public_url": 5672}).status == 400
        assert m.request("SET", "ha-broker", body=None).status == 400
    after = own(c[0].url)
    assert (after["brokers_url"], after["public_url"]) == (before["brokers_url"], before["public_url"])
    assert len(events(c[0], "ha.settings.refused")) == 6


def test_brokers_url_changed_at_run_time_is_used_for_the_next_connection_attempt(
        cluster: Make, brokers: BrokerFactory) -> None:
    c = cluster(2)
    c.start_with_primary(0)
    port, dead = free_ports(2)
    me = f"127.0.0.1:{port}"
    lost = brokers("--ha-cluster", "--ha-brokers-url", f"127.0.0.1:{dead},{me}", "--ha-heartbeat", "1",
                   name="b3", port=port)
    assert own(lost.url)["state"] == "joining"
    r = run("ha-admin", "--broker", lost.url, "set", "--brokers-url", f"{c.brokers_url},{me}")
    assert r.returncode == 0, r.stderr
    assert own(lost.url)["brokers_url"] == f"{c.brokers_url},{me}"
    wait_for(lambda: own(lost.url)["state"] == "ready", timeout=30, what="b3 found the primary and caught up")


# ----- queues ----------------------------------------------------------------------------------------------------
def test_purge_and_move_on_the_primary_replicate_and_are_refused_on_a_backup(cluster: Make) -> None:
    c = cluster(2)
    c.start_with_primary(0)
    p, b = c[0].url, c[1].url
    with mgmt(p) as m:
        for q, args in (("a", {}), ("b", {}), ("small", {"max-count": 3})):
            m.call("CREATE", "queue", q, {"arguments": args})
    send(p, "a", list(range(10)))
    listener = connect(p)
    rcv = listener.create_receiver("b", credit=1)  # a consumer of the destination gets moved messages at once

    r = run("ha-admin", "--broker", p, "move", "a", "b", "--count", "4")
    assert r.returncode == 0 and "moved 4 messages from a to b (6 left on a)" in r.stdout, r.stderr
    assert rcv.receive(5).body == 0
    rcv.accept()
    listener.close()
    def holds(i: int, a: list[int], b: list[int]) -> bool:
        return c.queue_bodies(i, "a") == a and c.queue_bodies(i, "b") == b

    for i in (0, 1):
        wait_for(partial(holds, i, [4, 5, 6, 7, 8, 9], [1, 2, 3]), what=f"move replicated on b{i + 1}")

    # Refusals: precise status and reason, exit 1 (2 for bad usage), nothing changed.
    refusals = [
        (("move", "a", "small"), "409 destination queue 'small' has no room for 6 messages: max-count 3"),
        (("move", "a", "nosuch"), "404 destination queue 'nosuch' not found"),
        (("move", "nosuch", "a"), "404 queue 'nosuch' not found"),
        (("move", "a", "a"), "400 source and destination are the same queue 'a'"),
        (("purge", "nosuch"), "404 queue 'nosuch' not found"),
    ]
    for command, why in refusals:
        r = run("ha-admin", "--broker", p, *command)
        assert r.returncode == 1 and why in r.stderr and r.stderr.count("\n") == 1, (command, r.stderr)
    for command in (("purge", "a"), ("move", "a", "b")):
        r = run("ha-admin", "--broker", b, *command)
        assert r.returncode == 1 and "409 this broker is a backup" in r.stderr, r.stderr
    r = run("ha-admin", "--broker", p, "move", "a", "b", "--count", "0")
    assert r.returncode == 2 and "--count" in r.stderr
    with ManagementClient(p) as m:
        bodies: list[Any] = [{"destination": "b", "count": "2"}, {"destination": "b", "count": True}, {"count": 1},
                             {"destination": "b", "limit": 1}, ["b"]]
        for body in bodies:
            reply = m.request("MOVE", "queue", "a", body)
            assert reply.status == 400, (body, reply.description)
        assert m.request("PURGE", "queue", "a", {"all": True}).status == 400
        assert m.request("PURGE", "queue").status == 400
    assert c.queue_bodies(0, "a") == [4, 5, 6, 7, 8, 9] and c.queue_bodies(0, "small") == []
    refused = events(c[0], "management.refused")
    assert len(refused) >= len(refusals) + 7 and {e["status"] for e in refused} == {400, 404, 409}
    assert events(c[1], "management.refused")[-1]["status"] == 409

    # A purge leaves what a consumer holds; the backup follows.
    holder = connect(p)
    held = holder.create_receiver("a", credit=1)
    assert held.receive(5).body == 4
    r = run("ha-admin", "--broker", p, "purge", "a")
    assert r.returncode == 0 and "purged 5 messages from a (1 left, held by consumers)" in r.stdout, r.stdout
    held.accept()
    holder.close()
    r = run("ha-admin", "--broker", p, "purge", "b")
    assert r.returncode == 0 and "purged 3 messages from b" in r.stdout
    for i in (0, 1):
        wait_for(partial(holds, i, [], []), what=f"purges replicated on b{i + 1}")
    assert [e["count"] for e in events(c[0], "queue.purged")] == [5, 3]


# ----- connections -----------------------------------------------------------------------------------------------
def test_connections_are_listed_with_their_links_and_closed_by_id(broker: BrokerProcess) -> None:
    url = broker.url
    with mgmt(url) as m:
        m.call("CREATE", "queue", "work")
    send(url, "work", ["one", "two", "three"])
    client = connect(url)
    rcv = client.create_receiver("work", credit=2, name="worker")
    assert rcv.receive(5).body == "one"  # two delivered, none settled
    r = run("ha-admin", "--broker", url, "connections", "-f", "json")
    assert r.returncode == 0, r.stderr
    listed = json.loads(r.stdout)
    mine = [cn for cn in listed if any(lk["name"] == "worker" for lk in cn["links"])]
    assert len(mine) == 1 and mine[0]["kind"] == "client" and mine[0]["consumers"] == 1
    link = next(lk for lk in mine[0]["links"] if lk["name"] == "worker")
    assert link == {"name": "worker", "kind": "consumer", "address": "work", "unsettled": 2, "credit": 0}
    ident = str(mine[0]["id"])
    table = run("ha-admin", "--broker", url, "connections")
    assert table.returncode == 0 and "consumer work unsettled=2" in table.stdout, table.stdout

    for bad, why in (("12345", "404 connection 12345 not found"), ("x", "400 connection name must be its id")):
        r = run("ha-admin", "--broker", url, "close-connection", bad)
        assert r.returncode == 1 and why in r.stderr, r.stderr
    r = run("ha-admin", "--broker", url, "close-connection", ident)
    assert r.returncode == 0 and f"connection {ident} (" in r.stdout, r.stderr
    try:
        for _ in range(3):  # "two" may already wait in the client's buffer
            rcv.receive(5)
        raise AssertionError("the closed connection still receives")
    except (ConnectionException, LinkDetached, Timeout) as e:
        assert "amqp:connection:forced" in str(e) and "closed by an operator" in str(e), e
    assert sorted(drain(url, "work")) == ["one", "three", "two"]  # what it held went back
    closed = events(broker, "connection.closed_by_operator")
    assert len(closed) == 1 and closed[0]["connection"] == int(ident)
