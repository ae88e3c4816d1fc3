"""Replication batches (ha.core.batch): negotiated per browser, so every mix of brokers works, including the release
before them; a damaged batch is refused whole, logged, and replaced by a fresh catch-up: nothing lost or doubled."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.amqp import drain, mgmt, send
from tests.support.cluster import Cluster, free_ports
from tests.support.corrupt_plugin import TYPE as CORRUPT
from tests.support.numbered import numbers, spawn
from tests.support.procs import BrokerFactory, BrokerProcess, wait_for
from tests.support.releases import unpack

Make = Callable[..., Cluster]
ROOT = Path(__file__).resolve().parents[2]
# The last commit before "Message path v2": proton's reactor, one transfer per replicated message.
PREVIOUS_RELEASE = "53f174a"


def _catchup_formats(b: BrokerProcess) -> set[str]:
    return {e.get("format", "message") for e in b.events() if e["event"] == "ha.catchup.start"}


@pytest.mark.parametrize(
    ("primary_batches", "backup_batches"),
    [(True, True), (True, False), (False, True)],
    ids=["both", "backup-without", "primary-without"],
)
def test_every_mix_catches_up_replicates_live_and_fails_over(
    cluster: Make, primary_batches: bool, backup_batches: bool
) -> None:
    c = cluster(2)
    for i, on in ((0, primary_batches), (1, backup_batches)):
        if not on:
            c[i].args += ["--ha-batch-bytes", "0"]
    c.start(0)
    c.promote(0)
    c.wait_state(0, "active")
    with mgmt(c[0].url) as m:
        m.call("CREATE", "queue", "mix", {})
    send(c[0].url, "mix", list(range(1, 3001)))  # on the primary before the backup exists: catch-up
    c.start(1)
    c.wait_state(1, "ready")
    acked = c[0].workdir / "mix-acked.txt"
    assert spawn("send", [c[0].url], "mix", acked, "--count", "2000", "--first", "3001").wait(60) == 0
    assert sorted(numbers(acked)) == list(range(3001, 5001))
    assert _catchup_formats(c[0]) == {"batch" if primary_batches and backup_batches else "message"}
    assert c.queue_bodies(1, "mix") == list(range(1, 5001))
    c[0].kill()
    c.promote(1, "--force")
    c.wait_state(1, "active")
    assert drain(c[1].url, "mix") == list(range(1, 5001))


@pytest.fixture(scope="module")
def previous_release(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The broker as it was before batches."""
    return unpack(PREVIOUS_RELEASE, tmp_path_factory, "previous-release")


@pytest.mark.parametrize("older", ["primary", "backup"])
def test_rolling_upgrade_with_the_previous_release(brokers: BrokerFactory, previous_release: Path,
                                                   older: str) -> None:
    """An upgrade is done one broker at a time, so for a while a new broker replicates with an old one, in either
    role. Whatever is confirmed is on the backup, and survives the failover to it."""
    ports = free_ports(2)
    url = ",".join(f"127.0.0.1:{p}" for p in ports)
    args = ["--ha-cluster", "--ha-brokers-url", url, "--ha-heartbeat", "1", "--ha-backup-timeout", "5"]
    primary = brokers(*args, name="b1", port=ports[0], start=False,
                      source=previous_release if older == "primary" else None)
    backup = brokers(*args, name="b2", port=ports[1], start=False,
                     source=previous_release if older == "backup" else None)
    c = Cluster.of([primary, backup])
    primary.start()
    c.promote(0)
    c.wait_state(0, "active")
    with mgmt(primary.url) as m:
        m.call("CREATE", "queue", "up", {})
    send(primary.url, "up", list(range(1, 1001)))
    backup.start()
    c.wait_state(1, "ready")
    acked = primary.workdir / "up-acked.txt"
    assert spawn("send", [primary.url], "up", acked, "--count", "1000", "--first", "1001").wait(60) == 0
    assert c.queue_bodies(1, "up") == list(range(1, 2001))
    assert _catchup_formats(primary) == {"message"}  # the older one never offers or answers batches
    old, new = (primary, backup) if older == "primary" else (backup, primary)
    with mgmt(old.url) as m:  # really the old code: it does not know the new engine's counters
        assert "loop-passes" not in m.call("READ", "broker", "broker").body
    with mgmt(new.url) as m:
        assert "loop-passes" in m.call("READ", "broker", "broker").body
    primary.kill()
    c.promote(1, "--force")
    c.wait_state(1, "active")
    assert drain(backup.url, "up") == list(range(1, 2001))


@pytest.mark.parametrize("how", ["truncate", "oversize", "zero", "twice", "version", "junk"])
def test_a_damaged_batch_is_refused_whole_and_nothing_is_lost_or_doubled(
    cluster: Make, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    monkeypatch.setenv("PYTHONPATH", str(ROOT))  # the primary imports tests.support.corrupt_plugin
    c = cluster(2, "--plugin", "tests.support.corrupt_plugin:install")
    c.start_with_primary(0)
    with mgmt(c[0].url) as m:
        m.call("CREATE", "queue", "dmg", {})
    send(c[0].url, "dmg", list(range(1, 101)))
    with mgmt(c[0].url) as m:
        m.call("ARM", CORRUPT, None, {"how": how})
    acked = c[0].workdir / "dmg-acked.txt"
    assert spawn("send", [c[0].url], "dmg", acked, "--count", "100", "--first", "101").wait(60) == 0
    assert sorted(numbers(acked)) == list(range(101, 201))

    def refused() -> list[dict[str, object]]:
        return [e for e in c[1].events() if e["event"] == "ha.replication.error" and e.get("queue") == "dmg"]

    errors = wait_for(refused, 20, what="the backup to refuse the damaged batch")
    assert len(errors) == 1, errors
    # The backup attached again and caught up: the same positions and bodies as the primary, each once.
    want = c.queue_entries(0, "dmg")
    assert [b for _, b in want] == list(range(1, 201))
    wait_for(lambda: c.queue_entries(1, "dmg") == want, 20, what="the backup to hold exactly the primary's queue")
    c[0].kill()
    c.promote(1, "--force")
    c.wait_state(1, "active")
    assert drain(c[1].url, "dmg") == list(range(1, 201))


def test_a_ten_megabyte_message_replicates_and_survives_failover(cluster: Make) -> None:
    c = cluster(2)
    c.start_with_primary(0)
    with mgmt(c[0].url) as m:
        m.call("CREATE", "queue", "big", {})
    body = b"x" * (10 * 1024 * 1024 - 1024)
    send(c[0].url, "big", [body, "after"])
    c[0].kill()
    c.promote(1, "--force")
    c.wait_state(1, "active")
    got = drain(c[1].url, "big", timeout=5)
    assert len(got) == 2 and got[0] == body and got[1] == "after"
