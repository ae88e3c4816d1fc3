"""Management round trips (queue, exchange, binding) and the `$events` wiring stream with its sequence numbers."""

from __future__ import annotations

from typing import Any

import pytest
from proton import Delivery, Message
from proton.utils import BlockingConnection, BlockingReceiver, SendException

from broker.client import ManagementClient
from tests.broker.helpers import outcome, send_raw
from tests.support.amqp import connect, drain, mgmt, send
from tests.support.procs import BrokerProcess


def test_queue_create_read_update_query_delete(shared_broker: BrokerProcess, qname: str) -> None:
    url = shared_broker.url
    with mgmt(url) as m:
        created = m.request("CREATE", "queue", qname, {"arguments": {"max-count": 3, "lvq-key": "k",
                                                                     "x-custom": "kept"}})
        assert created.status == 201
        read = m.call("READ", "queue", qname).body
        assert read["arguments"] == {"max-count": 3, "lvq-key": "k", "x-custom": "kept"}
        assert (read["name"], read["type"], read["depth"], read["uuid"]) == (qname, "queue", 0, created.body["uuid"])
        updated = m.request("UPDATE", "queue", qname, {"max-count": 2, "limit-policy": "reject"})
        assert updated.status == 200
        assert m.call("READ", "queue", qname).body["arguments"] == {
            "max-count": 2, "limit-policy": "reject", "lvq-key": "k", "x-custom": "kept"}
    # The update is in force: a third distinct message does not fit.
    c = connect(url)
    try:
        s = c.create_sender(qname)
        s.send(Message(body=1, properties={"k": "a"}))
        s.send(Message(body=2, properties={"k": "b"}))
        with pytest.raises(SendException) as exc:
            s.send(Message(body=3, properties={"k": "c"}))
        assert exc.value.state == Delivery.REJECTED
    finally:
        c.close()
    with mgmt(url) as m:
        q = m.call("QUERY", "queue", body={"attributeNames": ["name", "depth", "arguments"]})
        assert q.body["attributeNames"] == ["name", "depth", "arguments"]
        rows = {r["name"]: r for r in q.rows()}
        assert rows[qname] == {"name": qname, "depth": 2, "arguments": {
            "max-count": 2, "limit-policy": "reject", "lvq-key": "k", "x-custom": "kept"}}
        assert q.properties["count"] == len(q.body["results"])
        full = {r["name"]: r for r in m.call("QUERY", "queue").rows()}
        assert full[qname]["enqueued"] == 2 and full[qname]["uuid"] == created.body["uuid"]
        assert m.request("DELETE", "queue", qname).status == 204
        assert m.request("READ", "queue", qname).status == 404
        assert qname not in {r["name"] for r in m.call("QUERY", "queue").rows()}


def test_exchange_and_binding_round_trip(shared_broker: BrokerProcess, qname: str) -> None:
    url = shared_broker.url
    ex, q = qname + "-x", qname + "-q"
    with mgmt(url) as m:
        assert m.request("CREATE", "exchange", ex, {"exchange-type": "topic", "arguments": {"durable": True}}).status == 201
        x = m.call("READ", "exchange", ex).body
        assert (x["exchange-type"], x["arguments"], x["bindings"]) == ("topic", {"durable": True}, 0)
        assert m.request("UPDATE", "exchange", ex, {"exchange-type": "fanout"}).status == 400
        m.call("CREATE", "queue", q)
        b = m.request("CREATE", "binding", None, {"source": ex, "destination": q, "binding-key": "a.*",
                                                  "arguments": {"qpid.replicate": "none"}})
        assert b.status == 201
        name = b.body["name"]
        assert name == f"{ex}|{q}|a.*"
        by_name = m.call("READ", "binding", name).body
        by_attrs = m.call("READ", "binding", None, {"source": ex, "destination": q, "binding-key": "a.*"}).body
        assert by_name == by_attrs
        assert (by_name["source"], by_name["destination"], by_name["binding-key"], by_name["arguments"]) == (
            ex, q, "a.*", {"qpid.replicate": "none"})
        assert m.call("READ", "exchange", ex).body["bindings"] == 1
        rows = m.call("QUERY", "binding", body={"attributeNames": ["name", "source", "destination", "binding-key"]})
        assert [ex, q, "a.*"] in [r[1:] for r in rows.body["results"] if r[0] == name]
    send(url, ex, ["routed"], subject="a.b")
    send(url, ex, ["not routed"], subject="b.a")
    assert drain(url, q) == ["routed"]
    with mgmt(url) as m:
        assert m.request("DELETE", "binding", name).status == 204
        assert m.request("READ", "binding", name).status == 404
    send(url, ex, ["after unbind"], subject="a.b")
    assert drain(url, q) == []
    with mgmt(url) as m:
        assert m.request("DELETE", "exchange", ex).status == 204
        assert m.request("READ", "exchange", ex).status == 404
        assert m.request("READ", "queue", q).status == 200  # deleting an exchange leaves its queues


