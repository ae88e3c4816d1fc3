"""Replication with journals: a backup restarted with its journal catches up only what it lacks; a backup
acknowledges only what its journal holds."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.amqp import drain, mgmt
from tests.support.bulk import fill, number_of, take
from tests.support.cluster import Cluster
from tests.support.procs import wait_for

Make = Callable[..., Cluster]
ROOT = Path(__file__).resolve().parents[2]


def catchups(c: Cluster, backup: str) -> list[int]:
    """Messages the primary planned to send `backup` at each attach of its browser of queue `d`."""
    return [e["messages"] for e in c[0].events()
            if e["event"] == "ha.catchup.start" and e["backup"] == backup and e["queue"] == "d"]


def test_a_backup_restarted_with_its_journal_catches_up_only_what_it_lacks(cluster: Make) -> None:
    c = cluster(2)
    c.start_with_primary(0)
    with mgmt(c[0].url) as m:
        m.call("CREATE", "queue", "d", {"arguments": {"durable": True}})
    fill(c[0].url, "d", 3000, durable=True)
    c[1].kill()
    fill(c[0].url, "d", 200, start=3001, durable=True)  # while the backup is down
    c[1].start()
    c.wait_state(1, "ready")
    assert catchups(c, "b2")[-1] == 200  # the 3000 it journaled were not sent again
    assert c.queue_bodies(1, "d") == list(range(1, 3201))
    c[0].kill()
    c.promote(1)
    c.wait_state(1, "active")
    assert drain(c[1].url, "d") == list(range(1, 3201))


def test_the_backups_journal_holds_every_confirmed_message(cluster: Make) -> None:
    """Every message a client saw confirmed is in the backup's journal, not only in its memory: kill the primary
    and the backup right after the confirmations, restart only the backup: it has them all, and knows it was
    ready in the newest epoch. (That it acknowledges only after its fdatasync is tested in
    tests/unit/test_store_sync.py: a SIGKILL cannot lose what is in the page cache.)"""
    c = cluster(2)
    c.start_with_primary(0)
    with mgmt(c[0].url) as m:
        m.call("CREATE", "queue", "d", {"arguments": {"durable": True}})
    fill(c[0].url, "d", 2000, durable=True)  # returns once every message was confirmed
    c[1].kill()
    c[0].kill()
    c[1].start()
    st = wait_for(lambda: Cluster.try_status(c[1]), 20, what="the backup to answer")
    assert st["recovered"]["ready_epoch"] == st["epoch"] >= 1  # it was ready in the newest epoch
    c.promote(1, "--force")
    c.wait_state(1, "active")
    assert drain(c[1].url, "d") == list(range(1, 2001))


def test_backups_catch_up_a_queue_paged_to_disk_and_a_failover_delivers_it_all_in_order(cluster: Make) -> None:
    """Flow to disk in a cluster: the primary keeps most of queue d only in its journal (--max-memory); a backup
    restarted with its journal and a brand-new one both catch up from it (paged messages are read back for them),
    stay under their own bound, and the new one, promoted, delivers every message in order."""
    c = cluster(3, "--max-memory", "1M")
    c.start(0, 1)
    c.promote(0)
    c.wait_state(0, "active")
    c.wait_state(1, "ready")
    with mgmt(c[0].url) as m:
        m.call("CREATE", "queue", "d", {"arguments": {"durable": True}})
    fill(c[0].url, "d", 2500, durable=True, pad=1000)  # about 2.5 MiB
    c[1].kill()
    fill(c[0].url, "d", 1500, start=2501, durable=True, pad=1000)
    c[1].start()
    c.start(2)  # brand new: everything
    c.wait_state(1, "ready", timeout=60)
    c.wait_state(2, "ready", timeout=60)
    assert catchups(c, "b2")[-1] == 1500
    for b in c.brokers:
        with mgmt(b.url) as m:
            attrs = m.call("READ", "broker", "").body
        assert attrs["memory"]["used"] <= 1 << 20 and attrs["journal"]["paged"] > 2000, (b.name, attrs)
    c[0].kill()
    c.promote(2)
    c.wait_state(2, "active")
    assert [number_of(x) for x in take(c[2].url, "d", 4000)] == list(range(1, 4001))


def test_a_backup_is_not_made_ready_past_paged_messages_its_primary_cannot_read(
        cluster: Make, monkeypatch: pytest.MonkeyPatch) -> None:
    """The primary's reads of paged messages fail (an I/O error): a new backup's catch-up stops there (its link is
    closed with the error and it tries again), it is not made ready without them, and nothing leaves the queue;
    once the disk reads again it catches up and, promoted, delivers every message in order."""
    monkeypatch.setenv("PYTHONPATH", str(ROOT))  # the broker processes import tests.support.journal_plugin
    c = cluster(2, "--max-memory", "1M", "--plugin", "tests.support.journal_plugin:install")
    c.start_with_primary(0)
    with mgmt(c[0].url) as m:
        m.call("CREATE", "queue", "d", {"arguments": {"durable": True}})
    c[1].kill()
    fill(c[0].url, "d", 2500, durable=True, pad=1000)  # about 2.5 MiB: most of it paged
    with mgmt(c[0].url) as m:
        assert m.call("READ", "broker", "").body["journal"]["paged"] > 1500
        m.call("BREAK-READS", "test-journal", "")
    c[1].start()
    wait_for(lambda: any(e["event"] == "journal.read_error" for e in c[0].events()), 30,
             what="the primary to fail a read of paged messages")
    time.sleep(3)
    st = Cluster.try_status(c[1])
    assert st is not None and st["state"] != "ready", st
    with mgmt(c[0].url) as m:
        assert m.call("READ", "queue", "d").body["depth"] == 2500
        m.call("MEND-READS", "test-journal", "")
    c.wait_state(1, "ready", timeout=60)
    c[0].kill()
    c.promote(1)
    c.wait_state(1, "active")
    assert [number_of(x) for x in take(c[1].url, "d", 2500)] == list(range(1, 2501))
