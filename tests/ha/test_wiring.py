"""Selective replication of wiring with real broker processes: `qpid.replicate` on queues, exchanges and bindings.

What an operator notices: which queues, exchanges and bindings a backup has (management QUERY on the backup, which
serves admin connections), whether its replica queues hold messages (the `ha-broker` BROWSE operation), and what
survives a failover.
"""

from __future__ import annotations

import functools
import signal
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from proton import Message
from proton.reactor import DynamicNodeProperties

from broker.client import ManagementClient
from tests.support.amqp import connect, drain, mgmt, send
from tests.support.cluster import Cluster
from tests.support.procs import BrokerProcess, wait_for

Make = Callable[..., Cluster]
Key = tuple[str, str, str]


@dataclass(frozen=True)
class Wiring:
    """What QUERY shows on one broker, leaving out management reply queues (`temp.*`) unless asked for."""

    queues: dict[str, dict[str, Any]]
    exchanges: frozenset[str]
    bindings: frozenset[Key]

    def view(self) -> tuple[frozenset[str], frozenset[str], frozenset[Key]]:
        return frozenset(self.queues), self.exchanges, self.bindings


def wiring(b: BrokerProcess, temp: bool = False) -> Wiring:
    with ManagementClient(b.url, timeout=10) as m:
        qs = {r["name"]: r for r in m.call("QUERY", "queue").rows() if temp or not r["name"].startswith("temp.")}
        xs = frozenset(r["name"] for r in m.call("QUERY", "exchange").rows())
        bs = frozenset((r["source"], r["destination"], r["binding-key"]) for r in m.call("QUERY", "binding").rows())
    return Wiring(qs, xs, bs)


def wait_wiring(b: BrokerProcess, queues: set[str], exchanges: set[str], bindings: set[Key],
                timeout: float = 20.0) -> Wiring:
    """Wait until `b` shows exactly this wiring; on timeout, fail with the difference."""
    want = (frozenset(queues), frozenset(exchanges), frozenset(bindings))
    last: list[Wiring] = []

    def check() -> bool:
        last[:] = [wiring(b)]
        return last[0].view() == want

    try:
        wait_for(check, timeout, 0.1, what=f"wiring on {b.name}")
    except AssertionError:
        got = last[0].view()
        for what, g, w in zip(("queues", "exchanges", "bindings"), got, want, strict=True):
            assert g == w, f"{b.name} {what}: extra {sorted(map(str, g - w))}, missing {sorted(map(str, w - g))}"
        raise
    return last[0]


def replicate(level: str | None) -> dict[str, Any]:
    return {} if level is None else {"arguments": {"qpid.replicate": level}}


# The same wiring in every test below: the level of each object is in its name ("default" = no argument).
LEVELS = {"all": "all", "conf": "configuration", "none": "none", "default": None}
BINDINGS: list[tuple[Key, str | None]] = [
    (("x-all", "q-all", "k1"), None),  # both ends replicate
    (("x-all", "q-conf", "k2"), None),  # a configuration queue is an end that replicates
    (("x-conf", "q-default", "k3"), None),
    (("x-all", "q-none", "k4"), None),  # the queue does not replicate: neither does the binding
    (("x-none", "q-all", "k5"), None),  # the exchange does not replicate
    (("x-all", "q-all", "k6"), "none"),  # the binding itself says none
    (("x-default", "q-all", "k7"), "all"),
]


def declare(url: str) -> None:
    """Create the objects, those that must not replicate first (so that seeing the rest means they were skipped)."""
    order = sorted(LEVELS, key=lambda s: s != "none")
    with mgmt(url) as m:
        for suffix in order:
            m.call("CREATE", "exchange", f"x-{suffix}", {"exchange-type": "direct", **replicate(LEVELS[suffix])})
            m.call("CREATE", "queue", f"q-{suffix}", replicate(LEVELS[suffix]))
        for (x, q, k), level in sorted(BINDINGS, key=lambda b: b[1] != "none"):
            m.call("CREATE", "binding", None, {"source": x, "destination": q, "binding-key": k, **replicate(level)})
    for suffix in LEVELS:
        send(url, f"q-{suffix}", [f"{suffix}-{i}" for i in range(3)])


