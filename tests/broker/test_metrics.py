"""The Prometheus endpoint (`--metrics-port`, broker/metrics.py): scraped from a real broker with real clients, the
figures must be what the test did; a taken port stops the start-up; the publisher asks the loop at most once per
`max_age` whatever the number of scrapes, and a loop that does not answer gets the last snapshot, marked old."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import threading
import time
import urllib.request
from dataclasses import replace
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from broker.metrics import (
    SNAPSHOT_MAX_AGE,
    BackupFigures,
    QueueFigures,
    Snapshot,
    SnapshotPublisher,
    families,
)
from ha.core.lag import LagHistogram
from tests.support.amqp import connect, mgmt, receive, send
from tests.support.procs import BIN, BrokerFactory, BrokerProcess, wait_for

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def metrics_address(b: BrokerProcess) -> str:
    ev = wait_for(lambda: next((e for e in b.events(since_start=True) if e["event"] == "metrics.started"), None),
                  10, what=f"{b.name}'s metrics.started")
    return str(ev["address"])


def scrape(b: BrokerProcess) -> Samples:
    """Every sample of one scrape: (name, sorted labels) -> value. Waits out the snapshot's reuse period first, so
    the figures are from after whatever the test just did."""
    time.sleep(SNAPSHOT_MAX_AGE)
    with urllib.request.urlopen(f"http://{metrics_address(b)}/metrics", timeout=10) as r:
        text = r.read().decode()
    out: Samples = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


def test_scrape_shows_depth_bytes_and_counters_of_what_clients_sent_and_consumed(brokers: BrokerFactory) -> None:
    b = brokers("--metrics-port", "0", "--max-memory", "64M", "--min-disk-free", "1K")
    with mgmt(b.url) as m:
        m.call("CREATE", "queue", "orders", {"arguments": {"durable": True}})
        m.call("CREATE", "queue", "idle", {})
    before = scrape(b)
    assert value(before, "understudy_queue_depth", queue="orders") == 0
    assert value(before, "understudy_journal_commits_total") is not None
    send(b.url, "orders", [f"order-{i}" for i in range(25)], durable=True)

    s = scrape(b)
    assert value(s, "understudy_queue_depth", queue="orders") == 25
    assert value(s, "understudy_queue_enqueued_total", queue="orders") == 25
    assert value(s, "understudy_queue_dequeued_total", queue="orders") == 0
    assert value(s, "understudy_queue_depth", queue="idle") == 0
    with mgmt(b.url) as m:
        q = m.call("READ", "queue", "orders").body
    assert value(s, "understudy_queue_bytes", queue="orders") == q["bytes"] > 0
    assert value(s, "understudy_queues") == 2
    assert value(s, "understudy_broker_role", role="standalone") == 1
    assert value(s, "understudy_broker_epoch") == 0
    assert value(s, "understudy_broker_info", broker=b.name, version="0.1.0") == 1
    # durable messages went through the journal; the memory bound counts what is queued
    assert value(s, "understudy_journal_commits_total") > value(before, "understudy_journal_commits_total")
    assert value(s, "understudy_journal_written_bytes_total") > 0
    assert value(s, "understudy_journal_durable_queues") == 1
    assert value(s, "understudy_journal_failed") == 0
    assert value(s, "understudy_journal_disk_low") == 0
    assert value(s, "understudy_journal_backups_disk_low") == 0
    assert value(s, "understudy_journal_disk_free_bytes") > 1024
    assert 0 <= value(s, "understudy_journal_sync_wait_seconds") < 5  # no sync hangs
    assert value(s, "understudy_memory_limit_bytes") == 64 * 1024 * 1024
    assert value(s, "understudy_memory_used_bytes") >= q["bytes"]
    assert value(s, "understudy_memory_over") == 0

    # 10 consumed (and accepted: the helper's connection closes after), then two connections with a consumer each,
    # one of them holding 3 messages unsettled
    assert receive(b.url, "orders", 10) == [f"order-{i}" for i in range(10)]
    c1, c2 = connect(b.url), connect(b.url)
    try:
        holder = c1.create_receiver("orders", credit=3)
        assert [holder.receive(10).body for _ in range(3)] == ["order-10", "order-11", "order-12"]
        c2.create_receiver("orders", credit=0)
        s = scrape(b)
        assert value(s, "understudy_connections") == 2
        assert value(s, "understudy_queue_consumers", queue="orders") == 2
        assert value(s, "understudy_queue_acquired", queue="orders") == 3
        assert value(s, "understudy_queue_depth", queue="orders") == 15  # the 3 acquired are still on the queue
        assert value(s, "understudy_queue_dequeued_total", queue="orders") == 10
    finally:
        c1.close()
        c2.close()
    wait_for(lambda: value(scrape(b), "understudy_connections") == 0, 10, what="connections back to 0")
    s = scrape(b)
    assert value(s, "understudy_queue_consumers", queue="orders") == 0
    assert value(s, "understudy_queue_acquired", queue="orders") == 0
    assert value(s, "understudy_queue_depth", queue="orders") == 15  # released, not consumed
    assert value(s, "understudy_queue_enqueued_total", queue="orders") == 25


def test_temporary_reply_queues_get_no_series(brokers: BrokerFactory) -> None:
    b = brokers("--metrics-port", "0")
    with mgmt(b.url) as m:  # a management client has a temporary reply queue while it is open
        m.call("CREATE", "queue", "kept", {})
        s = scrape(b)
        assert value(s, "understudy_queues") == 2  # counted
        assert [k for k in s if k[0] == "understudy_queue_depth"] == [("understudy_queue_depth", (("queue", "kept"),))]


def test_metrics_port_in_use_stops_the_start_with_exit_code_2_and_says_why(brokers: BrokerFactory) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        b = brokers("--metrics-port", str(port), start=False)
        b.start(wait=False)
        assert b.proc is not None
        assert b.proc.wait(20) == 2
    err = b.stderr_file.read_text()
    assert f"--metrics-port: cannot listen on 127.0.0.1:{port}: Address already in use" in err
    refused = [e for e in b.events() if e["event"] == "metrics.refused"]
    assert refused and "Address already in use" in refused[0]["description"]
    assert not [e for e in b.events() if e["event"] == "broker.started"]  # never served AMQP either


def test_invalid_metrics_port_is_a_configuration_error() -> None:
    for args, text in ((["--metrics-port", "70000"], "--metrics-port: Input should be less than or equal to 65535"),
                       (["--metrics-port", "-1"], "--metrics-port: Input should be greater than or equal to 0"),
                       (["--port", "5999", "--metrics-port", "5999"], "--metrics-port 5999 is also --port"),
                       (["--metrics-port", "x"], "'x' is not a valid integer")):
        r = subprocess.run([str(BIN / "ha-broker"), *args, "--validate-config"], capture_output=True, text=True,
                           timeout=30)
        assert r.returncode == 2, (args, r.stderr)
        assert text in r.stderr, (args, r.stderr)


# ----- the publisher and the families, without a broker ------------------------------------------------------------
def _snapshot(depth: int = 0) -> Snapshot:
    q = QueueFigures("q", depth, 0, 10 * depth, 0, depth, 0, 0, 0, 0, 0)
    return Snapshot(time.monotonic(), "b1", "0.1.0", 1.0, "standalone", 0, 0, 1, 0, 5, (q,))


class FakeLoop:
    """Runs what it is handed on its own thread, like the engine's call_soon_threadsafe; can be stopped."""

    def __init__(self) -> None:
        self.answering = True

    def call_soon(self, fn: Any) -> None:
        if self.answering:
            threading.Thread(target=fn).start()


