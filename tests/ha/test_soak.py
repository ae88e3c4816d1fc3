"""Soak: repeated failovers under continuous traffic. Not in the default run: `./test.sh -m soak`."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from tests.support.amqp import drain, mgmt
from tests.support.cluster import Cluster
from tests.support.numbered import numbers, spawn
from tests.support.procs import wait_for

pytestmark = pytest.mark.soak

Make = Callable[..., Cluster]


def lost(c: Cluster, i: int) -> int:
    return sum(e["event"] == "ha.primary.lost" for e in c[i].events())


def test_five_failovers_under_load_lose_nothing_acknowledged(cluster: Make) -> None:
    c = cluster(3)
    c.start_with_primary(0)
    with mgmt(c[0].url) as m:
        m.call("CREATE", "queue", "soak", {})
    work = c[0].workdir
    acked, received = work / "acked.txt", work / "received.txt"
    count = 6000
    sender = spawn("send", c.urls, "soak", acked, "--count", str(count), "--pause", "0.002")
    receiver = spawn("receive", c.urls, "soak", received, "--idle", "15")
    primary = 0
    for round_ in range(5):
        wait_for(lambda n=round_: len(numbers(acked)) > (n + 1) * 800, 120, what=f"traffic in round {round_}")
        survivors = [i for i in range(3) if i != primary]
        before = {i: lost(c, i) for i in survivors}
        t0 = time.monotonic()
        c[primary].kill()
        wait_for(lambda s=survivors, b=before: all(lost(c, i) > b[i] for i in s), 15,
                 what="backups noticing the loss")
        ranked = sorted(survivors, key=lambda i: (Cluster.status(c[i])["epoch"], Cluster.status(c[i])["position"]))
        new = ranked[-1]
        c.promote(new)
        c.wait_state(new, "active", timeout=30)
        print(f"\nround {round_}: b{primary + 1} killed, b{new + 1} active after {time.monotonic() - t0:.2f}s")
        c[primary].start()  # back as a backup
        c.wait_state(primary, "ready", timeout=60)
        primary = new
    assert sender.wait(300) == 0
    receiver.wait(300)
    sent = set(numbers(acked))
    got = set(numbers(received)) | set(drain(c[primary].url, "soak"))
    assert len(sent) == count
    assert not sorted(sent - got)
