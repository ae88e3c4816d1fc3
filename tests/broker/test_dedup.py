"""Duplicate detection (`duplicate-window` queue argument): a resend with a message-id the queue took recently is
accepted and dropped; real broker processes and proton clients."""

from __future__ import annotations

import uuid

from proton import Message

from tests.support.amqp import connect, drain, mgmt, send
from tests.support.procs import BrokerFactory, BrokerProcess, wait_for


def _create(url: str, name: str, **args: object) -> None:
    with mgmt(url) as m:
        m.call("CREATE", "queue", name, {"arguments": {k.replace("_", "-"): v for k, v in args.items()}})


def _send_ids(url: str, address: str, ids: list[object]) -> None:
    """Each message's body is its id; every send must be accepted (a duplicate is accepted too)."""
    c = connect(url)
    try:
        s = c.create_sender(address)
        for i in ids:
            s.send(Message(id=i, body=str(i)))  # BlockingSender.send raises unless the outcome is accepted
    finally:
        c.close()


def _stat(url: str, queue: str, field: str) -> object:
    with mgmt(url) as m:
        return m.call("READ", "queue", queue).body[field]


def test_a_resend_with_the_same_id_is_accepted_and_dropped_and_other_ids_are_kept(broker: BrokerProcess) -> None:
    url = broker.url
    _create(url, "orders", duplicate_window=100)
    u = uuid.UUID(int=7)
    _send_ids(url, "orders", ["a", "b", 7, u, b"bin"])
    _send_ids(url, "orders", ["a", 7, "b", u, b"bin", "7", "c"])  # "7" (a string) is not the ulong 7
    assert drain(url, "orders") == ["a", "b", "7", str(u), "b'bin'", "7", "c"]
    assert _stat(url, "orders", "duplicates") == 5
    assert _stat(url, "orders", "enqueued") == 7


def test_messages_without_an_id_and_queues_without_a_window_are_never_checked(broker: BrokerProcess) -> None:
    url = broker.url
    _create(url, "win", duplicate_window=10)
    _create(url, "plain")
    send(url, "win", ["x", "x", "x"])  # no message-id
    _send_ids(url, "plain", ["p", "p"])
    assert drain(url, "win") == ["x", "x", "x"]
    assert drain(url, "plain") == ["p", "p"]


def test_the_count_bound_evicts_the_oldest_id_first(broker: BrokerProcess) -> None:
    url = broker.url
    _create(url, "small", duplicate_window=3)
    _send_ids(url, "small", ["1", "2", "3", "4"])  # the window holds 2, 3, 4: "1" was evicted
    _send_ids(url, "small", ["4", "3", "2"])  # dropped (and a dropped resend does not refresh the window)
    _send_ids(url, "small", ["1"])  # new again: taken, and "2" is evicted
    _send_ids(url, "small", ["2"])
    assert drain(url, "small") == ["1", "2", "3", "4", "1", "2"]


def test_the_time_bound_forgets_ids(broker: BrokerProcess) -> None:
    url = broker.url
    _create(url, "timed", duplicate_window_seconds=1)
    _send_ids(url, "timed", ["t"])
    _send_ids(url, "timed", ["t"])
    assert drain(url, "timed") == ["t"]
    wait_for(lambda: _resend_taken(url), timeout=5, what="the id to leave the 1 s window")


def _resend_taken(url: str) -> bool:
    _send_ids(url, "timed", ["t"])
    return drain(url, "timed", timeout=0.2) == ["t"]


def test_an_exchange_routes_a_duplicate_only_to_the_queues_that_have_not_seen_it(broker: BrokerProcess) -> None:
    url = broker.url
    _create(url, "q1", duplicate_window=10)
    _create(url, "q2")
    with mgmt(url) as m:
        m.call("CREATE", "exchange", "fan", {"exchange-type": "fanout"})
        m.call("CREATE", "binding", body={"source": "fan", "destination": "q1"})
        m.call("CREATE", "binding", body={"source": "fan", "destination": "q2"})
    _send_ids(url, "fan", ["m1", "m1"])
    assert drain(url, "q1") == ["m1"]
    assert drain(url, "q2") == ["m1", "m1"]


def test_a_bad_window_argument_is_refused_with_the_argument_named(broker: BrokerProcess) -> None:
    with mgmt(broker.url) as m:
        r = m.request("CREATE", "queue", "bad", {"arguments": {"duplicate-window": 0}})
    assert r.status == 400
    assert "duplicate-window" in r.description


def test_the_window_survives_a_restart_with_the_journal_including_ids_already_consumed(brokers: BrokerFactory) -> None:
    b = brokers()
    _create(b.url, "durable-orders", duplicate_window=1000, durable=True)
    c = connect(b.url)
    s = c.create_sender("durable-orders")
    for i in range(20):
        s.send(Message(id=f"id-{i}", body=i, durable=True))
    c.close()
    assert drain(b.url, "durable-orders", timeout=0.3)[:10] == list(range(10))  # all 20 consumed
    b.stop()
    b.start()
    c = connect(b.url)
    s = c.create_sender("durable-orders")
    for i in range(25):  # 0..19 were taken before the restart: dropped; 20..24 are new
        s.send(Message(id=f"id-{i}", body=i, durable=True))
    c.close()
    assert drain(b.url, "durable-orders") == list(range(20, 25))
    b.kill()  # SIGKILL: recovery from the journal as written, no clean shutdown
    b.start()
    _send_ids(b.url, "durable-orders", [f"id-{i}" for i in range(26)])
    assert drain(b.url, "durable-orders") == ["id-25"]