def test_deleting_a_queue_removes_its_bindings(shared_broker: BrokerProcess, qname: str) -> None:
    url = shared_broker.url
    with mgmt(url) as m:
        m.call("CREATE", "exchange", qname + "-x", {"exchange-type": "fanout"})
        m.call("CREATE", "queue", qname)
        m.call("CREATE", "binding", None, {"source": qname + "-x", "destination": qname})
        m.call("DELETE", "queue", qname)
        assert m.call("READ", "exchange", qname + "-x").body["bindings"] == 0


# ----- $events -----------------------------------------------------------------------------------------------------
def events_receiver(url: str) -> tuple[BlockingConnection, BlockingReceiver]:
    c = connect(url)
    return c, c.create_receiver("$events", credit=1000)


def take(r: BlockingReceiver, until: Any, timeout: float = 10.0) -> list[dict[str, Any]]:
    """Events (application properties + subject + body) until one satisfies `until` (inclusive)."""
    out: list[dict[str, Any]] = []
    while True:
        m = r.receive(timeout)
        ev: dict[str, Any] = dict(m.properties or {})
        ev["subject"] = m.subject
        ev["body"] = m.body
        out.append(ev)
        if until(ev):
            return out


def test_events_stream_wiring_changes_in_sequence_order(broker: BrokerProcess) -> None:
    url = broker.url
    c, r = events_receiver(url)
    try:
        with mgmt(url) as m:
            m.call("CREATE", "exchange", "ev-x", {"exchange-type": "direct"})
            m.call("CREATE", "queue", "ev-q", {"arguments": {"max-count": 7}})
            m.call("CREATE", "binding", None, {"source": "ev-x", "destination": "ev-q", "binding-key": "k"})
            m.call("DELETE", "binding", "ev-x|ev-q|k")
            m.call("CREATE", "binding", None, {"source": "ev-x", "destination": "ev-q", "binding-key": "k2"})
            m.call("DELETE", "queue", "ev-q")  # takes its binding with it
            m.call("DELETE", "exchange", "ev-x")
        evs = take(r, lambda e: (e["kind"], e["name"]) == ("deleted", "ev-x"))
    finally:
        c.close()
    seqs = [e["seq"] for e in evs]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), "every wiring change, none skipped, in order"
    mine = [(e["kind"], e["type"], e["name"]) for e in evs if not e["name"].startswith("temp.")]
    assert mine == [
        ("declared", "exchange", "ev-x"),
        ("declared", "queue", "ev-q"),
        ("bound", "binding", "ev-x|ev-q|k"),
        ("unbound", "binding", "ev-x|ev-q|k"),
        ("bound", "binding", "ev-x|ev-q|k2"),
        ("unbound", "binding", "ev-x|ev-q|k2"),
        ("deleted", "queue", "ev-q"),
        ("deleted", "exchange", "ev-x"),
    ]
    declared_q = next(e for e in evs if (e["kind"], e["name"]) == ("declared", "ev-q"))
    assert declared_q["subject"] == "queue.declared"
    assert declared_q["body"]["arguments"] == {"max-count": 7}
    bound = next(e for e in evs if e["kind"] == "bound")
    assert (bound["body"]["source"], bound["body"]["destination"], bound["body"]["binding-key"]) == (
        "ev-x", "ev-q", "k")


