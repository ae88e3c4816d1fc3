"""Queue semantics under replication, with real broker processes: exclusive and auto-delete rules, ring, LVQ,
priority and TTL queues, delete + recreate while a backup is away, and bounded catch-up of a large queue."""

from __future__ import annotations

import contextlib
import functools
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from proton import Message, Timeout
from proton.utils import BlockingConnection

from tests.support.amqp import connect, drain, mgmt, send
from tests.support.bulk import fill, take
from tests.support.cluster import Cluster, browse
from tests.support.numbered import spawn
from tests.support.procs import BrokerProcess, wait_for

Make = Callable[..., Cluster]


def query_queues(b: BrokerProcess) -> dict[str, dict[str, Any]]:
    with mgmt(b.url, timeout=10) as m:
        return {r["name"]: r for r in m.call("QUERY", "queue").rows()}


def entries(b: BrokerProcess, queue: str, limit: int = 10_000) -> list[tuple[int, Any]]:
    """(position, body) of the first `limit` messages on `queue` (any broker, backups included), oldest first."""
    return browse(b.url, queue)[:limit]


def wait_same(c: Cluster, queue: str, limit: int = 10_000, timeout: float = 20.0) -> list[tuple[int, Any]]:
    """Wait until the backup (b2) holds exactly what the primary (b1) holds; return it."""
    last: list[Any] = []

    def same() -> bool:
        last[:] = [entries(c[0], queue, limit), entries(c[1], queue, limit)]
        return last[0] == last[1]

    try:
        wait_for(same, timeout, 0.1, what=f"{queue}: backup holds what the primary holds")
    except AssertionError:
        prim, back = last
        raise AssertionError(f"{queue}: primary {prim[:20]}... ({len(prim)}) != backup {back[:20]}... "
                             f"({len(back)})") from None
    result: list[tuple[int, Any]] = last[0]
    return result


def pump(conn: BlockingConnection) -> bool:
    """Let a blocking client do its I/O for a moment (send settlements, answer heartbeats); always True."""
    with contextlib.suppress(Timeout):
        conn.wait(lambda: False, timeout=0.05)
    return True


def bodies_are(c: Cluster, i: int, queue: str, want: list[Any],
               pumped: BlockingConnection | None = None) -> Callable[[], bool]:
    """A wait_for predicate: broker i holds exactly these bodies on `queue` (pumping a client meanwhile)."""

    def check() -> bool:
        if pumped is not None:
            pump(pumped)
        return c.queue_bodies(i, queue) == want

    return check


def absent(b: BrokerProcess, queue: str) -> bool:
    return queue not in query_queues(b)


def fail_over(c: Cluster) -> None:
    """kill -9 the primary (b1), promote the backup (b2)."""
    c[0].kill()
    c.promote(1)
    c.wait_state(1, "active")


def primary_then_backup(c: Cluster) -> None:
    c.start(0)
    c.promote(0)
    c.wait_state(0, "active")


# ----- exclusive and auto-delete ------------------------------------------------------------------------------------
def test_exclusive_queue_accepts_its_one_consumer_while_backups_replicate_it(cluster: Make) -> None:
    c = cluster(3)
    c.start_with_primary(0)
    with mgmt(c[0].url) as m:
        m.call("CREATE", "queue", "excl", {"exclusive": True})
    send(c[0].url, "excl", ["a", "b", "c"])
    for i in (1, 2):
        wait_for(bodies_are(c, i, "excl", ["a", "b", "c"]), 15, what=f"b{i + 1} replicates excl")
    assert query_queues(c[0])["excl"]["consumers"] == 0  # two replicating browsers, no consumer
    conn = connect(c[0].url)
    try:
        r = conn.create_receiver("excl", credit=1)  # the one consumer is accepted
        assert r.receive(10).body == "a"
        r.accept()
        assert r.receive(10).body == "b"  # (fetching it sends the accept of "a"); "b" stays acquired
        assert query_queues(c[0])["excl"]["consumers"] == 1
        other = connect(c[0].url)
        try:
            with pytest.raises(Exception) as exc:
                other.create_receiver("excl")
            cond = exc.value.link.remote_condition  # type: ignore[attr-defined]
            assert cond is not None and cond.name == "amqp:resource-locked"
        finally:
            other.close()
        for i in (1, 2):  # replication carries on under the exclusive consumer
            wait_for(bodies_are(c, i, "excl", ["b", "c"], conn), 15, what=f"b{i + 1} sees the dequeue")
        assert query_queues(c[0])["excl"]["consumers"] == 1  # the consumer is still there
    finally:
        conn.close()


