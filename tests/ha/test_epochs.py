"""Epoch fencing without a coordinator: a primary older than a backup's epoch is refused and steps down."""

from __future__ import annotations

from collections.abc import Callable

from tests.support.cluster import Cluster
from tests.support.procs import wait_for

Make = Callable[..., Cluster]


def test_stale_epoch_primary_is_refused_and_steps_down(cluster: Make) -> None:
    c = cluster(2)
    c[1].data_dir.mkdir(parents=True, exist_ok=True)
    (c[1].data_dir / "epoch").write_text("5\n")  # b2 has seen epoch 5: b1 promoted now gets epoch 1
    c.start()
    c.promote(0)
    assert Cluster.status(c[0])["epoch"] == 1

    def refused() -> bool:
        return any(e["event"] == "ha.epoch.refused" for e in c[0].events())

    wait_for(refused, 15, what="the stale primary to refuse the newer backup")
    ev = next(e for e in c[0].events() if e["event"] == "ha.epoch.refused")
    assert ev["peer"] == "b2" and ev["peer_epoch"] == 5 and ev["epoch"] == 1
    wait_for(lambda: any(e["event"] == "ha.demoted" for e in c[0].events()), 15, what="stale primary demoted")
    st = Cluster.status(c[0])
    assert st["role"] == "backup"
    assert Cluster.status(c[1])["state"] in ("joining",)  # never followed the stale primary
    assert not any(e["event"] == "ha.primary.connected" for e in c[1].events())


def test_epoch_is_persisted_and_only_grows(cluster: Make) -> None:
    c = cluster(2)
    c.start_with_primary(0)
    c[0].kill()
    c.promote(1)
    c.wait_state(1, "active")
    assert (c[1].data_dir / "epoch").read_text().strip() == "2"
    c[1].kill()
    c[1].start()  # restarts as a backup and remembers epoch 2
    assert Cluster.status(c[1])["epoch"] == 2