def test_many_scrapes_within_max_age_ask_the_loop_once() -> None:
    loop = FakeLoop()
    p = SnapshotPublisher(_snapshot, loop.call_soon, max_age=30.0, timeout=5.0)
    threads = [threading.Thread(target=p.get) for _ in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert p.taken == 1


def test_a_loop_that_does_not_answer_gets_the_last_snapshot_marked_old() -> None:
    loop = FakeLoop()
    p = SnapshotPublisher(lambda: _snapshot(7), loop.call_soon, max_age=0.0, timeout=0.2)
    first = p.get()
    assert first is not None and p.taken == 1
    loop.answering = False
    time.sleep(0.3)
    t0 = time.monotonic()
    again = p.get()
    assert again is first and time.monotonic() - t0 >= 0.2  # waited the timeout, then served the old one
    ages = [s.value for f in families(again, time.monotonic()) for s in f.samples
            if s.name == "understudy_metrics_snapshot_age_seconds"]
    assert ages and ages[0] >= 0.5


def test_before_the_loop_ever_answers_only_the_age_is_served_as_minus_one() -> None:
    p = SnapshotPublisher(_snapshot, lambda fn: None, max_age=1.0, timeout=0.05)
    fams = list(families(p.get(), time.monotonic()))
    assert [(f.name, [s.value for s in f.samples]) for f in fams] == [("understudy_metrics_snapshot_age_seconds",
                                                                       [-1.0])]


# ----- the docs and the dashboard name what the broker serves -----------------------------------------------------
ROOT = Path(__file__).resolve().parents[2]
_JOURNAL = {"segments": 1, "durable-queues": 1, "written": 10, "commits": 2, "failed": None, "sync-wait": 0.0,
            "paged": 0, "low-disk": None, "disk-free": 5000,
            "paged-out": 0, "paged-in": 0, "read-errors": 0}


def _every_sample_name() -> set[str]:
    s = replace(_snapshot(3), ha_state="active", ha_position=3, journal=_JOURNAL,
                memory={"limit": 10, "used": 1, "over": False},
                backups=(BackupFigures("b2", "backup", "ready", 0, 0.0, 1, 1.0, LagHistogram().to_wire()),))
    # a histogram is documented by its family name (its samples are NAME_bucket, NAME_count, NAME_sum)
    return {f.name if f.type == "histogram" else sample.name
            for f in families(s, time.monotonic()) for sample in f.samples}


def test_docs_metrics_md_lists_exactly_the_metrics_served() -> None:
    served = _every_sample_name()
    documented = set(re.findall(r"^\| `(understudy_\w+)`", (ROOT / "docs/metrics.md").read_text(), re.M))
    assert documented == served


def test_the_grafana_dashboard_queries_only_metrics_that_exist() -> None:
    dash = json.loads((ROOT / "deploy/grafana-understudy.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    used = {n for e in exprs for n in re.findall(r"\bunderstudy_\w+", e)}
    used |= set(re.findall(r"\bunderstudy_\w+", json.dumps(dash["templating"])))
    assert used and used <= _every_sample_name(), used - _every_sample_name()
    titles = " ".join(p["title"] for p in dash["panels"]).lower()
    for topic in ("queue depth", "lag", "role", "epoch", "journal"):
        assert topic in titles