def test_auto_delete_queue_is_not_kept_alive_by_replication(cluster: Make) -> None:
    c = cluster(3)
    c.start_with_primary(0)
    with mgmt(c[0].url) as m:
        m.call("CREATE", "queue", "ad", {"auto-delete": True})
    send(c[0].url, "ad", ["x", "y"])
    for i in (1, 2):
        wait_for(bodies_are(c, i, "ad", ["x", "y"]), 15, what=f"b{i + 1} replicates ad")
    conn = connect(c[0].url)
    r = conn.create_receiver("ad", credit=1)
    assert r.receive(10).body == "x"
    r.accept()
    conn.close()  # its only consumer leaves: the queue goes, replicating browsers notwithstanding
    for i in (0, 1, 2):
        wait_for(functools.partial(absent, c[i], "ad"), 15, what=f"ad deleted on b{i + 1}")


# ----- ring, LVQ, priority, TTL ---------------------------------------------------------------------------------
def send_messages(url: str, queue: str, msgs: list[Message]) -> None:
    conn = connect(url)
    try:
        s = conn.create_sender(queue)
        for m in msgs:
            s.send(m)
    finally:
        conn.close()


def replicate_then_fail_over(c: Cluster, queue: str, args: dict[str, Any], before: list[Message],
                             after: list[Message]) -> list[tuple[int, Any]]:
    """`before` goes to the primary before the backup joins (catch-up), `after` once it is ready (live). Returns
    what both hold, then fails over to the backup."""
    primary_then_backup(c)
    with mgmt(c[0].url) as m:
        m.call("CREATE", "queue", queue, {"arguments": args})
    send_messages(c[0].url, queue, before)
    c.start(1)
    c.wait_state(1, "ready")
    send_messages(c[0].url, queue, after)
    held = wait_same(c, queue)
    fail_over(c)
    assert entries(c[1], queue) == held  # promotion keeps positions and bodies
    return held


def test_ring_queue_keeps_the_newest_n_on_the_backup_and_after_failover(cluster: Make) -> None:
    c = cluster(2)
    held = replicate_then_fail_over(c, "ring", {"max-count": 5, "limit-policy": "ring"},
                                    [Message(body=i) for i in range(1, 13)], [Message(body=i) for i in range(13, 21)])
    assert held == [(p, p) for p in range(16, 21)]
    send(c[1].url, "ring", [21])  # the new primary still enforces the ring
    assert drain(c[1].url, "ring") == [17, 18, 19, 20, 21]


def test_lvq_keeps_the_last_value_per_key_on_the_backup_and_after_failover(cluster: Make) -> None:
    c = cluster(2)

    def kv(k: str, v: str) -> Message:
        return Message(body=f"{k}={v}", properties={"key": k})

    held = replicate_then_fail_over(c, "lvq", {"lvq-key": "key"},
                                    [kv("a", "1"), kv("b", "1"), kv("c", "1"), kv("a", "2")],
                                    [kv("b", "2"), kv("d", "1"), kv("a", "3")])
    assert [b for _, b in held] == ["c=1", "b=2", "d=1", "a=3"]
    send_messages(c[1].url, "lvq", [kv("c", "2")])  # the new primary still replaces by key
    assert drain(c[1].url, "lvq") == ["b=2", "d=1", "a=3", "c=2"]


