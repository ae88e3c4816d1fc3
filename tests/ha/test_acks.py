"""Batched acknowledgements (`$ha.acks`) and the per-message settlements of older brokers work in every mix.

A broker started with `--no-ha-batched-acks` behaves like one from before batching: as a primary it does not offer
batching, as a backup it does not use it. Whatever the mix, a client's message is confirmed only once the backup
holds it, and a failover loses nothing confirmed.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.support.amqp import drain, mgmt
from tests.support.cluster import Cluster
from tests.support.numbered import numbers, spawn

Make = Callable[..., Cluster]


@pytest.mark.parametrize(
    ("primary_batches", "backup_batches"),
    [(True, True), (True, False), (False, True)],
    ids=["both", "old-backup", "old-primary"],
)
def test_every_mix_confirms_only_what_the_backup_holds(
    cluster: Make, primary_batches: bool, backup_batches: bool
) -> None:
    c = cluster(2)
    for i, on in ((0, primary_batches), (1, backup_batches)):
        if not on:
            c[i].args.append("--no-ha-batched-acks")
    c.start_with_primary(0)
    with mgmt(c[0].url) as m:
        m.call("CREATE", "queue", "mix", {})
    acked = c[0].workdir / "mix-acked.txt"
    assert spawn("send", [c[0].url], "mix", acked, "--count", "2000").wait(60) == 0
    assert sorted(numbers(acked)) == list(range(1, 2001))
    batched = [e for e in c[0].events() if e["event"] == "ha.backup.acks"]
    assert bool(batched) == (primary_batches and backup_batches)
    c[0].kill()
    c.promote(1, "--force")
    c.wait_state(1, "active")
    assert sorted(drain(c[1].url, "mix")) == list(range(1, 2001))