def expected(default: str) -> tuple[set[str], set[str], set[Key]]:
    """What a backup must show when the primary's default level is `default`."""

    def level(suffix: str) -> str:
        return LEVELS[suffix] or default

    queues = {f"q-{s}" for s in LEVELS if level(s) != "none"}
    exchanges = {f"x-{s}" for s in LEVELS if level(s) != "none"}
    bindings = {k for k, blevel in BINDINGS
                if (blevel or default) != "none" and k[0] in exchanges and k[1] in queues}
    return queues, exchanges, bindings


def same_entries(c: Cluster, backup: int, queue: str) -> bool:
    return c.queue_entries(backup, queue) == c.queue_entries(0, queue)


def assert_messages(c: Cluster, backup: int, default: str) -> None:
    """`all` queues hold the primary's messages; `configuration` queues exist but hold none."""
    for suffix in LEVELS:
        lvl = LEVELS[suffix] or default
        q = f"q-{suffix}"
        if lvl == "all":
            wait_for(functools.partial(same_entries, c, backup, q), 15, what=f"{q} replicated with its messages")
        elif lvl == "configuration":
            row = wiring(c[backup]).queues[q]
            assert row["depth"] == 0 and c.queue_bodies(backup, q) == [], f"{q} must carry no messages"
            assert len(c.queue_bodies(0, q)) == 3


def change_and_delete(url: str) -> None:
    with mgmt(url) as m:
        m.call("DELETE", "binding", "x-all|q-all|k1")
        m.call("DELETE", "queue", "q-conf")  # takes binding k2 with it
        m.call("DELETE", "exchange", "x-conf")  # takes binding k3 with it


def after_change(default: str) -> tuple[set[str], set[str], set[Key]]:
    queues, exchanges, bindings = expected(default)
    gone = {("x-all", "q-all", "k1"), ("x-all", "q-conf", "k2"), ("x-conf", "q-default", "k3")}
    return queues - {"q-conf"}, exchanges - {"x-conf"}, bindings - gone


def test_steady_state_replicates_each_level_then_unbind_and_delete(cluster: Make) -> None:
    c = cluster(2)
    c.start_with_primary(0)
    declare(c[0].url)
    # The primary itself has everything.
    prim = wiring(c[0])
    assert {f"q-{s}" for s in LEVELS} <= set(prim.queues)
    assert {k for k, _ in BINDINGS} <= prim.bindings
    wait_wiring(c[1], *expected("all"))
    assert_messages(c, 1, "all")
    change_and_delete(c[0].url)
    wait_wiring(c[1], *after_change("all"))
    assert c.queue_bodies(1, "q-all") == ["all-0", "all-1", "all-2"]


def test_catchup_backup_started_after_the_wiring_exists(cluster: Make) -> None:
    c = cluster(2)
    c.start(0)
    c.promote(0)
    c.wait_state(0, "active")
    declare(c[0].url)
    c.start(1)
    c.wait_state(1, "ready")
    # Ready means mirrored: no waiting for the wiring after the backup says it is ready.
    assert wiring(c[1]).view() == tuple(frozenset(s) for s in expected("all"))
    assert_messages(c, 1, "all")


def test_catchup_unbind_and_delete_while_the_backup_is_away(cluster: Make) -> None:
    """A backup that missed the unbind and deletes (frozen past 2 heartbeats) removes them when it reconciles."""
    c = cluster(2, heartbeat=1.0)
    c.start_with_primary(0)
    declare(c[0].url)
    wait_wiring(c[1], *expected("all"))
    c[1].signal(signal.SIGSTOP)
    try:
        wait_for(lambda: any(e["event"] == "ha.backup.lost" for e in c[0].events()), 15, what="backup dropped")
        change_and_delete(c[0].url)
    finally:
        c[1].signal(signal.SIGCONT)
    wait_wiring(c[1], *after_change("all"))
    wait_for(lambda: [m["state"] for m in Cluster.status(c[0])["members"]] == ["active", "ready"], 20,
             what="backup ready again")
    assert c.queue_bodies(1, "q-all") == ["all-0", "all-1", "all-2"]