def test_priority_order_is_preserved_on_the_backup_and_after_failover(cluster: Make) -> None:
    c = cluster(2)
    prios = [1, 9, 5, 0, 9, 5, 3, 7]
    msgs = [Message(body=f"p{p}-{i}", priority=p) for i, p in enumerate(prios)]
    held = replicate_then_fail_over(c, "prio", {"priority-levels": 10}, msgs[:4], msgs[4:])
    assert [b for _, b in held] == [m.body for m in msgs]  # position order on both
    by_priority = [m.body for m in sorted(msgs, key=lambda m: -m.priority)]  # stable: FIFO within a priority
    assert drain(c[1].url, "prio") == by_priority


def test_expired_messages_are_gone_on_primary_and_backup(cluster: Make) -> None:
    c = cluster(2)
    primary_then_backup(c)
    with mgmt(c[0].url) as m:
        m.call("CREATE", "queue", "ttl", {"arguments": {"default-ttl": 2000}})
        m.call("CREATE", "queue", "mixed", {})
    lasting = [Message(body=f"keep-{i}", ttl=600.0) for i in range(3)]
    send_messages(c[0].url, "ttl", [Message(body="queue-ttl-1"), *lasting[:1]])
    send_messages(c[0].url, "mixed", [Message(body="short-1", ttl=2.0), Message(body="long-1")])
    c.start(1)
    c.wait_state(1, "ready")
    send_messages(c[0].url, "ttl", [Message(body="queue-ttl-2"), *lasting[1:]])
    send_messages(c[0].url, "mixed", [Message(body="short-2", ttl=2.0), Message(body="long-2")])
    for q, left in (("ttl", ["keep-0", "keep-1", "keep-2"]), ("mixed", ["long-1", "long-2"])):
        wait_for(bodies_are(c, 0, q, left), 20, what=f"{q} expired on primary")
        wait_same(c, q)
    fail_over(c)
    assert drain(c[1].url, "ttl") == ["keep-0", "keep-1", "keep-2"]
    assert drain(c[1].url, "mixed") == ["long-1", "long-2"]


# ----- delete + recreate while away ---------------------------------------------------------------------------------
@pytest.mark.parametrize("away", ["sigstop", "restart"])
def test_queue_deleted_and_recreated_while_backup_is_away_is_detected_by_uuid(cluster: Make, away: str) -> None:
    """The backup is frozen past 2 heartbeats, or killed and restarted with the same name and data dir."""
    c = cluster(2, heartbeat=1.0)
    c.start_with_primary(0)
    with mgmt(c[0].url) as m:
        m.call("CREATE", "queue", "dr", {"durable": True})
    send(c[0].url, "dr", [f"old-{i}" for i in range(5)], durable=True)
    wait_for(lambda: c.queue_bodies(1, "dr") == [f"old-{i}" for i in range(5)], 15, what="old messages replicated")
    old_uuid = query_queues(c[1])["dr"]["uuid"]
    if away == "sigstop":
        c[1].signal(signal.SIGSTOP)
    else:
        c[1].kill()
    try:
        wait_for(lambda: any(e["event"] == "ha.backup.lost" for e in c[0].events()), 15, what="backup dropped")
        with mgmt(c[0].url) as m:
            m.call("DELETE", "queue", "dr")
            m.call("CREATE", "queue", "dr", {"durable": True})
        send(c[0].url, "dr", ["new-0", "new-1"], durable=True)  # positions 1 and 2 again, other messages
    finally:
        if away == "sigstop":
            c[1].signal(signal.SIGCONT)
        else:
            c.start(1)
    new_uuid = query_queues(c[0])["dr"]["uuid"]
    assert new_uuid != old_uuid
    wait_for(lambda: c.queue_bodies(1, "dr") == ["new-0", "new-1"], 20, what="backup holds the new queue only")
    assert query_queues(c[1])["dr"]["uuid"] == new_uuid
    assert c.queue_entries(1, "dr") == [(1, "new-0"), (2, "new-1")]
    wait_for(lambda: [m["state"] for m in Cluster.status(c[0])["members"]] == ["active", "ready"], 20,
             what="backup ready again")


# ----- bounded catch-up ---------------------------------------------------------------------------------------------
def lines(path: Path) -> int:
    return len(path.read_text().split()) if path.exists() else 0


BROWSABLE = 20_000


