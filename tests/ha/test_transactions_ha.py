"""Transactions across a failover (docs/transactions.md): a commit the client saw settle is on the backup, with the
messages it accepted gone; a transaction the primary took down with it leaves nothing there. Real broker processes,
SIGSTOP of the backup, SIGKILL of the primary."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Callable
from pathlib import Path

import pytest
from proton import Message, Timeout
from proton.utils import BlockingConnection

from tests.support.amqp import connect, drain, mgmt, send
from tests.support.cluster import Cluster, free_ports
from tests.support.procs import BrokerFactory, wait_for
from tests.support.releases import unpack
from tests.support.txn import Txn

Make = Callable[..., Cluster]


def _pump(conn: BlockingConnection, seconds: float) -> None:
    """Let `conn` do its I/O for `seconds` (a send that waits for nothing is written here)."""
    with contextlib.suppress(Timeout):
        conn.wait(lambda: False, timeout=seconds, msg="nothing")


def _queues(url: str, *names: str) -> None:
    with mgmt(url) as m:
        for name in names:
            m.call("CREATE", "queue", name, {"arguments": {}})


def test_a_commit_that_settled_is_whole_on_the_backup_after_sigkill_of_the_primary(cluster: Make) -> None:
    c = cluster(2)
    c.start_with_primary(0)
    _queues(c[0].url, "tx-a", "tx-b")
    conn = connect(c[0].url)
    a, b = conn.create_sender("tx-a"), conn.create_sender("tx-b")
    txn = Txn(conn)
    for i in range(200):  # two queues: the discharge waits for the backup's acknowledgement of both
        txn.send(a, Message(body=f"a{i}", durable=True))
        txn.send(b, Message(body=f"b{i}"))
    assert txn.commit() == "committed"
    c[0].kill()  # at once: nothing may reach the backup after the client saw the commit
    c.promote(1)
    c.wait_state(1, "recovering", "active")
    assert drain(c[1].url, "tx-a") == [f"a{i}" for i in range(200)]
    assert drain(c[1].url, "tx-b") == [f"b{i}" for i in range(200)]


def test_a_transaction_open_when_the_primary_dies_leaves_nothing_on_the_backup(cluster: Make) -> None:
    c = cluster(2)
    c.start_with_primary(0)
    _queues(c[0].url, "src", "dst")
    send(c[0].url, "src", ["work"])
    conn = connect(c[0].url)
    r = conn.create_receiver("src", credit=1)
    s = conn.create_sender("dst")
    txn = Txn(conn)
    assert r.receive(5).body == "work"
    txn.accept(r)
    for i in range(50):
        txn.send(s, Message(body=i))
    send(c[0].url, "src", ["marker"])  # confirmed after the backup has what came before (applied in order)
    c[0].kill()  # before the commit
    c.promote(1)
    c.wait_state(1, "recovering", "active")
    assert drain(c[1].url, "dst") == []  # none of the transaction's messages
    back = connect(c[1].url)
    got = back.create_receiver("src", credit=2)
    first, second = got.receive(5), got.receive(5)
    # the message the transaction had taken is back, marked as a possible duplicate
    assert [(first.body, first.delivery_count), second.body] == [("work", 1), "marker"]
    back.close()


def test_a_commit_that_accepted_is_settled_once_the_backup_has_the_dequeue_and_never_delivers_it_again(
        cluster: Make) -> None:
    c = cluster(2, heartbeat=4.0)  # the stopped backup is not dropped while the test watches
    c.start_with_primary(0)
    _queues(c[0].url, "txq")
    send(c[0].url, "txq", list(range(6)), durable=True)
    conn = connect(c[0].url)
    r = conn.create_receiver("txq", credit=1)
    txn = Txn(conn)
    for i in range(2):
        assert r.receive(5).body == i
        txn.accept(r)
    c[1].signal(signal.SIGSTOP)
    try:
        txn.start_commit()  # accepts only: nothing to enqueue, the discharge waits for the dequeues alone
        assert txn.answered(1.5) is None, "the commit settled while the backup could not have its dequeues"
    finally:
        c[1].signal(signal.SIGCONT)
    assert txn.answered(10.0) == "committed"
    again = Txn(conn)
    for i in range(2, 4):
        assert r.receive(5).body == i
        again.accept(r)
    assert again.commit() == "committed"
    c[0].kill()  # at once: what the client saw committed is dequeued on the backup
    c.promote(1)
    c.wait_state(1, "recovering", "active")
    assert drain(c[1].url, "txq") == [4, 5]


def test_a_transaction_the_primary_died_sending_is_applied_none_on_the_backup(cluster: Make) -> None:
    """A commit over two queues whose part for one queue reached the backup and for the other did not (its browser
    had no credit: the backup was stopped) leaves nothing of it there: the backup applies a transaction all or
    none (batch format version 3)."""
    c = cluster(2, "--ha-flow-messages", "4", heartbeat=4.0)  # credit for 4 batches per queue
    c.start_with_primary(0)
    _queues(c[0].url, "ua", "ub")
    wait_for(lambda: {e["queue"] for e in c[0].events() if e["event"] == "ha.catchup.end"} >= {"ua", "ub"},
             what="the backup to replicate both queues")
    c[1].signal(signal.SIGSTOP)
    try:
        plain = connect(c[0].url)
        link = plain.create_sender("ub").link
        for i in range(8):  # one batch per pass: ub's browser spends its credit (the sends stay unsettled)
            link.delivery(f"plain{i}")
            link.send(Message(body=f"plain{i}").encode())
            link.advance()
            _pump(plain, 0.1)
        conn = connect(c[0].url)
        a, b = conn.create_sender("ua"), conn.create_sender("ub")
        txn = Txn(conn)
        txn.send(a, Message(body="ta"))
        txn.send(b, Message(body="tb"))
        txn.start_commit()
        assert txn.answered(1.0) is None
        c[0].kill()  # ua's part is on its way, ub's was never sent
    finally:
        c[1].signal(signal.SIGCONT)
    c.promote(1)
    c.wait_state(1, "recovering", "active")
    assert drain(c[1].url, "ua") == []
    got = drain(c[1].url, "ub")  # what ub's browser sent before its credit ran out, without the transaction's
    assert "tb" not in got and got[:4] == [f"plain{i}" for i in range(4)], got
    discarded = [e for e in c[1].events() if e["event"] == "ha.transaction.discarded"]
    assert [(e["count"], e["batches"] >= 1) for e in discarded] == [(1, True)]


BATCH_V2_RELEASE = "98ad577"  # the last commit before batch format version 3 (transaction units)


@pytest.fixture(scope="module")
def batch_v2_release(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return unpack(BATCH_V2_RELEASE, tmp_path_factory, "batch-v2-release")


def test_a_backup_of_the_release_before_transaction_units_gets_a_settled_commit_whole(
        brokers: BrokerFactory, batch_v2_release: Path) -> None:
    """During a rolling upgrade a backup that reads batches up to version 2 gets a commit's records queue by queue
    (docs/transactions.md): a commit the client saw settle is still all there after a failover to it."""
    assert "VERSION_MAX = 2" in (batch_v2_release / "ha" / "core" / "batch.py").read_text()  # no units there
    ports = free_ports(2)
    url = ",".join(f"127.0.0.1:{p}" for p in ports)
    args = ["--ha-cluster", "--ha-brokers-url", url, "--ha-heartbeat", "1", "--ha-backup-timeout", "5"]
    primary = brokers(*args, name="b1", port=ports[0], start=False)
    backup = brokers(*args, name="b2", port=ports[1], start=False, source=batch_v2_release)
    c = Cluster.of([primary, backup])
    primary.start()
    c.promote(0)
    c.wait_state(0, "active")
    _queues(primary.url, "tx-a", "tx-b")
    backup.start()
    c.wait_state(1, "ready")
    conn = connect(primary.url)
    a, b = conn.create_sender("tx-a"), conn.create_sender("tx-b")
    txn = Txn(conn)
    for i in range(50):
        txn.send(a, Message(body=f"a{i}"))
        txn.send(b, Message(body=f"b{i}"))
    assert txn.commit() == "committed"
    primary.kill()
    c.promote(1, "--force")  # the older release's promote (its state is ready: --force changes nothing there)
    c.wait_state(1, "active")
    assert drain(backup.url, "tx-a") == [f"a{i}" for i in range(50)]
    assert drain(backup.url, "tx-b") == [f"b{i}" for i in range(50)]
