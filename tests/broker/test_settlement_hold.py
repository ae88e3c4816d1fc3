"""The settlement hold hook: a registered holder keeps client deliveries unsettled until it releases them.

The holder is a real plugin loaded by the broker process (`--plugin tests.support.holder_plugin:install`).
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from proton import Delivery, Message
from proton.reactor import AtMostOnce
from proton.utils import BlockingConnection

from tests.broker.helpers import stored
from tests.support.amqp import connect, mgmt
from tests.support.holder_plugin import TYPE
from tests.support.procs import ROOT, BrokerFactory, BrokerProcess
from tests.support.txn import Txn

N = 25


@pytest.fixture
def holding(brokers: BrokerFactory, monkeypatch: pytest.MonkeyPatch) -> BrokerProcess:
    monkeypatch.setenv("PYTHONPATH", str(ROOT))  # the broker process imports tests.support.holder_plugin
    return brokers("--auto-create-queues", "--plugin", "tests.support.holder_plugin:install")


def round_trip(c: BlockingConnection) -> None:
    """Attach and detach a link on `c`: frames are ordered, so when the broker's answer is back every transfer
    written before has been processed by the broker, and every settlement it sent before has arrived here."""
    c.create_receiver("$events", credit=0, name=f"round-trip-{time.monotonic_ns()}").close()


def held(url: str) -> dict[str, int]:
    with mgmt(url) as m:
        body = dict(m.call("READ", TYPE).body)
    body.pop("order")
    return body


def held_order(url: str) -> list[int]:
    """The positions the holder held, in the order it was asked."""
    with mgmt(url) as m:
        return list(m.call("READ", TYPE).body["order"])


def send_unwaited(link: Any, bodies: list[str]) -> list[Delivery]:
    """Transfers written with the connection's next write (nothing waits for them here)."""
    deliveries = []
    for b in bodies:
        d = link.delivery(f"{b}-{time.monotonic_ns()}")
        link.send(bytes(Message(body=b).encode()))
        link.advance()
        deliveries.append(d)
    return deliveries


def test_deliveries_stay_unsettled_until_the_holder_releases_them(holding: BrokerProcess) -> None:
    url = holding.url
    c = connect(url)
    try:
        link = c.create_sender("held").link
        deliveries = send_unwaited(link, [f"m{i}" for i in range(N)])
        round_trip(c)
        assert link.queued == 0
        # Enqueued meanwhile, and held.
        with mgmt(url) as m:
            wait_depth = m.call("READ", "queue", "held").body
        assert wait_depth["depth"] == N
        assert held(url) == {"held": N, "released": 0}
        round_trip(c)
        assert [d.remote_state for d in deliveries] == [0] * N
        assert not any(d.settled for d in deliveries)
        with mgmt(url) as m:
            r = m.request("RELEASE", TYPE)
        assert (r.status, r.body) == (200, {"released": N})
        c.wait(lambda: all(d.settled for d in deliveries), timeout=10, msg="settlement after release")
        assert {d.remote_state for d in deliveries} == {Delivery.ACCEPTED}
    finally:
        c.close()
    assert held(url) == {"held": 0, "released": N}
    assert stored(url, "held") == [f"m{i}" for i in range(N)]


def test_release_needs_no_admin_without_users_but_is_a_write(holding: BrokerProcess) -> None:
    """The extension is reachable through the ordinary management node and is answered like any operation."""
    with mgmt(holding.url) as m:
        assert m.request("RELEASE", TYPE).status == 200
        assert m.request("FROB", TYPE).status == 400


def test_presettled_sends_are_not_held(holding: BrokerProcess) -> None:
    url = holding.url
    c = connect(url)
    try:
        s = c.create_sender("unheld", options=AtMostOnce())
        for i in range(3):
            s.send(Message(body=i))
        round_trip(c)
    finally:
        c.close()
    assert stored(url, "unheld") == [0, 1, 2]
    assert held(url)["held"] == 0


def test_credit_is_bounded_while_deliveries_are_held(brokers: BrokerFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """A holder that never lets go becomes backpressure: the publisher gets no more credit than the window."""
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    b = brokers("--auto-create-queues", "--credit-window", "10", "--plugin", "tests.support.holder_plugin:install")
    c = connect(b.url)
    try:
        link = c.create_sender("bounded").link
        for i in range(15):
            link.delivery(f"d{i}")
            link.send(bytes(Message(body=i).encode()))
            link.advance()
        round_trip(c)
        assert link.queued == 5  # ten sent, five waiting for credit
        assert held(b.url)["held"] == 10
        with mgmt(b.url) as m:
            m.call("RELEASE", TYPE)
        c.wait(lambda: link.queued == 0, timeout=10, msg="credit after the release")
        with mgmt(b.url) as m:
            m.call("RELEASE", TYPE)
    finally:
        c.close()
    assert stored(b.url, "bounded") == list(range(15))


def test_a_holder_may_hold_part_of_a_pass(brokers: BrokerFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """An extension that holds only some deliveries of a pass's group (`Extension.hold_group`): the rest are settled
    at once, the held ones only when it lets go, and every message is on the queue either way."""
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    b = brokers("--auto-create-queues", "--plugin", "tests.support.holder_plugin:install_even")
    c = connect(b.url)
    try:
        link = c.create_sender("part").link
        deliveries = send_unwaited(link, [f"m{i}" for i in range(1, 11)])  # positions 1..10, one write
        c.wait(lambda: all(d.settled for d in deliveries[0::2]), timeout=10, msg="the odd positions settled")
        round_trip(c)
        assert [d.settled for d in deliveries] == [True, False] * 5
        assert held_order(b.url) == [2, 4, 6, 8, 10]
        with mgmt(b.url) as m:
            assert m.call("RELEASE", TYPE).body == {"released": 5}
        c.wait(lambda: all(d.settled for d in deliveries), timeout=10, msg="the even positions after the release")
        assert {d.remote_state for d in deliveries} == {Delivery.ACCEPTED}
    finally:
        c.close()
    assert stored(b.url, "part") == [f"m{i}" for i in range(1, 11)]


def test_holds_follow_positions_when_a_commit_shares_a_pass_with_plain_transfers(holding: BrokerProcess) -> None:
    """Plain transfers to a queue are shown to the extensions as the pass's group at its end; a transaction
    committed in the same pass, after them, enqueues behind them: its hold must come after theirs (a primary's
    guards take each queue's positions in ascending order)."""
    url = holding.url
    c = connect(url)
    try:
        sender = c.create_sender("mixed-pass")
        txn = Txn(c)
        txn.send(sender, Message(body="in-txn"))
        plain = send_unwaited(sender.link, [f"plain-{i}" for i in range(20)])
        txn.start_commit()
        round_trip(c)  # one write: the plain transfers, then the discharge; all processed once this is back
        with mgmt(url) as m:
            m.call("RELEASE", TYPE)  # the holder holds the discharge's answer too
        assert txn.answered(10) == "committed"
        c.wait(lambda: all(d.settled for d in plain), timeout=10, msg="the plain transfers settled")
    finally:
        c.close()
    order = held_order(url)
    assert sorted(order) == list(range(1, 22))
    assert order == sorted(order)
    assert stored(url, "mixed-pass") == [f"plain-{i}" for i in range(20)] + ["in-txn"]