def test_query_seq_covers_exactly_the_events_before_it(broker: BrokerProcess) -> None:
    """Subscribe, change wiring, QUERY, change more: replaying the events with seq <= the QUERY's seq gives exactly
    the QUERY's result, and every later change has a higher seq."""
    url = broker.url
    c, r = events_receiver(url)
    m = ManagementClient(url)
    try:
        for i in range(5):
            m.call("CREATE", "queue", f"seq-q{i}")
        m.call("CREATE", "exchange", "seq-x", {"exchange-type": "fanout"})
        m.call("CREATE", "binding", None, {"source": "seq-x", "destination": "seq-q1"})
        m.call("DELETE", "queue", "seq-q3")
        query = {t: m.call("QUERY", t, body={"attributeNames": ["name"]}) for t in ("queue", "exchange", "binding")}
        seqs = {t: int(q.properties["seq"]) for t, q in query.items()}
        assert len(set(seqs.values())) == 1  # nothing changed between the three queries
        at = seqs["queue"]
        m.call("CREATE", "queue", "seq-after")
        m.call("DELETE", "queue", "seq-q4")
        evs = take(r, lambda e: (e["kind"], e["name"]) == ("deleted", "seq-q4"))
    finally:
        m.close()
        c.close()
    replay: dict[str, set[str]] = {"queue": set(), "exchange": set(), "binding": set()}
    for e in evs:
        if e["seq"] > at:
            continue
        if e["kind"] in ("declared", "bound"):
            replay[e["type"]].add(e["name"])
        else:
            replay[e["type"]].discard(e["name"])
    for t, q in query.items():
        assert {row[0] for row in q.body["results"]} == replay[t], t
    later = [(e["kind"], e["name"]) for e in evs if e["seq"] > at and not e["name"].startswith("temp.")]
    assert later == [("declared", "seq-after"), ("deleted", "seq-q4")]
    assert "seq-q3" not in replay["queue"] and {"seq-q0", "seq-q4"} <= replay["queue"]


def _rss_kib() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def test_a_long_running_caller_does_not_grow_with_each_management_client(shared_broker: BrokerProcess) -> None:
    """understudy-cluster asks every broker for its status every few seconds, each time with a new client: the
    clients' memory must be given back (it was not: ~1.7 MB per client stayed, a cycle through proton's C links)."""
    def one() -> None:
        with ManagementClient(shared_broker.url) as m:
            m.call("READ", "broker", "broker")

    for _ in range(5):  # warm-up: imports, proton's first allocations
        one()
    before = _rss_kib()
    for _ in range(60):
        one()
    grown = _rss_kib() - before
    assert grown < 20 * 1024, f"RSS grew by {grown} KiB over 60 management clients"


def _request(url: str, reply_to: str, operation: str, type_: str, name: str | None = None) -> Delivery:
    """A management request sent by hand with its own `reply-to`; the delivery once the broker settled it."""
    props = {"operation": operation, "type": type_, **({"name": name} if name is not None else {})}
    c = connect(url)
    try:
        return send_raw(c, "$management", bytes(Message(properties=props, reply_to=reply_to, id=1).encode()))
    finally:
        c.close()


def test_a_request_whose_reply_to_names_no_queue_is_rejected_and_not_carried_out(
        shared_broker: BrokerProcess, qname: str) -> None:
    """Its outcome could never be told: a CREATE that went ahead would leave its caller guessing (and waiting)."""
    url = shared_broker.url
    d = _request(url, qname + "-nowhere", "CREATE", "queue", qname)
    assert outcome(d) == (Delivery.REJECTED, "amqp:not-found")
    assert f"reply-to '{qname}-nowhere': no such queue; the request was not carried out" in d.remote.condition.description
    with mgmt(url) as m:
        assert m.request("READ", "queue", qname).status == 404
    line = [e for e in shared_broker.events() if e["event"] == "management.reply_refused"
            and e["reply_to"] == qname + "-nowhere"]
    assert [(e["operation"], e["name"], e["condition"]) for e in line] == [("CREATE", qname, "amqp:not-found")]


def test_a_reply_goes_to_the_queue_named_and_one_that_finds_it_full_is_logged(
        shared_broker: BrokerProcess, qname: str) -> None:
    url = shared_broker.url
    with mgmt(url) as m:
        m.call("CREATE", "queue", qname, {"arguments": {"max-count": 1, "limit-policy": "reject"}})
    d = _request(url, qname, "READ", "queue", qname)  # room for one: the reply lands there, as AMQP management says
    assert outcome(d) == (Delivery.ACCEPTED, None)
    (reply,) = drain(url, qname, browse=True)
    assert reply["name"] == qname
    d = _request(url, qname, "READ", "queue", qname)  # full now: the request is done, its reply cannot be put
    assert outcome(d) == (Delivery.ACCEPTED, None)
    with mgmt(url) as m:
        assert m.call("READ", "queue", qname).body["depth"] == 1
    line = [e for e in shared_broker.events() if e["event"] == "management.reply_refused" and e["reply_to"] == qname]
    assert [(e["operation"], e["condition"]) for e in line] == [("READ", "amqp:resource-limit-exceeded")]
    assert "READ queue was carried out (200), but its reply could not be put on" in line[0]["description"]
