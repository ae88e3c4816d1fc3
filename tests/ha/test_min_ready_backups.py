"""`--ha-min-ready-backups N`: the primary settles clients' messages and accepts only while N backups are ready (a
quorum queue without its majority does the same); `ha-status` says why; the hold ends as soon as a backup is ready.
Real broker processes.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from typing import Any

from proton import Delivery, Message, Timeout

from tests.support.amqp import SettleSecond, connect, mgmt
from tests.support.cluster import Cluster
from tests.support.procs import BIN, BrokerFactory, wait_for

Make = Callable[..., Cluster]


def _settled(conn: Any, d: Any, timeout: float) -> bool:
    try:
        conn.wait(lambda: d.settled, timeout=timeout, msg="settlement")
        return True
    except Timeout:
        return False


def _events(c: Cluster, i: int, name: str) -> list[dict[str, Any]]:
    return [e for e in c[i].events() if e.get("event") == name]


def test_a_primary_without_enough_ready_backups_holds_settlements_and_says_why(cluster: Make) -> None:
    c = cluster(2, "--ha-min-ready-backups", "1")
    c.start(0)
    c.promote(0)
    c.wait_state(0, "recovering", "active", timeout=30)
    with mgmt(c[0].url) as m:
        m.call("CREATE", "queue", "held", {})
    conn = connect(c[0].url)
    s = conn.create_sender("held")
    d = s.link.send(Message(body="first", durable=True))
    assert not _settled(conn, d, 1.5), "settled with no backup ready"
    status = c.status(c[0])
    assert status["settle_held"] == "0 of 1 required backups ready (--ha-min-ready-backups)"
    shown = subprocess.run([str(BIN / "ha-status"), "--broker", c[0].url], capture_output=True, text=True,
                           timeout=30)
    assert "SETTLEMENTS HELD: 0 of 1 required backups ready" in shown.stdout, shown.stdout + shown.stderr
    assert _events(c, 0, "ha.settle.held")[0]["required"] == 1
    c.start(1)
    c.wait_state(1, "ready")
    assert _settled(conn, d, 10.0)
    assert d.remote_state == Delivery.ACCEPTED
    assert c.status(c[0])["settle_held"] is None
    resumed = wait_for(lambda: _events(c, 0, "ha.settle.resumed"), 5, what="ha.settle.resumed")
    assert resumed[0]["held_seconds"] >= 1.0

    # The backup goes: publishers and consumers (mode second) wait again, and are answered once it is back.
    c[1].kill()
    wait_for(lambda: c.status(c[0])["settle_held"], 15, what="the primary to notice")
    d2 = s.link.send(Message(body="second", durable=True))
    r = conn.create_receiver("held", credit=0, name="held-consumer", options=SettleSecond())
    r.link.flow(1)
    conn.wait(lambda: r.fetcher.has_message >= 1, timeout=10, msg="a message")
    assert r.fetcher.pop().body == "first"
    taken = r.fetcher.unsettled.popleft()
    taken.update(Delivery.ACCEPTED)
    assert not _settled(conn, d2, 1.0) and not taken.settled
    c.start(1)
    c.wait_state(1, "ready")
    assert _settled(conn, d2, 10.0) and _settled(conn, taken, 10.0)
    conn.close()


def test_a_requirement_the_cluster_can_never_meet_is_refused_at_start(brokers: BrokerFactory) -> None:
    b = brokers("--ha-cluster", "--ha-brokers-url", "127.0.0.1:1,127.0.0.1:2", "--ha-min-ready-backups", "2",
                start=False)
    b.start(wait=False)
    assert b.proc is not None
    assert b.proc.wait(30) == 2
    err = b.stderr_file.read_text()
    assert "--ha-min-ready-backups 2 can never be met: --ha-brokers-url names 1 other broker" in err, err


def test_status_json_names_the_hold(cluster: Make) -> None:
    c = cluster(2, "--ha-min-ready-backups", "1")
    c.start(0)
    c.promote(0)
    c.wait_state(0, "recovering", "active", timeout=30)
    out = subprocess.run([str(BIN / "ha-status"), "--broker", c[0].url, "--format", "json"], capture_output=True, text=True,
                         timeout=30)
    rows = json.loads(out.stdout)["members"]
    me = next(m for m in rows if m["name"] == "b1")
    assert me["settle_held"].startswith("0 of 1 required backups ready")
