"""The Prometheus endpoint on a 2-broker cluster: role, state and epoch on each broker, replicated depth on the
backup, the backup's lag and backlog on the primary while the backup is stopped (and back to 0 after), and role and
epoch after a failover."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable

from proton import Message

from tests.broker.test_metrics import Samples, scrape, value
from tests.support.amqp import connect, mgmt, send
from tests.support.cluster import Cluster
from tests.support.procs import wait_for

Make = Callable[..., Cluster]


def test_scrapes_follow_replication_a_stalled_backup_and_a_failover(cluster: Make) -> None:
    # heartbeat 5: a stopped backup is declared dead after 10 s, long enough to scrape it as lagging
    c = cluster(2, "--metrics-port", "0", heartbeat=5.0)
    c.start_with_primary(0)
    epoch = Cluster.status(c[0])["epoch"]
    with mgmt(c[0].url) as m:
        m.call("CREATE", "queue", "orders", {})
    send(c[0].url, "orders", [f"o-{i}" for i in range(40)])

    p = scrape(c[0])
    assert value(p, "understudy_broker_role", role="primary") == 1
    assert value(p, "understudy_ha_state", state="active") == 1
    assert value(p, "understudy_broker_epoch") == epoch >= 1
    assert value(p, "understudy_queue_depth", queue="orders") == 40
    assert value(p, "understudy_ha_member_state", member="b2", role="backup", state="ready") == 1
    assert value(p, "understudy_ha_backup_lag_seconds", backup="b2") == 0  # all acknowledged (sends were settled)
    assert value(p, "understudy_ha_backup_backlog", backup="b2") == 0
    assert value(p, "understudy_ha_backup_catchup_fraction", backup="b2") == 1
    # every replicated message's lag, as a histogram (below the sampler's rate each acknowledgement counts once)
    hist = "understudy_ha_backup_replication_lag_seconds"
    assert value(p, f"{hist}_count", backup="b2") >= 40
    assert value(p, f"{hist}_bucket", backup="b2", le="+Inf") == value(p, f"{hist}_count", backup="b2")
    assert 0 < value(p, f"{hist}_sum", backup="b2") < 40 * 1.0  # each under a second on loopback
    assert value(p, "understudy_connections") >= 1  # the backup's replication connection

    b = scrape(c[1])
    assert value(b, "understudy_broker_role", role="backup") == 1
    assert value(b, "understudy_ha_state", state="ready") == 1
    assert value(b, "understudy_broker_epoch") == epoch
    assert value(b, "understudy_queue_depth", queue="orders") == 40  # replicated
    assert value(b, "understudy_ha_member_state", member="b1", role="primary", state="active") == 1
    assert value(b, "understudy_ha_backup_lag_seconds", backup="b1") is None  # a backup measures no lag
    assert value(b, f"{hist}_count", backup="b1") is None

    # The backup stops acknowledging: the primary holds the next send, and its scrape shows lag and backlog.
    c[1].signal(signal.SIGSTOP)
    outcome: list[object] = []

    def publish() -> None:
        conn = connect(c[0].url, timeout=30)
        try:
            conn.create_sender("orders").send(Message(body="held"))
            outcome.append("settled")
        except Exception as e:
            outcome.append(e)
        finally:
            conn.close()

    t = threading.Thread(target=publish)
    try:
        t.start()

        def backlog_shown() -> Samples | None:
            s = scrape(c[0])
            return s if value(s, "understudy_ha_backup_backlog", backup="b2") else None

        lagging = wait_for(backlog_shown, 8, what="the primary to show b2's backlog")
        assert value(lagging, "understudy_ha_backup_backlog", backup="b2") == 1
        assert value(lagging, "understudy_ha_backup_lag_seconds", backup="b2") > 0.3
        assert not outcome  # still held
    finally:
        c[1].signal(signal.SIGCONT)
    t.join(30)
    assert outcome == ["settled"]
    caught_up = scrape(c[0])
    assert value(caught_up, "understudy_ha_backup_backlog", backup="b2") == 0
    assert value(caught_up, "understudy_ha_backup_lag_seconds", backup="b2") == 0
    assert value(caught_up, "understudy_queue_enqueued_total", queue="orders") == 41

    # Failover: the primary dies, the backup is promoted in a new epoch and says so.
    c[0].kill()
    c.promote(1)
    c.wait_state(1, "active")
    n = scrape(c[1])
    assert value(n, "understudy_broker_role", role="primary") == 1
    assert value(n, "understudy_broker_role", role="backup") is None
    assert value(n, "understudy_ha_state", state="active") == 1
    assert value(n, "understudy_broker_epoch") == Cluster.status(c[1])["epoch"] > epoch
    assert value(n, "understudy_queue_depth", queue="orders") == 41
