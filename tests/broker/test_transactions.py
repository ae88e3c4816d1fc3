"""Local transactions (docs/transactions.md) with proton's transactional client against a real broker."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from proton import Delivery, Message

from tests.support.amqp import connect, drain, mgmt, receive, send
from tests.support.procs import BrokerProcess, wait_for
from tests.support.txn import Txn

ROOT = Path(__file__).resolve().parents[2]


def test_committed_messages_appear_only_at_commit_in_the_order_sent(shared_broker: BrokerProcess,
                                                                     qname: str) -> None:
    url = shared_broker.url
    c = connect(url)
    s = c.create_sender(qname)
    s.send(Message(body="before"))
    txn = Txn(c)
    for i in range(5):
        d = txn.send(s, Message(body=f"t{i}"))
        assert d.remote_state == 0x34  # transactional-state(txn-id, accepted)
        assert d.remote.data[1].descriptor == 0x24
    assert drain(url, qname) == ["before"]  # held in the transaction: invisible
    assert txn.commit() == "committed"
    c.close()
    assert receive(url, qname, 5) == [f"t{i}" for i in range(5)]
    assert drain(url, qname) == []


def test_rolled_back_messages_are_never_delivered(shared_broker: BrokerProcess, qname: str) -> None:
    url = shared_broker.url
    c = connect(url)
    s = c.create_sender(qname)
    txn = Txn(c)
    for i in range(3):
        txn.send(s, Message(body=i))
    assert txn.abort() == "aborted"
    again = Txn(c)  # a second transaction on the same coordinator
    again.send(s, Message(body="kept"))
    assert again.commit() == "committed"
    c.close()
    assert drain(url, qname) == ["kept"]


def test_a_transactional_accept_rolled_back_is_redelivered_with_its_delivery_count(shared_broker: BrokerProcess,
                                                                                   qname: str) -> None:
    url = shared_broker.url
    send(url, qname, ["a", "b"])
    c = connect(url)
    r = c.create_receiver(qname, credit=2)
    txn = Txn(c)
    for body in ("a", "b"):
        assert r.receive(5).body == body
        txn.accept(r)
    assert txn.abort() == "aborted"
    for body in ("a", "b"):  # released as a failed delivery: back in order, to the consumer that still has credit
        m = r.receive(5)
        assert (m.body, m.delivery_count, m.first_acquirer) == (body, 1, False)
        r.accept()
    c.close()
    assert drain(url, qname) == []


def test_a_transactional_accept_committed_dequeues_for_good(shared_broker: BrokerProcess, qname: str) -> None:
    url = shared_broker.url
    send(url, qname, ["a", "b", "c"])
    c = connect(url)
    r = c.create_receiver(qname, credit=2)
    out = c.create_sender(qname + "-out")
    txn = Txn(c)
    for _ in range(2):  # consume and produce in one transaction
        m = r.receive(5)
        txn.accept(r)
        txn.send(out, Message(body=m.body.upper()))
    assert txn.commit() == "committed"
    c.close()  # nothing is unsettled any more: nothing comes back
    assert drain(url, qname) == ["c"]
    assert drain(url, qname + "-out") == ["A", "B"]


def test_an_unknown_txn_id_is_refused_with_unknown_id(shared_broker: BrokerProcess, qname: str) -> None:
    c = connect(shared_broker.url)
    s = c.create_sender(qname)
    txn = Txn(c)
    real = txn.events.txn.id
    txn.events.txn.id = b"no-such-txn"
    d = txn.send(s, Message(body="x"))
    assert d.remote_state == Delivery.REJECTED
    assert d.remote.condition.name == "amqp:transaction:unknown-id"
    assert txn.commit() == "failed"
    assert txn.condition.name == "amqp:transaction:unknown-id"
    txn.events.txn.id = real  # the real one is still open
    txn.events.result = None
    assert txn.abort() == "aborted"
    c.close()
    assert drain(shared_broker.url, qname) == []


_HOLDER = """
import sys, time
from proton import Message
from tests.support.amqp import connect
from tests.support.txn import Txn
c = connect(sys.argv[1])
r = c.create_receiver("in", credit=1)
s = c.create_sender("out")
txn = Txn(c)
assert r.receive(5).body == "a"
txn.accept(r)
txn.send(s, Message(body="never"))
print("ready", flush=True)
time.sleep(60)
"""


def test_a_connection_that_drops_with_an_open_transaction_rolls_it_back(broker: BrokerProcess) -> None:
    url = broker.url
    with mgmt(url) as m:
        for q in ("in", "out"):
            m.call("CREATE", "queue", q, {"arguments": {}})
    send(url, "in", ["a"])
    # A client that took "a" and sent "never" under a transaction, then dies (SIGKILL: no close, no discharge).
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, url], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
    finally:
        holder.kill()
        holder.wait(10)
    wait_for(lambda: any(e.get("event") == "transaction.rolled_back" for e in broker.events()),
             what="transaction.rolled_back")
    rolled = [e for e in broker.events() if e.get("event") == "transaction.rolled_back"]
    assert [(e["reason"], e["messages"], e["count"]) for e in rolled] == [("detached", 1, 1)]
    assert drain(url, "out") == []
    c = connect(url)
    m = c.create_receiver("in", credit=1).receive(5)
    assert (m.body, m.delivery_count) == ("a", 1)
    c.close()


def test_a_commit_that_does_not_fit_is_refused_whole_and_rolled_back(broker: BrokerProcess) -> None:
    url = broker.url
    with mgmt(url) as m:
        m.call("CREATE", "queue", "small", {"arguments": {"max-count": 2}})
    send(url, "small", ["old"])
    c = connect(url)
    s = c.create_sender("small")
    txn = Txn(c)
    txn.send(s, Message(body="t1"))
    txn.send(s, Message(body="t2"))  # each fits alone; together they do not
    assert txn.commit() == "failed"
    assert txn.condition.name == "amqp:transaction:rollback"
    assert "no room" in txn.condition.description
    c.close()
    assert drain(url, "small") == ["old"]
    failed = [e for e in broker.events() if e.get("event") == "transaction.commit_failed"]
    assert len(failed) == 1 and failed[0]["condition"] == "amqp:resource-limit-exceeded"


def test_a_transactional_transfer_to_nowhere_is_rejected_at_once(broker: BrokerProcess) -> None:
    c = connect(broker.url)
    s = c.create_sender(None)  # anonymous relay: the address is each message's `to`
    txn = Txn(c)
    d = txn.send(s, Message(body="x", address="no-such-queue"))
    assert d.remote_state == Delivery.REJECTED
    assert d.remote.condition.name == "amqp:not-found"
    assert txn.commit() == "committed"  # an empty transaction commits
    c.close()


def test_committed_durable_messages_survive_a_kill(brokers: object) -> None:
    b: BrokerProcess = brokers("--auto-create-queues")  # type: ignore[operator]
    with mgmt(b.url) as m:
        m.call("CREATE", "queue", "d", {"arguments": {"durable": True}})
    c = connect(b.url)
    s = c.create_sender("d")
    txn = Txn(c)
    for i in range(3):
        txn.send(s, Message(body=i, durable=True))
    assert txn.commit() == "committed"  # settled once journaled
    b.kill()
    b.start()
    assert drain(b.url, "d") == [0, 1, 2]


def test_a_commit_with_a_last_value_key_that_is_not_a_simple_value_is_refused_whole(broker: BrokerProcess) -> None:
    """A list as the key of a last-value queue failed in the middle of the commit (TypeError: the transaction's
    earlier messages were in, the link closed with internal-error). Now the commit is refused before anything."""
    url = broker.url
    with mgmt(url) as m:
        m.call("CREATE", "queue", "last", {"arguments": {"lvq-key": "k"}})
    c = connect(url)
    s = c.create_sender("last")
    txn = Txn(c)
    txn.send(s, Message(body="fine", properties={"k": "a"}))
    txn.send(s, Message(body="listed", properties={"k": [1, 2]}))
    assert txn.commit() == "failed"
    assert txn.condition.name == "amqp:transaction:rollback"
    assert "application property 'k' must be a simple value" in txn.condition.description
    s.send(Message(body="after", properties={"k": "a"}))  # the link still serves
    c.close()
    assert drain(url, "last") == ["after"]
    assert [e for e in broker.events() if e.get("level") == "error"] == []
