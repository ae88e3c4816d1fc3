"""An attach says only what the broker does: filters it does not honour, transactions and exchange arguments.

Source filters: a receiver from an exchange may ask for its binding key (Qpid's legacy binding filters); every other
filter, and any filter on a queue, is refused with amqp:not-implemented naming it, instead of being echoed and
ignored. A coordinator (transaction) link is a coordinator, not an anonymous relay (tests/broker/test_transactions.py). An exchange's `alternate-exchange` takes what no binding
matches, and an `auto-delete` exchange goes with its last binding.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from proton import Described, Terminus, symbol, ulong
from proton.handlers import MessagingHandler, TransactionHandler
from proton.reactor import Container, Filter, LinkOption, Selector
from proton.utils import LinkDetached

from broker.client import ManagementError
from broker.errors import LinkError
from broker.terminus import BINDING_FILTERS, binding_key_from_filter, refuse_filters, source_filters
from tests.support.amqp import connect, drain, mgmt, receive, send
from tests.support.procs import BrokerProcess, wait_for

SELECTOR = "apache.org:selector-filter:string"
TOPIC_BINDING = "apache.org:legacy-amqp-topic-binding:string"
DIRECT_BINDING = "apache.org:legacy-amqp-direct-binding:string"


def refused_attach(url: str, address: str, options: Any) -> tuple[str, str]:
    """Attach a receiver that the broker must refuse; return (condition, description)."""
    c = connect(url)
    try:
        with pytest.raises(LinkDetached) as info:
            c.create_receiver(address, options=options)
        cond = info.value.link.remote_condition
        assert cond is not None
        return cond.name, cond.description or ""
    finally:
        c.close()


def depth(url: str, queue: str) -> int:
    with mgmt(url) as m:
        return int(m.call("READ", "queue", queue).body["depth"])


def refusals(b: BrokerProcess) -> list[dict[str, Any]]:
    return [e for e in b.events() if e.get("event") == "link.refused"]


# ----- source filters: the pure part ----------------------------------------------------------------------------
descriptors = st.one_of(
    st.text(min_size=1, max_size=60).map(symbol),
    st.integers(min_value=0, max_value=2**64 - 1).map(ulong),
).filter(lambda d: (int(d) if isinstance(d, int) else str(d)) not in BINDING_FILTERS)


@given(st.dictionaries(st.text(min_size=1, max_size=10).map(symbol),
                       st.tuples(descriptors, st.one_of(st.text(), st.integers(), st.none())), min_size=1,
                       max_size=4))
def test_a_filter_the_broker_does_not_know_is_refused_by_name_on_queues_and_exchanges(
        filters: dict[symbol, tuple[Any, Any]]) -> None:
    filt = {k: Described(d, v) for k, (d, v) in filters.items()}
    with pytest.raises(LinkError) as q:
        refuse_filters(filt, "queue 'q'")
    with pytest.raises(LinkError) as x:
        binding_key_from_filter(filt, "x")
    first = next(iter(filters))
    for e in (q.value, x.value):
        assert e.condition == "amqp:not-implemented"
        assert repr(str(first)) in e.description


@given(st.sampled_from(sorted(BINDING_FILTERS, key=str)), st.text(max_size=40), st.text(min_size=1, max_size=10))
def test_a_binding_filter_gives_its_key_on_an_exchange_and_is_refused_on_a_queue(
        descriptor: str | int, key: str, name: str) -> None:
    d = ulong(descriptor) if isinstance(descriptor, int) else symbol(descriptor)
    filt = {symbol(name): Described(d, key)}
    assert binding_key_from_filter(filt, "x") == key
    assert [(f.key, f.value) for f in source_filters(filt)] == [(name, key)]
    with pytest.raises(LinkError, match="not supported on queue"):
        refuse_filters(filt, "queue 'q'")


def test_two_binding_keys_or_a_filter_that_is_not_a_map_are_refused() -> None:
    two = {symbol("a"): Described(symbol(TOPIC_BINDING), "a.#"), symbol("b"): Described(symbol(DIRECT_BINDING), "b")}
    with pytest.raises(LinkError, match="2 binding keys"):
        binding_key_from_filter(two, "x")
    with pytest.raises(LinkError, match="must be a map, got list") as e:
        binding_key_from_filter(["a"], "x")
    assert e.value.condition == "amqp:invalid-field"
    assert binding_key_from_filter(None, "x") is None
    refuse_filters(None, "queue 'q'")
    refuse_filters({}, "queue 'q'")


# ----- source filters with a real broker ------------------------------------------------------------------------
def test_a_selector_on_a_queue_is_refused_naming_it_and_takes_nothing(broker: BrokerProcess) -> None:
    with mgmt(broker.url) as m:
        m.call("CREATE", "queue", "orders")
    send(broker.url, "orders", ["red", "blue"], properties={"colour": "red"})
    cond, desc = refused_attach(broker.url, "orders", Selector("colour = 'blue'"))
    assert cond == "amqp:not-implemented"
    assert "'selector' (apache.org:selector-filter:string) is not supported on queue 'orders'" in desc
    assert depth(broker.url, "orders") == 2  # nothing was delivered to the refused receiver
    assert [e["address"] for e in refusals(broker)] == ["orders"]
    # A browser and a dynamic queue are queues too.
    from proton.reactor import Copy, DynamicNodeProperties

    class SelectorCopy(Copy):
        def apply(self, link: Any) -> None:
            super().apply(link)
            Selector("colour = 'blue'").apply(link)

    assert refused_attach(broker.url, "orders", SelectorCopy())[0] == "amqp:not-implemented"

    class DynamicSelector(DynamicNodeProperties):
        def apply(self, link: Any) -> None:
            link.source.dynamic = True
            Selector("x = 1").apply(link)

    cond, desc = refused_attach(broker.url, None, DynamicSelector({}))  # type: ignore[arg-type]
    assert (cond, "on a dynamic queue" in desc) == ("amqp:not-implemented", True)
    assert receive(broker.url, "orders", 2) == ["red", "blue"]


def test_a_refused_filter_does_not_auto_create_the_queue(brokers: Any) -> None:
    b = brokers("--auto-create-queues")
    assert refused_attach(b.url, "fresh", Selector("a = 1"))[0] == "amqp:not-implemented"
    with mgmt(b.url) as m:
        assert m.request("READ", "queue", "fresh").status == 404


def test_a_topic_binding_filter_on_an_exchange_is_honoured_and_echoed(broker: BrokerProcess) -> None:
    with mgmt(broker.url) as m:
        m.call("CREATE", "exchange", "news", {"exchange-type": "topic"})
    c = connect(broker.url)
    try:
        f = {symbol("subject"): Described(symbol(TOPIC_BINDING), "sport.*")}
        r = c.create_receiver("news", name="sport", options=Filter(f), credit=10)
        echoed = r.link.remote_source.filter
        echoed.rewind()
        echoed.next()
        assert echoed.get_object() == f
        coded = {symbol("k"): Described(ulong(0x0000468C00000001), "weather.#")}
        r2 = c.create_receiver("news", name="weather", options=Filter(coded), credit=10)
        for subject in ("sport.tennis", "weather.rain.heavy", "sport.golf.open", "politics"):
            send(broker.url, "news", [subject], subject=subject)
        assert r.receive(5).body == "sport.tennis"
        r.accept()
        assert r2.receive(5).body == "weather.rain.heavy"
        r2.accept()
    finally:
        c.close()
    assert drain(broker.url, "news") == []


def test_a_selector_on_an_exchange_is_refused_not_taken_as_a_binding_key(broker: BrokerProcess) -> None:
    with mgmt(broker.url) as m:
        m.call("CREATE", "exchange", "prices", {"exchange-type": "direct"})
    cond, desc = refused_attach(broker.url, "prices", Selector("EUR"))
    assert cond == "amqp:not-implemented"
    assert "not supported on exchange 'prices'" in desc
    with mgmt(broker.url) as m:
        assert m.call("QUERY", "binding").rows() == []  # no private queue bound to "EUR"


# ----- transactions ---------------------------------------------------------------------------------------------
class CoordinatorTarget(LinkOption):
    def apply(self, link: Any) -> None:
        link.target.type = Terminus.COORDINATOR


def test_a_coordinator_link_is_attached_as_a_coordinator_not_a_relay(broker: BrokerProcess) -> None:
    c = connect(broker.url)
    try:
        s = c.create_sender(None, options=CoordinatorTarget())
        assert s.link.remote_target.type == Terminus.COORDINATOR
    finally:
        c.close()


def test_proton_transaction_api_declares_a_transaction(broker: BrokerProcess) -> None:
    class Declare(MessagingHandler, TransactionHandler):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.outcome: tuple[str, ...] = ()

        def on_start(self, event: Any) -> None:
            self.conn = event.container.connect(broker.url, reconnect=False)
            event.container.declare_transaction(self.conn, handler=self)

        def on_transaction_declared(self, event: Any) -> None:
            self.outcome = ("declared",)
            self.conn.close()

        def on_transaction_declare_failed(self, event: Any) -> None:
            self.outcome = ("declare failed",)
            self.conn.close()

        def on_link_error(self, event: Any) -> None:
            cond = event.link.remote_condition
            self.outcome = ("link error", cond.name, cond.description)
            self.conn.close()

    h = Declare()
    Container(h).run()
    assert h.outcome == ("declared",)


# ----- exchange arguments ---------------------------------------------------------------------------------------
def test_unroutable_messages_go_to_the_alternate_exchange_down_the_chain(broker: BrokerProcess) -> None:
    with mgmt(broker.url) as m:
        for q in ("orders", "unrouted", "last"):
            m.call("CREATE", "queue", q)
        m.call("CREATE", "exchange", "last-resort", {"exchange-type": "fanout"})
        m.call("CREATE", "exchange", "spill", {"exchange-type": "direct",
                                               "arguments": {"alternate-exchange": "last-resort"}})
        m.call("CREATE", "exchange", "in", {"exchange-type": "direct", "arguments": {"alternate-exchange": "spill"}})
        m.call("CREATE", "binding", None, {"source": "in", "destination": "orders", "binding-key": "order"})
        m.call("CREATE", "binding", None, {"source": "spill", "destination": "unrouted", "binding-key": "typo"})
        m.call("CREATE", "binding", None, {"source": "last-resort", "destination": "last", "binding-key": ""})
    for subject in ("order", "typo", "other"):
        send(broker.url, "in", [subject], subject=subject)
    assert drain(broker.url, "orders") == ["order"]
    assert drain(broker.url, "unrouted") == ["typo"]
    assert drain(broker.url, "last") == ["other"]
    with mgmt(broker.url) as m:
        counts = {x: (m.call("READ", "exchange", x).body["routed"], m.call("READ", "exchange", x).body["unrouted"])
                  for x in ("in", "spill", "last-resort")}
    assert counts == {"in": (1, 2), "spill": (1, 1), "last-resort": (1, 0)}


def test_an_alternate_exchange_cycle_ends_unrouted_and_self_reference_is_refused(broker: BrokerProcess) -> None:
    with mgmt(broker.url) as m:
        m.call("CREATE", "exchange", "a", {"arguments": {"alternate-exchange": "b"}})
        m.call("CREATE", "exchange", "b", {"arguments": {"alternate-exchange": "a"}})
        with pytest.raises(ManagementError) as e:
            m.call("CREATE", "exchange", "c", {"arguments": {"alternate-exchange": "c"}})
        assert e.value.status == 400
        assert "alternate-exchange: exchange 'c' cannot be its own alternate" in str(e.value)
    send(broker.url, "a", ["lost"], subject="nowhere")  # accepted (unroutable), and the broker stays up
    with mgmt(broker.url) as m:
        assert m.call("READ", "exchange", "a").body["unrouted"] == 1
        assert m.call("READ", "exchange", "b").body["unrouted"] == 1
        assert m.request("READ", "exchange", "c").status == 404
    assert [(e["operation"], e["status"]) for e in broker.events()
            if e.get("event") == "management.request" and e.get("name") == "c"] == [("CREATE", 400)]


def test_an_auto_delete_exchange_goes_with_its_last_binding(broker: BrokerProcess) -> None:
    with mgmt(broker.url) as m:
        m.call("CREATE", "queue", "q1")
        m.call("CREATE", "queue", "q2")
        m.call("CREATE", "exchange", "fleeting", {"exchange-type": "direct", "arguments": {"auto-delete": True}})
        m.call("CREATE", "exchange", "kept", {"exchange-type": "direct"})
        for x in ("fleeting", "kept"):
            m.call("CREATE", "binding", None, {"source": x, "destination": "q1", "binding-key": "k"})
            m.call("CREATE", "binding", None, {"source": x, "destination": "q2", "binding-key": "k"})
            m.call("DELETE", "binding", f"{x}|q1|k")
        assert m.call("READ", "exchange", "fleeting").body["bindings"] == 1  # not yet: one binding left
        m.call("DELETE", "queue", "q2")  # takes the last binding with it
        assert m.request("READ", "exchange", "fleeting").status == 404
        assert m.call("READ", "exchange", "kept").body["bindings"] == 0


def test_an_auto_delete_exchange_goes_when_its_last_subscriber_detaches(broker: BrokerProcess) -> None:
    with mgmt(broker.url) as m:
        m.call("CREATE", "exchange", "ticker", {"exchange-type": "topic", "arguments": {"auto-delete": True}})
    c = connect(broker.url)
    r = c.create_receiver("ticker", credit=5)
    send(broker.url, "ticker", ["tick"], subject="a.b")
    assert r.receive(5).body == "tick"
    r.accept()
    c.close()

    def gone() -> bool:
        with mgmt(broker.url) as m:
            return m.request("READ", "exchange", "ticker").status == 404

    wait_for(gone, 10, 0.05, what="auto-delete exchange deleted after its subscriber left")
    assert any(e.get("event") == "wiring.deleted" and e.get("name") == "ticker" for e in broker.events())


def test_an_auto_delete_exchange_without_bindings_stays(broker: BrokerProcess) -> None:
    with mgmt(broker.url) as m:
        m.call("CREATE", "exchange", "idle", {"arguments": {"auto-delete": True}})
        m.call("DELETE", "exchange", "idle")  # an explicit delete of an auto-delete exchange works as usual
        m.call("CREATE", "exchange", "idle", {"arguments": {"auto-delete": True}})
        assert m.call("READ", "exchange", "idle").body["arguments"] == {"auto-delete": True}
