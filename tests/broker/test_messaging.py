"""Messaging through a real broker process with real proton clients."""

from __future__ import annotations

import time

import pytest
from proton import Delivery, Message
from proton.reactor import AtLeastOnce, AtMostOnce, Copy, DynamicNodeProperties
from proton.utils import LinkDetached, SendException

from tests.support.amqp import connect, drain, mgmt, receive, send, settle_last
from tests.support.procs import BrokerProcess


def create_queue(url: str, name: str, **args: object) -> None:
    with mgmt(url) as m:
        m.call("CREATE", "queue", name, {"arguments": args})


def test_send_and_receive_in_order(shared_broker: BrokerProcess, qname: str) -> None:
    send(shared_broker.url, qname, list(range(50)))
    assert receive(shared_broker.url, qname, 50) == list(range(50))
    assert drain(shared_broker.url, qname) == []


def test_accept_removes_release_requeues_at_old_place(shared_broker: BrokerProcess, qname: str) -> None:
    url = shared_broker.url
    send(url, qname, ["a", "b", "c"])
    c = connect(url)
    r = c.create_receiver(qname, credit=1)
    assert r.receive(5).body == "a"
    r.release(delivered=False)  # released: back at its old place, not counted as a delivery attempt
    m = r.receive(5)
    assert m.body == "a"
    assert m.delivery_count == 0
    r.accept()
    assert r.receive(5).body == "b"
    r.accept()
    c.close()
    assert drain(url, qname) == ["c"]


def test_modified_delivery_failed_counts_attempts(shared_broker: BrokerProcess, qname: str) -> None:
    url = shared_broker.url
    send(url, qname, ["x"])
    c = connect(url)
    r = c.create_receiver(qname, credit=1)
    for attempt in range(3):
        m = r.receive(5)
        assert m.body == "x"
        assert m.delivery_count == attempt
        settle_last(r, Delivery.MODIFIED, failed=True)
    m = r.receive(5)
    assert m.delivery_count == 3
    r.accept()
    c.close()


def test_modified_undeliverable_here_goes_to_another_consumer(shared_broker: BrokerProcess, qname: str) -> None:
    url = shared_broker.url
    send(url, qname, ["only"])
    c = connect(url)
    r1 = c.create_receiver(qname, credit=1)
    assert r1.receive(5).body == "only"
    settle_last(r1, Delivery.MODIFIED, failed=True, undeliverable=True)
    with pytest.raises(Exception):  # noqa: B017 - proton raises Timeout
        r1.receive(0.5)
    r2 = c.create_receiver(qname, credit=1, name="second")
    m = r2.receive(5)
    assert m.body == "only"
    assert m.delivery_count == 1
    r2.accept()
    c.close()


def test_rejected_goes_to_alternate_exchange(shared_broker: BrokerProcess, qname: str) -> None:
    url = shared_broker.url
    dlq = qname + "-dlq"
    with mgmt(url) as m:
        m.call("CREATE", "exchange", qname + "-dlx", {"exchange-type": "fanout"})
        m.call("CREATE", "queue", dlq, {})
        m.call("CREATE", "binding", None, {"source": qname + "-dlx", "destination": dlq, "binding-key": ""})
        m.call("CREATE", "queue", qname, {"arguments": {"alternate-exchange": qname + "-dlx"}})
    send(url, qname, ["poison", "fine"])
    c = connect(url)
    r = c.create_receiver(qname, credit=1)
    assert r.receive(5).body == "poison"
    r.reject()
    assert r.receive(5).body == "fine"
    r.accept()
    c.close()
    assert drain(url, dlq) == ["poison"]
    assert drain(url, qname) == []


def test_rejected_without_alternate_exchange_is_dropped(shared_broker: BrokerProcess, qname: str) -> None:
    url = shared_broker.url
    send(url, qname, ["bad"])
    c = connect(url)
    r = c.create_receiver(qname, credit=1)
    r.receive(5)
    r.reject()
    c.close()
    assert drain(url, qname) == []


def test_unsettled_messages_return_redelivered_when_consumer_vanishes(brokers, qname: str) -> None:  # type: ignore[no-untyped-def]
    b = brokers("--auto-create-queues")
    send(b.url, qname, ["m1", "m2", "m3"])
    c = connect(b.url)
    r = c.create_receiver(qname, credit=2)
    assert r.receive(5).body == "m1"
    assert r.receive(5).body == "m2"
    c.close()  # never settled
    c2 = connect(b.url)
    r2 = c2.create_receiver(qname, credit=3)
    got = [r2.receive(5) for _ in range(3)]
    r2.accept()
    c2.close()
    assert [m.body for m in got] == ["m1", "m2", "m3"]
    assert [m.delivery_count > 0 for m in got] == [True, True, False]
    closed = [e for e in b.events() if e["event"] == "connection.closed" and e["unsettled_returned"]]
    assert closed and closed[0]["unsettled_returned"] == 2


