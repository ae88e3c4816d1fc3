"""The lag report made from the event logs of a real cluster run: primary + backup, traffic, a failover."""

from __future__ import annotations

import csv
import datetime as dt
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support.amqp import mgmt, send
from tests.support.cluster import Cluster
from tests.support.procs import BIN, BrokerFactory, wait_for

pytestmark = pytest.mark.spark


def rows(path: Path) -> list[dict[str, str]]:
    with open(path) as f:
        return list(csv.DictReader(f))


def test_report_from_a_real_run_shows_the_failover_and_the_lag(brokers: BrokerFactory, tmp_path: Path) -> None:
    c = Cluster(brokers, 2, [])
    c.start_with_primary(0)
    with mgmt(c[0].url) as m:
        m.call("CREATE", "queue", "orders", {})
    send(c[0].url, "orders", list(range(200)))
    # Lag samples are written in batches (every 0.2 s): let the primary write them before it is killed.
    wait_for(lambda: sum(e["event"] == "ha.lag" for e in c[0].events()) >= 200, 10, what="b1's lag samples")
    c[0].kill()
    wait_for(lambda: any(e["event"] == "ha.primary.lost" for e in c[1].events()), 15, what="loss noticed")
    c.promote(1)
    c.wait_state(1, "active")
    send(c[1].url, "orders", list(range(1000, 1020)))
    c[0].start()  # the old primary rejoins as a backup of the new one
    c.wait_state(0, "ready")
    send(c[1].url, "orders", list(range(2000, 2050)))
    for b in c.brokers:
        b.stop()
    logs = tmp_path / "logs"
    logs.mkdir()
    for b in c.brokers:
        shutil.copy(b.log_file, logs / b.log_file.name)
    out = tmp_path / "report"
    today = dt.datetime.now(dt.UTC).date().isoformat()
    r = subprocess.run([str(BIN / "ha-lag-report"), "--logs", str(logs), "--date", today, "--out", str(out)],
                       capture_output=True, text=True, timeout=600, env={"SPARK_LOCAL_IP": "127.0.0.1",
                                                                         "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    failovers = rows(out / "csv" / "failovers.csv")
    # Every promotion is listed: the first one (b1 at epoch 1, a new cluster) and the failover to b2.
    assert [(f["epoch"], f["old_primary"], f["new_primary"]) for f in failovers] == [("1", "", "b1"),
                                                                                    ("2", "b1", "b2")]
    lag = rows(out / "csv" / "lag_hourly.csv")
    assert lag, "empty lag table"
    backups = {row["backup"] for row in lag}
    assert {"b2", "b1"} <= backups  # b2 lagged behind b1, then b1 behind b2
    assert sum(int(float(row["samples"])) for row in lag) >= 250
    assert (out / "report.html").stat().st_size > 10_000
    assert "failover" in r.stdout.lower()