def test_catchup_of_100k_messages_under_traffic_finishes_in_bounded_time(cluster: Make) -> None:
    n = 100_000
    c = cluster(2)
    primary_then_backup(c)
    with mgmt(c[0].url) as m:
        m.call("CREATE", "queue", "big", {})
    t0 = time.monotonic()
    fill(c[0].url, "big", n, start=1_000_001)
    print(f"\nfilled {n} messages in {time.monotonic() - t0:.1f}s")
    work = c[0].workdir
    acked, received = work / "acked.txt", work / "received.txt"
    producer = spawn("send", [c[0].url], "big", acked, "--count", "1000000", "--pause", "0.002")
    # The consumer is paced (at most ~1,000 msg/s) so that the backlog the backup catches up stays ~100k whatever
    # the machine's speed: unpaced, a fast machine drained half of it before the backup started.
    consumer = spawn("receive", [c[0].url], "big", received, "--idle", "60", "--pause", "0.001")
    try:
        wait_for(lambda: lines(acked) > 50 and lines(received) > 50, 30, what="traffic to flow")
        s0, r0, t0 = lines(acked), lines(received), time.monotonic()
        wait_for(lambda: time.monotonic() - t0 > 3, 10, 0.5, what="a measure of traffic without a backup")
        s1, r1, t1 = lines(acked), lines(received), time.monotonic()
        c.start(1)
        c.wait_state(1, "ready", timeout=120)
        took = time.monotonic() - t1
        s2, r2 = lines(acked), lines(received)
        print(f"catch-up of {n} messages under traffic: backup ready after {took:.1f}s; producer/consumer "
              f"msg/s before {(s1 - s0) / (t1 - t0):.0f}/{(r1 - r0) / (t1 - t0):.0f}, "
              f"during {(s2 - s1) / took:.0f}/{(r2 - r1) / took:.0f}")
        assert producer.poll() is None and consumer.poll() is None  # traffic ran throughout
    finally:
        producer.terminate()
        consumer.terminate()
        producer.wait(10)
        consumer.wait(10)
    # Compare everything: BROWSE answers at most ~30k entries (one AMQP value per entry, proton's limit), so
    # first consume the bulk of the queue on the primary, which also replicates a long run of dequeues.
    depth = query_queues(c[0])["big"]["depth"]
    assert depth > n // 2
    take(c[0].url, "big", depth - BROWSABLE)
    held = wait_same(c, "big", limit=BROWSABLE + 1, timeout=60)
    assert len(held) == BROWSABLE
    assert held[0][1] >= 1_000_001 and held[-1][1] < 1_000_001  # the filled messages, then the live producer's


def test_a_queue_deleted_in_the_pass_that_took_a_message_for_it_holds_nobody(cluster: Make) -> None:
    """An auto-delete queue loses its last consumer in the same read (the same pass of the primary) as a publish to
    it: the publish was held for the backups, then the queue deleted. It is settled, the backup's backlog stays
    empty, and a queue of that name declared again, and every other queue, replicate and settle as before (the
    held delivery waited for good, and the queue's next guard raised in the primary's end of pass)."""
    c = cluster(2)
    c.start_with_primary(0)
    with mgmt(c[0].url) as m:
        m.call("CREATE", "queue", "ad", {"auto-delete": True})
    conn = connect(c[0].url)
    try:
        sender = conn.create_sender("ad")
        receiver = conn.create_receiver("ad", credit=10)
        time.sleep(0.3)
        d = sender.link.send(Message(body="last"))  # one write to the socket with the detach below
        receiver.link.close()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not d.settled:
            conn.container.process()
            time.sleep(0.01)
        assert d.settled
    finally:
        conn.close()
    with mgmt(c[0].url) as m:
        m.call("CREATE", "queue", "ad", {})
        m.call("CREATE", "queue", "other", {})
    for q in ("ad", "other"):
        send(c[0].url, q, [f"{q}-1"], timeout=10)
        wait_for(lambda q=q: c.queue_bodies(1, q) == [f"{q}-1"], 10, what=f"{q} replicated")
    assert "does not grow" not in Path(c[0].log_file).read_text()