def test_browse_copies_consume_moves(shared_broker: BrokerProcess, qname: str) -> None:
    url = shared_broker.url
    send(url, qname, [1, 2, 3])
    assert drain(url, qname, browse=True) == [1, 2, 3]
    assert drain(url, qname, browse=True) == [1, 2, 3]
    # A browser does not see messages acquired by a consumer.
    c = connect(url)
    r = c.create_receiver(qname, credit=1)
    assert r.receive(5).body == 1
    assert drain(url, qname, browse=True) == [2, 3]
    r.accept()
    c.close()
    assert receive(url, qname, 2) == [2, 3]


def test_competing_consumers_share_messages(shared_broker: BrokerProcess, qname: str) -> None:
    url = shared_broker.url
    c = connect(url)
    r1 = c.create_receiver(qname, credit=10)
    r2 = c.create_receiver(qname, credit=10, name="second")
    send(url, qname, list(range(10)))
    got1, got2 = [], []
    for _ in range(5):
        got1.append(r1.receive(5).body)
        got2.append(r2.receive(5).body)
    r1.accept()
    r2.accept()
    c.close()
    assert sorted(got1 + got2) == list(range(10))
    assert got1 and got2


def test_topic_and_fanout_routing(shared_broker: BrokerProcess, qname: str) -> None:
    url = shared_broker.url
    with mgmt(url) as m:
        m.call("CREATE", "exchange", qname + "-t", {"exchange-type": "topic"})
        m.call("CREATE", "exchange", qname + "-f", {"exchange-type": "fanout"})
        m.call("CREATE", "exchange", qname + "-d", {"exchange-type": "direct"})
        for q in ("stars", "hashes", "fan1", "fan2", "direct"):
            m.call("CREATE", "queue", f"{qname}-{q}", {})
        m.call("CREATE", "binding", None, {"source": qname + "-t", "destination": qname + "-stars",
                                           "binding-key": "usa.*"})
        m.call("CREATE", "binding", None, {"source": qname + "-t", "destination": qname + "-hashes",
                                           "binding-key": "#.news"})
        for q in ("fan1", "fan2"):
            m.call("CREATE", "binding", None, {"source": qname + "-f", "destination": f"{qname}-{q}"})
        m.call("CREATE", "binding", None, {"source": qname + "-d", "destination": qname + "-direct",
                                           "binding-key": "k1"})
    for subj in ("usa.news", "usa.weather", "europe.news", "usa.ny.news", "usa"):
        send(url, qname + "-t", [subj], subject=subj)
    send(url, qname + "-f", ["all"], subject="whatever")
    send(url, qname + "-d", ["yes"], subject="k1")
    send(url, qname + "-d", ["no"], subject="k2")
    assert drain(url, qname + "-stars") == ["usa.news", "usa.weather"]
    assert drain(url, qname + "-hashes") == ["usa.news", "europe.news", "usa.ny.news"]
    assert drain(url, qname + "-fan1") == ["all"]
    assert drain(url, qname + "-fan2") == ["all"]
    assert drain(url, qname + "-direct") == ["yes"]


def test_receiving_from_an_exchange_subscribes(shared_broker: BrokerProcess, qname: str) -> None:
    url = shared_broker.url
    with mgmt(url) as m:
        m.call("CREATE", "exchange", qname, {"exchange-type": "fanout"})
    c = connect(url)
    r = c.create_receiver(qname, credit=10)
    send(url, qname, ["to-subscribers"])
    assert r.receive(5).body == "to-subscribers"
    r.accept()
    c.close()


def test_max_count_reject_policy(shared_broker: BrokerProcess, qname: str) -> None:
    url = shared_broker.url
    create_queue(url, qname, **{"max-count": 3})
    send(url, qname, [1, 2, 3])
    c = connect(url)
    s = c.create_sender(qname)
    with pytest.raises(SendException) as exc:
        s.send(Message(body=4))
    assert exc.value.state == Delivery.REJECTED
    c.close()
    assert drain(url, qname) == [1, 2, 3]


def test_max_size_ring_policy_drops_oldest(shared_broker: BrokerProcess, qname: str) -> None:
    url = shared_broker.url
    create_queue(url, qname, **{"max-count": 3, "limit-policy": "ring"})
    send(url, qname, [1, 2, 3, 4, 5])
    assert drain(url, qname) == [3, 4, 5]


def test_message_ttl_and_queue_default_ttl(shared_broker: BrokerProcess, qname: str) -> None:
    url = shared_broker.url
    send(url, qname, ["short"], ttl=0.2)
    send(url, qname, ["long"], ttl=60)
    create_queue(url, qname + "-d", **{"default-ttl": 200})
    send(url, qname + "-d", ["defaulted"])
    send(url, qname + "-d", ["own-ttl"], ttl=60)
    time.sleep(0.5)
    assert drain(url, qname) == ["long"]
    assert drain(url, qname + "-d") == ["own-ttl"]


