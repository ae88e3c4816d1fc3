"""Batched acknowledgements (`$ha.acks`) and the per-message settlements of older brokers work in every mix.

A broker started with `--no-ha-batched-acks` behaves like one from before batching: as a primary it does not offer
batching, as a backup it does not use it. Whatever the mix, a client's message is confirmed only once the backup
holds it, and a failover loses nothing confirmed.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from proton import Message
from proton.utils import BlockingConnection

from ha import protocol as P
from tests.support.amqp import drain, mgmt, send
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


def test_junk_on_the_ack_link_is_logged_and_loses_nothing(cluster: Make) -> None:
    """A peer that logs in as a backup and sends garbage acknowledgements: each is logged and ignored, the primary
    keeps serving, and the queue's messages are all still there (on the primary and on the real backup)."""
    c = cluster(2)
    c.start_with_primary(0)
    with mgmt(c[0].url) as m:
        m.call("CREATE", "queue", "kept", {})
    acked = c[0].workdir / "kept-acked.txt"
    assert spawn("send", [c[0].url], "kept", acked, "--count", "50").wait(60) == 0
    epoch = Cluster.status(c[0])["epoch"]
    props = {P.PROP_KIND: "ha", P.PROP_BROKER: "intruder", P.PROP_EPOCH: epoch}
    conn = BlockingConnection(c[0].url, timeout=10, properties=props)
    try:
        sender = conn.create_sender(P.ACKS_ADDRESS)
        for body in [
            "not a map",
            {"kept": "not ranges"},
            {"kept": [[5, 1]]},
            {"kept": [[1, 2**63 - 1]]},
            {"x": []},
        ]:
            sender.send(Message(body=body))
    finally:
        conn.close()
    errors = [
        e for e in c[0].events() if e["event"] == "ha.replication.error" and e.get("backup") == "intruder"
    ]
    assert len(errors) == 3, errors  # the last two are well formed (nothing of theirs is guarded: ignored)
    assert c[0].alive
    send(c[0].url, "kept", list(range(51, 101)))  # confirmed: the real backup still acknowledges
    assert c.queue_bodies(1, "kept") == list(range(1, 101))
    assert sorted(drain(c[0].url, "kept")) == list(range(1, 101))
