"""A consumer's accept on a replicated queue is answered only once every ready backup holds the dequeue, or once
the primary has stopped counting on a backup that lacks it (`Primary._drop_backup`: for a ready one, not before the
journal holds the member list without it). A real Server with its journal on disk and the real `Primary`, on a
stand-in HA node, with a backup registered by hand (no wire)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import ha.replicating
from broker.config import BrokerConfig
from broker.queue import DequeueReason
from broker.server import Server
from ha.core.catchup import BackupCatchup
from ha.core.membership import Membership
from ha.core.states import HaState
from ha.primary import Primary
from ha.replicating import RemoteBackup, ReplicatingSender
from tests.support.store import commit


class Token:
    """Stands for a client's completion (a publish) or accept: counts its releases."""

    def __init__(self) -> None:
        self.pending = 1
        self.released = 0

    def release(self) -> None:
        self.released += 1


class Node:
    """What `Primary` needs of `HaNode`: the member list is journaled as the HA standing (appended, synced later)."""

    def __init__(self, server: Server) -> None:
        self.server, self.config = server, server.config
        self.state, self.epoch, self.membership = HaState.ACTIVE, 1, Membership(1, ())
        self.default_level, self.coordinated, self.address = "all", None, "127.0.0.1:1"

    def set_membership(self, m: Membership) -> None:
        self.membership = m
        assert self.server.store is not None
        self.server.store.record_state(self.epoch, "primary", "active", 1, view={"seq": m.seq})

    def recovered(self, *args: Any) -> None:
        pass

    def demote(self, reason: str) -> None:
        pass


def synced(server: Server) -> None:
    commit(server)


@pytest.fixture(params=[HaState.ACTIVE])
def primary(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A primary (`request.param`: active, or recovering with b2 expected back) on a real server and journal."""
    monkeypatch.setattr(ha.replicating, "raw", SimpleNamespace(link_credit=lambda link: 0))  # no wire
    server = Server(BrokerConfig(port=0, data_dir=tmp_path), "p1")
    node = Node(server)
    node.state = request.param
    p = Primary(node, ["b2"] if node.state == HaState.RECOVERING else [], 0)  # type: ignore[arg-type]
    p.install()
    server.start()
    synced(server)
    try:
        yield p
    finally:
        assert server.store is not None
        server.store.close()
        server.engine.close()


def ready_backup_replicating(p: Primary, name: str, queue: str) -> tuple[RemoteBackup, ReplicatingSender]:
    conn = SimpleNamespace(id=name, connection=SimpleNamespace(state=0, _impl=object()), links=set(), kind="ha")
    p.server.connections.conns[conn.connection._impl] = conn  # open, as far as the broker can tell
    b = RemoteBackup(name, f"{name}:1", 1, conn, 0.0, BackupCatchup([]))  # type: ignore[arg-type]
    b.state = HaState.READY
    p.guards.add_backup(name)
    p.backups[name] = b
    p.update_membership()
    link = SimpleNamespace(_impl=object(), is_receiver=False, source=SimpleNamespace(), properties=None,
                           remote_properties={"held": [[1, 3]], "ready_epoch": 1, "batch": 1, "batch-max": 3,
                                              "dequeue-acks": 1, "acks": "batched"})
    sender = p._attach_queue(link, conn, f"$ha.queue:{queue}")  # type: ignore[arg-type]
    assert isinstance(sender, ReplicatingSender)
    return b, sender


@pytest.mark.parametrize("how", ["connection", "link"])
def test_an_accept_waiting_for_a_ready_backup_that_goes_is_answered_only_once_the_list_without_it_is_on_disk(
        primary: Primary, how: str) -> None:
    """`connection`: the broker detaches each link of a closed connection before the HA extension drops the
    backup; the accept was answered by the link's detach, before the member list without the backup was on disk
    (after a power loss both journals still named it ready, and it lacked the dequeue). `link`: its one
    replication link detached while its connection stayed: it was answered at once, the backup kept ready."""
    p, server = primary, primary.server
    assert server.store is not None
    q, _ = server.wiring.declare_queue("orders", {"durable": True})
    entries = [q.enqueue(f"m{i}".encode(), durable=True) for i in range(3)]
    b2, sender = ready_backup_replicating(p, "b2", "orders")
    server.store.end_of_pass()
    p.end_of_pass()
    q.acquire_next()
    q.dequeue(entries[0], DequeueReason.ACCEPTED)
    accept = Token()
    assert p.hold_accept(accept, q)  # type: ignore[arg-type]
    server.store.end_of_pass()
    p.end_of_pass()
    synced(server)
    assert accept.released == 0  # b2 has not acknowledged the dequeue
    if how == "connection":
        del server.connections.conns[b2.conn.connection._impl]
        sender.on_detached()
        p.connection_closed(b2.conn)
    else:
        sender.on_detached()
    assert "b2" not in p.backups
    assert accept.released == 0  # not before the member list without b2 is on disk
    synced(server)
    assert accept.released == 1


def accepted_in_mode_second(p: Primary) -> Token:
    server = p.server
    assert server.store is not None
    q = server.wiring.queues.get("orders") or server.wiring.declare_queue("orders", {"durable": True})[0]
    e = q.enqueue(b"m", durable=True)
    server.store.end_of_pass()
    p.end_of_pass()
    synced(server)
    q.acquire_next()
    q.dequeue(e, DequeueReason.ACCEPTED)
    accept = Token()
    assert p.hold_accept(accept, q)  # type: ignore[arg-type]
    p.end_of_pass()
    return accept


def test_with_no_backup_an_accept_is_answered_once_the_journal_holds_the_dequeue(primary: Primary) -> None:
    """docs/replication.md: the primary's own journal holds the dequeue before the accept is answered; with no
    backup to wait for it was answered at once, and a crash before the pass's sync brought it back."""
    accept = accepted_in_mode_second(primary)
    assert accept.released == 0
    synced(primary.server)
    assert accept.released == 1


@pytest.mark.parametrize("primary", [HaState.RECOVERING], indirect=True)
def test_a_recovering_primary_answers_accepts_only_once_the_backups_ready_before_are_back(primary: Primary) -> None:
    """A primary just promoted holds publishes until the backups that were ready before the failover are back: one
    of them may hold a message, and be promoted if this one dies. It held no accepts: a message accepted on it
    before b2 was back was delivered again by b2, promoted next."""
    p = primary
    accept = accepted_in_mode_second(p)
    synced(p.server)
    assert accept.released == 0  # on disk here, but b2 (ready before the failover) is not back
    ready_backup_replicating(p, "b2", "orders")
    p._check_recovered()
    assert p.recovery_held is None and accept.released == 1
