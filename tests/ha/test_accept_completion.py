"""A consumer's accept is answered only once the backups have the dequeue (issue 12, "asynchronous completion of
accept"): a consumer with receiver-settle-mode second that saw its accept settled never gets that message again,
whatever fails over. Real broker processes, SIGSTOP and SIGKILL.
"""

from __future__ import annotations

import contextlib
import itertools
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from proton import Delivery, Message, Timeout

from ha.core.epoch import best_candidate
from ha.local_cluster import rank_of
from tests.support.amqp import SettleSecond, connect, mgmt, send
from tests.support.cluster import Cluster
from tests.support.procs import wait_for
from tests.support.status_plugin import TYPE as STATUS_PLUGIN

Make = Callable[..., Cluster]
_names = itertools.count()


def _accept_without_settling(conn: Any, queue: str, n: int) -> list[Any]:
    """Take `n` messages and accept them in mode second: the deliveries (returned) stay open until the broker
    settles them."""
    r = conn.create_receiver(queue, credit=0, name=f"{queue}-{next(_names)}", options=SettleSecond())
    r.link.flow(n)
    conn.wait(lambda: r.fetcher.has_message >= n, timeout=10, msg=f"{n} messages")
    deliveries = []
    for _ in range(n):
        r.fetcher.pop()
        d = r.fetcher.unsettled.popleft()
        d.update(Delivery.ACCEPTED)
        deliveries.append(d)
    return deliveries


def _answered(conn: Any, deliveries: list[Any], timeout: float) -> bool:
    """Did the broker settle every accept within `timeout` seconds?"""
    try:
        conn.wait(lambda: all(d.settled for d in deliveries), timeout=timeout, msg="accepts answered")
        return True
    except Timeout:
        return False


def _bodies(url: str, queue: str) -> list[Any]:
    c = connect(url, 30)
    try:
        r = c.create_receiver(queue, credit=100)
        out: list[Any] = []
        while True:
            try:
                m = r.receive(timeout=1.0)
            except Timeout:
                return out
            out.append(m.body)
            r.accept()
    finally:
        c.close()


def _filled(c: Cluster, queue: str, n: int) -> Any:
    with mgmt(c[0].url) as m:
        m.call("CREATE", "queue", queue, {})
    conn = connect(c[0].url)
    s = conn.create_sender(queue)
    for i in range(n):
        s.send(Message(body=i, durable=True))
    return conn


def test_an_accept_is_answered_once_the_backup_has_the_dequeue_and_never_delivered_again(cluster: Make) -> None:
    c = cluster(2, heartbeat=4.0)  # the stopped backup is not dropped while the test watches
    c.start_with_primary(0)
    conn = _filled(c, "aq", 10)
    c[1].signal(signal.SIGSTOP)
    try:
        held = _accept_without_settling(conn, "aq", 4)
        assert not _answered(conn, held, 1.0), "answered while the backup could not have the dequeue"
    finally:
        c[1].signal(signal.SIGCONT)
    assert _answered(conn, held, 10.0)
    for d in held:
        d.settle()
    more = _accept_without_settling(conn, "aq", 2)
    assert _answered(conn, more, 10.0)
    c[0].kill()  # at once: whatever the consumer saw answered is dequeued on the backup
    c.promote(1)
    c.wait_state(1, "recovering", "active")
    assert _bodies(c[1].url, "aq") == [6, 7, 8, 9]


def test_an_accept_held_for_a_backup_that_dies_is_answered_when_the_backup_is_dropped(cluster: Make) -> None:
    c = cluster(2)
    c.start_with_primary(0)
    conn = _filled(c, "dies", 3)
    c[1].signal(signal.SIGSTOP)
    held = _accept_without_settling(conn, "dies", 2)
    c[1].kill()
    assert _answered(conn, held, 15.0)  # the primary stops waiting for a backup it dropped
    assert _bodies(c[0].url, "dies") == [2]