def test_priority_order(shared_broker: BrokerProcess, qname: str) -> None:
    url = shared_broker.url
    create_queue(url, qname, **{"priority-levels": 10})
    c = connect(url)
    s = c.create_sender(qname)
    for i, p in enumerate([1, 9, 4, 9, 0, 5]):
        s.send(Message(body=f"{p}-{i}", priority=p))
    c.close()
    assert drain(url, qname) == ["9-1", "9-3", "5-5", "4-2", "1-0", "0-4"]


def test_last_value_queue_replaces(shared_broker: BrokerProcess, qname: str) -> None:
    url = shared_broker.url
    create_queue(url, qname, **{"lvq-key": "symbol"})
    c = connect(url)
    s = c.create_sender(qname)
    for sym, price in [("IBM", 1), ("RHT", 2), ("IBM", 3), ("RHT", 4), ("IBM", 5)]:
        s.send(Message(body=f"{sym}={price}", properties={"symbol": sym}))
    c.close()
    assert drain(url, qname) == ["RHT=4", "IBM=5"]


def test_exclusive_queue_allows_one_consumer(shared_broker: BrokerProcess, qname: str) -> None:
    url = shared_broker.url
    create_queue(url, qname, exclusive=True)
    c = connect(url)
    c.create_receiver(qname, credit=1)
    c2 = connect(url)
    with pytest.raises(LinkDetached) as exc:
        c2.create_receiver(qname, credit=1)
    assert "resource-locked" in str(exc.value)
    c2.close()
    c.close()


def test_auto_delete_queue_goes_with_last_consumer(shared_broker: BrokerProcess, qname: str) -> None:
    url = shared_broker.url
    create_queue(url, qname, **{"auto-delete": True})
    create_queue(url, qname + "-t", **{"auto-delete": True, "auto-delete-timeout": 1})
    for q in (qname, qname + "-t"):
        c = connect(url)
        c.create_receiver(q, credit=1)
        c.close()
    time.sleep(0.3)
    with mgmt(url) as m:
        assert m.request("READ", "queue", qname).status == 404
        assert m.request("READ", "queue", qname + "-t").status == 200  # timeout not yet passed
    time.sleep(2.0)
    with mgmt(url) as m:
        assert m.request("READ", "queue", qname + "-t").status == 404


def test_dynamic_reply_queue(shared_broker: BrokerProcess) -> None:
    url = shared_broker.url
    c = connect(url)
    r = c.create_receiver(None, dynamic=True, credit=5)
    addr = r.remote_source.address
    assert addr and addr.startswith("temp.")
    s = c.create_sender(addr)
    s.send(Message(body="reply"))
    assert r.receive(5).body == "reply"
    r.accept()
    c.close()
    with mgmt(url) as m:
        time.sleep(0.2)
        assert m.request("READ", "queue", addr).status == 404  # temporary queue gone with its link


def test_dynamic_node_properties_configure_the_queue(shared_broker: BrokerProcess) -> None:
    url = shared_broker.url
    c = connect(url)
    r = c.create_receiver(None, dynamic=True, credit=5, options=DynamicNodeProperties({"max-count": 7}))
    addr = r.remote_source.address
    with mgmt(url) as m:
        assert m.call("READ", "queue", addr).body["arguments"]["max-count"] == 7
    c.close()


def test_anonymous_relay_uses_to(shared_broker: BrokerProcess, qname: str) -> None:
    url = shared_broker.url
    create_queue(url, qname)
    c = connect(url)
    s = c.create_sender(None)
    s.send(Message(body="relayed", address=qname))
    with pytest.raises(SendException) as exc:
        s.send(Message(body="lost", address=qname + "-nowhere"))
    assert exc.value.state == Delivery.REJECTED
    c.close()
    assert drain(url, qname) == ["relayed"]


def test_presettled_sender_and_receiver(shared_broker: BrokerProcess, qname: str) -> None:
    url = shared_broker.url
    c = connect(url)
    s = c.create_sender(qname, options=AtMostOnce())
    for i in range(5):
        s.send(Message(body=i))
    c.close()
    c = connect(url)
    r = c.create_receiver(qname, credit=5, options=AtMostOnce())
    assert [r.receive(5).body for _ in range(5)] == list(range(5))
    c.close()  # pre-settled: nothing comes back
    assert drain(url, qname) == []
    c = connect(url)
    s = c.create_sender(qname, options=AtLeastOnce())
    s.send(Message(body="unsettled-mode"))
    c.close()
    assert drain(url, qname) == ["unsettled-mode"]


def test_browse_with_copy_option_keeps_messages(shared_broker: BrokerProcess, qname: str) -> None:
    url = shared_broker.url
    send(url, qname, ["k"])
    c = connect(url)
    r = c.create_receiver(qname, credit=5, options=Copy())
    assert r.receive(5).body == "k"
    c.close()
    assert drain(url, qname) == ["k"]
