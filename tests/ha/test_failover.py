"""Promotion and failover with real broker processes: SIGKILL, SIGSTOP, clients failing over."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable

import pytest
from proton import Message
from proton.utils import BlockingConnection

from tests.support.amqp import connect, drain, mgmt, send
from tests.support.cluster import Cluster
from tests.support.numbered import numbers, spawn
from tests.support.procs import ROOT, wait_for

Make = Callable[..., Cluster]


def test_backup_refuses_plain_client_with_redirect_but_serves_admin(cluster: Make) -> None:
    c = cluster(2)
    c.start_with_primary(0)
    with pytest.raises(Exception) as exc:
        BlockingConnection(c[1].url, timeout=5, reconnect=False)
    text = str(exc.value)
    assert "amqp:connection:redirect" in text
    assert f"127.0.0.1:{c.ports[0]}" in text  # names the primary
    st = Cluster.status(c[1])  # admin connections are served
    assert st["role"] == "backup" and st["state"] == "ready"
    refused = [e for e in c[1].events() if e["event"] == "connection.refused"]
    assert refused and refused[0]["condition"] == "amqp:connection:redirect"


def test_send_1000_consume_990_leaves_exactly_the_last_10_on_every_backup(cluster: Make) -> None:
    c = cluster(3)
    c.start_with_primary(0)
    with mgmt(c[0].url) as m:
        m.call("CREATE", "queue", "work", {})
    conn = connect(c[0].url)
    s = conn.create_sender("work")
    for i in range(1000):
        s.send(Message(body=i))
    r = conn.create_receiver("work", credit=100)
    for _ in range(990):
        r.receive(10)
        r.accept()
    conn.close()
    for i in (1, 2):
        wait_for(lambda i=i: c.queue_bodies(i, "work") == list(range(990, 1000)), 10,
                 what=f"backup b{i + 1} to hold exactly the last 10")
    assert [p for p, _ in c.queue_entries(1, "work")] == list(range(991, 1001))  # positions kept


def test_backup_joining_mid_stream_receives_everything(cluster: Make) -> None:
    c = cluster(3)
    c.start(0, 1)
    c.promote(0)
    c.wait_state(1, "ready")
    with mgmt(c[0].url) as m:
        m.call("CREATE", "queue", "stream", {})
    out = c[0].workdir / "acked.txt"
    sender = spawn("send", [c[0].url], "stream", out, "--count", "600")
    wait_for(lambda: len(numbers(out)) > 100, 30, what="traffic to start")
    c.start(2)  # joins while messages flow
    assert sender.wait(60) == 0
    c.wait_state(2, "ready")
    for i in (0, 1, 2):
        wait_for(lambda i=i: c.queue_bodies(i, "stream") == list(range(1, 601)), 15,
                 what=f"b{i + 1} to hold all 600 in order")


def test_kill_primary_under_load_promote_ready_backup_no_acknowledged_message_lost(cluster: Make) -> None:
    c = cluster(3)
    c.start_with_primary(0)
    with mgmt(c[0].url) as m:
        m.call("CREATE", "queue", "orders", {})
    work = c[0].workdir
    acked, received = work / "acked.txt", work / "received.txt"
    sender = spawn("send", c.urls, "orders", acked, "--count", "1500", "--pause", "0.001")
    receiver = spawn("receive", c.urls, "orders", received, "--idle", "8")
    wait_for(lambda: len(numbers(acked)) > 300 and len(numbers(received)) > 100, 30, what="traffic")
    t0 = time.monotonic()
    c[0].kill()
    wait_for(lambda: any(e["event"] == "ha.primary.lost" for e in c[1].events()), 10, what="loss noticed")
    c.promote(1)
    c.wait_state(1, "active")
    assert sender.wait(90) == 0, (acked.with_suffix(".err")).read_text()[-2000:]
    receiver.wait(90)
    print(f"\nfailover: primary killed -> new primary active in {time.monotonic() - t0:.2f}s")
    sent_ok = set(numbers(acked))
    got = set(numbers(received)) | set(drain(c[1].url, "orders"))
    assert len(sent_ok) == 1500
    missing = sorted(sent_ok - got)
    assert not missing, f"acknowledged but lost: {missing[:20]}"
    c.wait_state(2, "ready")  # the third broker follows the new primary
    st = Cluster.status(c[2])
    assert st["primary"] == "b2" and st["epoch"] == Cluster.status(c[1])["epoch"]


def test_empty_backup_promotion(cluster: Make) -> None:
    c = cluster(2)
    c.start_with_primary(0)
    c[0].kill()
    c.promote(1)
    st = c.wait_state(1, "active")
    assert st["role"] == "primary" and st["epoch"] == 2
    send(c[1].url, "q", ["x"]) if False else None
    with mgmt(c[1].url) as m:
        m.call("CREATE", "queue", "after", {})
    send(c[1].url, "after", ["works"])
    assert drain(c[1].url, "after") == ["works"]


def test_acquired_but_unsettled_messages_are_on_the_backup_and_redelivered_after_failover(cluster: Make) -> None:
    c = cluster(2)
    c.start_with_primary(0)
    with mgmt(c[0].url) as m:
        m.call("CREATE", "queue", "inflight", {})
    send(c[0].url, "inflight", ["a", "b", "c"])
    conn = connect(c[0].url)
    r = conn.create_receiver("inflight", credit=2)
    assert r.receive(5).body == "a"
    assert r.receive(5).body == "b"  # acquired, never settled
    wait_for(lambda: c.queue_bodies(1, "inflight") == ["a", "b", "c"], 10, what="backup holds acquired messages")
    c[0].kill()
    c.promote(1)
    c.wait_state(1, "active")
    assert drain(c[1].url, "inflight") == ["a", "b", "c"]


def test_promotion_refused_in_catchup_and_allowed_with_force(cluster: Make) -> None:
    from tests.support.bulk import fill

    c = cluster(2)
    # One transfer in flight, one message per transfer (the per-message format): catch-up takes seconds.
    c[1].args += ["--ha-flow-messages", "1", "--ha-batch-bytes", "0"]
    c.start(0)
    c.promote(0)
    with mgmt(c[0].url) as m:
        m.call("CREATE", "queue", "big", {})
    fill(c[0].url, "big", 20_000)
    c.start(1)
    c.wait_state(1, "catchup", timeout=20)
    c[0].signal(signal.SIGSTOP)  # the backup stays in catchup
    try:
        assert Cluster.status(c[1])["state"] == "catchup"
        r = Cluster.admin(c[1], "promote")
        assert r.returncode == 1
        # Two heartbeats after the SIGSTOP the backup gives its primary up and is joining again: as refused (a slow
        # machine gets there between the status and the promote).
        assert re.search(r"refusing to promote a backup in state (catchup|joining): it may lack acknowledged "
                         r"messages", r.stderr), r.stderr
        assert Cluster.status(c[1])["role"] == "backup"
        r = Cluster.admin(c[1], "promote", "--force")
        assert r.returncode == 0, r.stderr
        assert "WARNING" in r.stderr
        st = Cluster.status(c[1])
        assert st["role"] == "primary" and st["epoch"] == 2
        forced = [e for e in c[1].events() if e["event"] == "ha.promoted"]
        assert forced and forced[0]["forced"] is True and forced[0]["from_state"] in ("catchup", "joining")
    finally:
        c[0].signal(signal.SIGCONT)


def test_sigstopped_backup_does_not_block_the_primary_beyond_two_heartbeats(cluster: Make) -> None:
    c = cluster(2, heartbeat=1.0)
    c.start_with_primary(0)
    with mgmt(c[0].url) as m:
        m.call("CREATE", "queue", "q", {})
    c[1].signal(signal.SIGSTOP)
    try:
        conn = connect(c[0].url, timeout=15)
        s = conn.create_sender("q")
        t0 = time.monotonic()
        s.send(Message(body="must not wait forever"), timeout=10)
        waited = time.monotonic() - t0
        conn.close()
        print(f"\nsettled {waited:.2f}s after the backup froze (heartbeat 1s)")
        assert waited < 2 * 1.0 + 1.5
        lost = [e for e in c[0].events() if e["event"] == "ha.backup.lost"]
        assert lost and lost[0]["backup"] == "b2"
    finally:
        c[1].signal(signal.SIGCONT)


def test_recovering_primary_holds_settlements_until_expected_backup_returns(cluster: Make) -> None:
    c = cluster(3)
    c.start_with_primary(0)
    c[0].kill()
    c[2].signal(signal.SIGSTOP)  # b3 was ready before the failover: the new primary must wait for it
    try:
        c.promote(1)
        st = Cluster.status(c[1])
        assert st["state"] == "recovering"
        conn = connect(c[1].url, timeout=20)
        s = conn.create_sender("held", options=None) if False else None
        with mgmt(c[1].url) as m:
            m.call("CREATE", "queue", "held", {})
        s = conn.create_sender("held")
        t0 = time.monotonic()
        c[2].signal(signal.SIGCONT)
        s.send(Message(body="waits for b3"), timeout=15)
        waited = time.monotonic() - t0
        conn.close()
        assert Cluster.status(c[1])["state"] == "active"
        active = next(e for e in c[1].events() if e["event"] == "ha.active")
        assert active["timed_out"] == []
        print(f"\nsettled {waited:.2f}s after b3 resumed")
    finally:
        c[2].signal(signal.SIGCONT)


def test_recovering_primary_releases_settlements_when_backup_timeout_expires(cluster: Make) -> None:
    c = cluster(3)  # --ha-backup-timeout 5
    c.start_with_primary(0)
    c[0].kill()
    c[2].kill()  # an expected backup that never returns
    c.promote(1)
    with mgmt(c[1].url) as m:
        m.call("CREATE", "queue", "held", {})
    conn = connect(c[1].url, timeout=20)
    s = conn.create_sender("held")
    t0 = time.monotonic()
    s.send(Message(body="released by the timeout"), timeout=15)
    waited = time.monotonic() - t0
    conn.close()
    assert 1.0 < waited < 8.0, waited
    ev = [e for e in c[1].events() if e["event"] == "ha.guard.timeout"]
    assert ev and ev[0]["backup"] == "b3"
    assert Cluster.status(c[1])["state"] == "active"


def test_membership_is_identical_on_every_broker(cluster: Make) -> None:
    c = cluster(3)
    c.start_with_primary(0)

    def same() -> bool:
        views = [Cluster.status(c[i])["members"] for i in range(3)]
        strip = [[{k: m[k] for k in ("name", "address", "role", "state")} for m in v] for v in views]
        return strip[0] == strip[1] == strip[2] and len(strip[0]) == 3

    wait_for(same, 10, what="identical membership")
    names = [m["name"] for m in Cluster.status(c[2])["members"]]
    assert names == ["b1", "b2", "b3"]


def test_backup_skips_an_address_that_never_answers(cluster: Make) -> None:
    """A dead host (no RST) must not stall the backup: each connection attempt has a deadline."""
    import socket

    tarpit = socket.socket()
    tarpit.bind(("127.0.0.1", 0))
    tarpit.listen(16)  # accepts TCP, never speaks AMQP
    try:
        # A slow heartbeat (idle timeout 20 s), so that only the attempt's deadline (1 s) can move the backup on.
        c = cluster(2, heartbeat=10.0)
        c.brokers_url = f"127.0.0.1:{tarpit.getsockname()[1]}," + c.brokers_url
        for b in c.brokers:
            b.args = c.args()
        c.start(0)
        c.promote(0)
        t0 = time.monotonic()
        c.start(1)
        c.wait_state(1, "ready", timeout=15)
        took = time.monotonic() - t0
        print(f"\nbackup ready {took:.2f}s after start despite a silent first address")
        assert took < 8, f"the backup took {took:.1f}s past a silent address (deadline 1 s an attempt)"
    finally:
        tarpit.close()


def test_a_frozen_backup_turns_into_backpressure_not_memory(cluster: Make) -> None:
    """While a guarding backup does not acknowledge, publishers get no more credit than the window."""
    c = cluster(2, "--credit-window", "200", heartbeat=10.0)  # slow heartbeat: the backup is not dropped
    c.start_with_primary(0)
    with mgmt(c[0].url) as m:
        m.call("CREATE", "queue", "bp", {})
    c[1].signal(signal.SIGSTOP)
    filler = subprocess.Popen([sys.executable, "-c", "import sys; from tests.support.bulk import fill; "
                               "fill(sys.argv[1], 'bp', 3000)", c[0].url], cwd=ROOT)
    try:
        time.sleep(3.0)
        with mgmt(c[0].url) as m:
            depth = m.call("READ", "queue", "bp").body["depth"]
        assert filler.poll() is None, "all 3000 were settled although the backup acknowledged nothing"
        assert 0 < depth <= 200 + 50, f"{depth} messages accepted past a 200-message window"
    finally:
        c[1].signal(signal.SIGCONT)
    assert filler.wait(60) == 0  # the backup catches up, settlements flow again
    wait_for(lambda: len(c.queue_entries(1, "bp")) == 3000, 20, what="backup holds all 3000")