@pytest.mark.parametrize("flags", [["--ha-batch-bytes", "0"], ["--no-ha-batched-acks"]])
def test_a_backup_that_does_not_acknowledge_dequeues_does_not_hold_accepts(cluster: Make, flags: list[str]) -> None:
    """A backup of an older format (per-message transfers or per-transfer settlement) cannot say it applied a
    dequeue: accepts are answered without it (rolling upgrade: correct, not stuck)."""
    c = cluster(2, heartbeat=4.0)
    c.start(0)
    c.promote(0)
    c.wait_state(0, "active")
    c[1].args = [*c[1].args, *flags]
    c[1].start()
    c.wait_state(1, "ready")
    conn = _filled(c, "old", 3)
    c[1].signal(signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        held = _accept_without_settling(conn, "old", 2)
        assert _answered(conn, held, 3.0)
        assert time.monotonic() - t0 < 3.0
    finally:
        c[1].signal(signal.SIGCONT)


def test_an_accept_reaching_a_primary_after_it_stepped_down_is_neither_applied_nor_answered(cluster: Make) -> None:
    """Found by the 1000-fault soak: a primary cut off, demoted, then reached by a consumer's accept that was on its
    way (the link healed) dequeued the message on what was now a replica and confirmed the accept."""
    c = cluster(2)
    c.start_with_primary(0)
    conn = _filled(c, "late", 3)
    r = conn.create_receiver("late", credit=0, name="late-consumer", options=SettleSecond())
    r.link.flow(1)
    conn.wait(lambda: r.fetcher.has_message >= 1, timeout=10, msg="a message")
    assert r.fetcher.pop().body == 0
    d = r.fetcher.unsettled.popleft()
    # The primary steps down while our accept has not left yet (the client has not run its I/O since).
    assert c.admin(c[0], "demote").returncode == 0
    c.wait_state(0, "joining", "catchup", "ready")
    d.update(Delivery.ACCEPTED)  # goes out with the next I/O, together with reading the broker's close
    with contextlib.suppress(Exception):
        conn.wait(lambda: d.settled, timeout=2.0)
    assert not d.settled, "a broker that is no longer the primary answered an accept"
    with mgmt(c[0].url) as m:
        assert m.call("READ", "queue", "late").body["depth"] == 3  # the replica kept the message


def test_after_a_ready_backup_is_dropped_nothing_is_answered_before_the_other_ready_backups_hold_the_new_list(
        cluster: Make) -> None:
    """Without a coordinator a ready backup that lost its primary stays a candidate (docs/states.md); what ranks the
    others above one the primary dropped is the member list without it (ha.core.epoch.Rank). So an accept that
    waited for the dropped backup is answered only once every other ready backup confirmed that list."""
    c = cluster(3, heartbeat=4.0)  # a backup stopped for a few seconds is not dropped
    c.start_with_primary(0)
    conn = _filled(c, "fence", 4)
    c[1].signal(signal.SIGSTOP)  # will be dropped
    c[2].signal(signal.SIGSTOP)
    try:
        held = _accept_without_settling(conn, "fence", 2)
        c[2].signal(signal.SIGCONT)
        time.sleep(0.5)  # b3 applies and acknowledges the dequeues: only b2 holds the accepts
        assert not _answered(conn, held, 0.5)
        c[2].signal(signal.SIGSTOP)  # now b3 cannot confirm a new member list
        c[1].kill()  # dropped at once (connection reset): what waited for it is released
        assert not _answered(conn, held, 1.5), "answered before the other ready backup held the list without b2"
        shown = Cluster.status(c[0])["settle_held"]  # ha-status: SETTLEMENTS HELD: ...
        assert shown.startswith("ready b3 has not yet confirmed the member list without b2 (held "), shown
    finally:
        c[2].signal(signal.SIGCONT)
    assert _answered(conn, held, 10.0)
    assert Cluster.status(c[0])["settle_held"] is None
    assert _bodies(c[0].url, "fence") == [2, 3]


def test_a_dropped_ready_backup_is_ranked_below_the_one_that_holds_the_newer_list_and_accepted_messages_stay_gone(
        cluster: Make) -> None:
    """A backup silent long enough to be dropped, then back after the primary died: it is ready and as far along
    as the other (no publish since), but lacks the dequeues of the accepts answered without it. Every ranking of
    candidates (understudy-cluster's, the OCF agent's) puts the other first."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "resource_agents"))
    import agent_core as core

    c = cluster(3, heartbeat=0.5)
    c.start_with_primary(0)
    conn = _filled(c, "rank", 5)
    c[1].signal(signal.SIGSTOP)  # b2 ("b2" < "b3": it wins a tie)
    try:
        wait_for(lambda: "b2" not in {m["name"] for m in Cluster.status(c[0])["members"]}, 10, 0.1,
                 what="b2 dropped")
        held = _accept_without_settling(conn, "rank", 3)
        assert _answered(conn, held, 10.0)
        c[0].kill()
    finally:
        c[1].signal(signal.SIGCONT)
    for i in (1, 2):
        c.wait_state(i, "ready")
        wait_for(lambda i=i: Cluster.status(c[i])["primary"] is None, 10, 0.1, what=f"b{i + 1} saw its primary go")
    dropped, kept = Cluster.status(c[1]), Cluster.status(c[2])
    assert dropped["position"] == kept["position"]
    assert best_candidate([("b2", rank_of(dropped)), ("b3", rank_of(kept))]) == "b3"
    published = {"n2": core.status_from(dropped), "n3": core.status_from(kept)}
    decision = core.decide_promote("n2", published["n2"], published)
    assert decision.action is core.PromoteAction.ABORT_FOR_BETTER and decision.better_node == "n3"
    assert core.promotion_score("n2", published["n2"], published) < core.promotion_score("n3", published["n3"],
                                                                                        published)
    c.promote(2)
    c.wait_state(2, "recovering", "active")
    assert _bodies(c[2].url, "rank") == [3, 4]


def test_a_backup_whose_status_link_goes_alone_is_dropped_and_rejoins_so_a_later_drop_holds_nothing_for_good(
        cluster: Make, monkeypatch: pytest.MonkeyPatch) -> None:
    """The member lists a ready backup confirms come on its `$ha.status` link. If that link went and the backup
    stayed (a bug, a peer of another release), it would never confirm the list without the next backup dropped,
    and every settlement would be held from then on. The primary drops it instead; it connects again."""
    c = _b3_lets_go(cluster, monkeypatch, "sl", "DETACH", None)
    assert [e["reason"] for e in wait_for(lambda: _b3_lost(c), 10, 0.1, what="b3 dropped")] == [
        "its $ha.status link was detached"]
    _b3_back_and_ready(c)
    c[1].kill()  # a ready backup dropped: nothing is settled until b3 confirms the list without b2
    send(c[0].url, "sl", [3, 4], timeout=15.0)
    _promoted_b3_holds(c, "sl", [0, 1, 2, 3, 4])


def test_a_ready_backup_that_detaches_a_queues_replication_link_is_dropped_at_once_and_rejoins(
        cluster: Make, monkeypatch: pytest.MonkeyPatch) -> None:
    """A ready backup detaches one queue's replication link while its connection stays (it refused a batch, a bug,
    a peer of another release). Kept ready until it attached again (5 s of grace), it let consumer accepts of the
    queue be answered without its dequeue: the primary killed within the grace, the backup promoted, and an
    accepted message was delivered again. It is dropped at once instead (accepts answered as for any dropped
    backup), connects again and catches up, and a later promotion of it holds exactly what was not consumed."""
    c = _b3_lets_go(cluster, monkeypatch, "rl", "DETACH-QUEUE", "rl")
    wait_for(lambda: [e["reason"] for e in _b3_lost(c)], 3, 0.05, what="b3 dropped")
    assert [e["reason"] for e in _b3_lost(c)] == ["its replication link for queue 'rl' was detached while it was ready"]
    conn = connect(c[0].url)
    try:
        held = _accept_without_settling(conn, "rl", 1)  # message 0, in mode second
        assert _answered(conn, held, 10.0)
    finally:
        conn.close()
    send(c[0].url, "rl", [3], timeout=20.0)
    _b3_back_and_ready(c)
    send(c[0].url, "rl", [4], timeout=15.0)
    _promoted_b3_holds(c, "rl", [1, 2, 3, 4])


def _b3_lets_go(cluster: Make, monkeypatch: pytest.MonkeyPatch, queue: str, op: str, name: str | None) -> Cluster:
    """Three brokers, b1 primary, `queue` holding 0..2; then b3 (with the test plugin) is told to let a link go."""
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).resolve().parents[2]))  # b3 imports tests.support
    c = cluster(3, "--plugin", "tests.support.status_plugin:install")
    c.start_with_primary(0)
    _filled(c, queue, 3).close()
    with mgmt(c[2].url) as m:
        m.call(op, STATUS_PLUGIN, name, {})
    return c


def _b3_lost(c: Cluster) -> list[dict[str, Any]]:
    return [e for e in c[0].events() if e["event"] == "ha.backup.lost" and e.get("backup") == "b3"]


def _b3_back_and_ready(c: Cluster) -> None:
    wait_for(lambda: {m["name"]: m["state"] for m in Cluster.status(c[0])["members"]}.get("b3") == "ready", 20, 0.1,
             what="b3 back and ready")


def _promoted_b3_holds(c: Cluster, queue: str, bodies: list[int]) -> None:
    """The primary killed and b3 promoted: every message is there, in order."""
    c[0].kill()
    c.promote(2)
    c.wait_state(2, "recovering", "active")
    assert _bodies(c[2].url, queue) == bodies