@pytest.mark.parametrize("default", ["configuration", "none"])
def test_default_level_comes_from_ha_replicate(cluster: Make, default: str) -> None:
    c = cluster(2, "--ha-replicate", default)
    c.start(0)
    c.promote(0)
    c.wait_state(0, "active")
    declare(c[0].url)  # half of it before the backup joins (catch-up) ...
    c.start(1)
    c.wait_state(1, "ready")
    assert wiring(c[1]).view() == tuple(frozenset(s) for s in expected(default))
    assert_messages(c, 1, default)
    with mgmt(c[0].url) as m:  # ... half after (steady state)
        m.call("CREATE", "queue", "later-default", {})
        m.call("CREATE", "queue", "later-all", replicate("all"))
    send(c[0].url, "later-default", ["d"])
    send(c[0].url, "later-all", ["a"])
    wait_for(lambda: c.queue_bodies(1, "later-all") == ["a"], 15, what="explicit all replicates its messages")
    later = wiring(c[1]).queues
    if default == "none":
        assert "later-default" not in later
    else:
        assert later["later-default"]["depth"] == 0


def test_temporary_queues_are_not_replicated_unless_marked(cluster: Make) -> None:
    c = cluster(2)
    c.start_with_primary(0)
    with mgmt(c[0].url) as m:  # exclusive + auto-delete declared through management: temporary as well
        m.call("CREATE", "queue", "tmp-mgmt", {"exclusive": True, "auto-delete": True})
    conn = connect(c[0].url)
    try:
        plain = conn.create_receiver(None, dynamic=True)  # a client's dynamic reply queue
        marked = conn.create_receiver(None, dynamic=True,
                                      options=DynamicNodeProperties({"qpid.replicate": "all"}))
        plain_name = plain.link.remote_source.address
        marked_name = marked.link.remote_source.address
        assert plain_name and marked_name
        send(c[0].url, marked_name, ["reply"])
        send(c[0].url, plain_name, ["private"])
        wait_for(lambda: c.queue_bodies(1, marked_name) == ["reply"], 15,
                 what="the marked temporary queue replicated with its message")
        on_backup = wiring(c[1], temp=True).queues
        assert plain_name not in on_backup
        assert "tmp-mgmt" not in on_backup
        assert plain_name in wiring(c[0], temp=True).queues
    finally:
        conn.close()
    # The client went away: its temporary queues are gone from the primary, and the marked one from the backup too.
    wait_for(lambda: marked_name not in wiring(c[1], temp=True).queues, 15, what="marked temp queue deleted on backup")
    assert not {plain_name, marked_name} & set(wiring(c[0], temp=True).queues)


def test_none_binding_is_absent_on_the_new_primary_after_failover(cluster: Make) -> None:
    c = cluster(2)
    c.start_with_primary(0)
    with mgmt(c[0].url) as m:
        m.call("CREATE", "exchange", "orders", {"exchange-type": "direct"})
        m.call("CREATE", "queue", "eu", {})
        m.call("CREATE", "binding", None, {"source": "orders", "destination": "eu", "binding-key": "local",
                                           "arguments": {"qpid.replicate": "none"}})
        m.call("CREATE", "binding", None, {"source": "orders", "destination": "eu", "binding-key": "kept"})
    wait_wiring(c[1], {"eu"}, {"orders"}, {("orders", "eu", "kept")})
    c[0].kill()
    c.promote(1)
    c.wait_state(1, "active")
    with mgmt(c[1].url) as m:
        assert m.call("READ", "binding", "orders|eu|kept").status == 200
        r = m.request("READ", "binding", "orders|eu|local")
        assert r.status == 404, r
        keys = {row["binding-key"] for row in m.call("QUERY", "binding").rows() if row["source"] == "orders"}
    assert keys == {"kept"}
    # What a client notices: only the replicated key routes on the new primary.
    conn = connect(c[1].url)
    s = conn.create_sender("orders")
    s.send(Message(body="via kept", subject="kept"))
    s.send(Message(body="via local", subject="local"))
    conn.close()
    assert drain(c[1].url, "eu") == ["via kept"]


@pytest.mark.parametrize("type_", ["queue", "exchange", "binding"])
def test_invalid_replicate_value_refused_by_management(cluster: Make, type_: str) -> None:
    c = cluster(2)
    c.start_with_primary(0)
    bad = {"qpid.replicate": "sometimes"}
    with mgmt(c[0].url) as m:
        m.call("CREATE", "exchange", "x", {"exchange-type": "direct"})
        m.call("CREATE", "queue", "q", {})
        body: dict[str, Any] = {"arguments": bad}
        if type_ == "exchange":
            body["exchange-type"] = "direct"
        if type_ == "binding":
            body.update(source="x", destination="q", **{"binding-key": "bad"})
        r = m.request("CREATE", type_, None if type_ == "binding" else "bad", body)
        assert r.status == 400, r
        assert "qpid.replicate" in r.description and "sometimes" in r.description
        m.call("CREATE", "queue", "sentinel", {})  # seen on the backup => what came before was seen too
    wait_for(lambda: "sentinel" in wiring(c[1]).queues, 15, what="sentinel on the backup")
    for i in (0, 1):
        w = wiring(c[i])
        assert "bad" not in w.queues and "bad" not in w.exchanges
        assert ("x", "q", "bad") not in w.bindings


def test_invalid_replicate_value_in_dynamic_node_properties_refuses_the_link(cluster: Make) -> None:
    c = cluster(2)
    c.start_with_primary(0)
    before = set(wiring(c[0], temp=True).queues)
    conn = connect(c[0].url)
    try:
        with pytest.raises(Exception) as exc:
            conn.create_receiver(None, dynamic=True, options=DynamicNodeProperties({"qpid.replicate": "sometimes"}))
        cond = exc.value.link.remote_condition  # type: ignore[attr-defined]
        assert cond is not None and cond.name == "amqp:invalid-field"
        assert "qpid.replicate" in cond.description
    finally:
        conn.close()
    with mgmt(c[0].url) as m:
        m.call("CREATE", "queue", "sentinel", {})
    wait_for(lambda: "sentinel" in wiring(c[1]).queues, 15, what="sentinel on the backup")
    for i in (0, 1):
        qs = wiring(c[i], temp=True).queues
        assert not [n for n, r in qs.items() if (r.get("arguments") or {}).get("qpid.replicate") == "sometimes"]
    # Nothing new on the primary but the sentinel (and this QUERY's own reply queue).
    new = set(wiring(c[0], temp=True).queues) - before - {"sentinel"}
    assert len(new) <= 1 and all(n.startswith("temp.") for n in new)
    refused = [e for e in c[0].events() if e["event"] == "link.refused"]
    assert refused and refused[-1]["condition"] == "amqp:invalid-field"


def test_changing_a_queue_level_with_ha_admin_replicate_is_followed_by_the_backup(cluster: Make) -> None:
    c = cluster(2)
    c.start_with_primary(0)
    with mgmt(c[0].url) as m:
        m.call("CREATE", "queue", "orders", replicate("none"))
    send(c[0].url, "orders", ["a", "b"])

    def level(lvl: str) -> None:
        r = Cluster.admin(c[0], "replicate", "orders", "--level", lvl)
        assert r.returncode == 0, r.stderr

    level("all")  # none -> all: the backup creates the queue and catches up its messages
    wait_for(lambda: c.queue_bodies(1, "orders") == ["a", "b"], 15, what="orders replicated after 'all'")
    level("configuration")  # all -> configuration: the queue stays, its messages go, new ones do not come
    send(c[0].url, "orders", ["c"])
    wait_for(lambda: "orders" in wiring(c[1]).queues and c.queue_bodies(1, "orders") == [], 15,
             what="orders without messages on the backup")
    level("none")  # -> none: the backup drops the queue
    wait_for(lambda: "orders" not in wiring(c[1]).queues, 15, what="orders gone from the backup")
    level("all")
    wait_for(lambda: c.queue_bodies(1, "orders") == ["a", "b", "c"], 15, what="orders replicated again")
    assert c.queue_entries(1, "orders") == c.queue_entries(0, "orders")
    wait_for(lambda: [m["state"] for m in Cluster.status(c[0])["members"]] == ["active", "ready"], 15,
             what="backup ready")
