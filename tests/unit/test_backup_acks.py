"""A backup's acknowledgements go to the primary by queue name: those of a queue's replication link must never
reach the browser of the link after it (the queue deleted and declared again numbers from 1 again: an old
acknowledgement of position 3 would release the new queue's message 3 before the backup has it). The real Backup's
acknowledgement bookkeeping, with the wire and the journal's sync stood in for."""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
from proton import Connection, Message, Transport

from ha import backup as backup_module
from ha.backup import Backup
from ha.core.batch import parse_acks


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    out: list[bytes] = []
    monkeypatch.setattr(backup_module.raw, "send_settled", lambda link, tag, data: out.append(data))
    return out


def backup(syncs: list[Callable[[], None]]) -> Any:
    b: Any = object.__new__(Backup)
    b.server = SimpleNamespace(store=SimpleNamespace(failed=None, low_disk=None, when_synced=syncs.append))
    b.ack_link = SimpleNamespace(credit=10, _impl=None)
    b.connected = True
    b.binary_acks = b.dequeue_acks = True
    b.disk_reports = False
    b.replicators, b.pending_acks, b.pending_dequeues, b.ack_owners = {}, {}, {}, {}
    return b


def test_acknowledgements_of_a_link_replaced_before_they_went_out_are_dropped(sent: list[bytes]) -> None:
    syncs: list[Callable[[], None]] = []
    b = backup(syncs)
    b.replicators = {"q": "old link", "other": "its link"}
    b.acked("q", [1, 2, 3])
    b.dequeue_applied("q", 1, 1)
    b.acked("other", [7])
    b.end_of_pass()  # waits for the journal
    b.replicators["q"] = "new link"  # the queue was deleted and declared again meanwhile
    syncs.pop()()
    assert [parse_acks(d) for d in sent] == [({"other": [(7, 7)]}, {})]


def test_acknowledgements_pending_when_the_link_is_replaced_in_the_pass_are_dropped(sent: list[bytes]) -> None:
    syncs: list[Callable[[], None]] = []
    b = backup(syncs)
    b.replicators = {"q": "old link"}
    b.acked("q", [1, 2, 3])
    b.replicators["q"] = "new link"
    b.acked_range("q", 1, 1)  # the new link's first message
    b.end_of_pass()
    syncs.pop()()
    assert [parse_acks(d) for d in sent] == [({"q": [(1, 1)]}, {})]


def test_acknowledgements_of_the_same_link_go_out(sent: list[bytes]) -> None:
    syncs: list[Callable[[], None]] = []
    b = backup(syncs)
    b.replicators = {"q": "link"}
    b.acked("q", [1, 2])
    b.dequeue_applied("q", 1, 1)
    b.end_of_pass()
    syncs.pop()()
    assert [parse_acks(d) for d in sent] == [({"q": [(1, 2)]}, {"q": [(1, 1)]})]


def _wired() -> tuple[Transport, Any, Any]:
    """A connection with an open session and a sender the peer gave credit (in memory, no socket)."""
    c, t = Connection(), Transport()
    t.bind(c)
    peer_c, peer_t = Connection(), Transport(Transport.SERVER)
    peer_t.bind(peer_c)
    c.open()
    session = c.session()
    session.open()
    acks = session.sender("acks")
    acks.open()

    def pump() -> None:
        for _ in range(10):
            for a, b in ((t, peer_t), (peer_t, t)):
                out = a.peek(1 << 20) or b""
                if out:
                    b.push(out)
                    a.pop(len(out))

    pump()
    peer_c.open()
    peer_c.session_head(0).open()
    link = peer_c.link_head(0)
    link.open()
    link.flow(10)
    pump()
    return t, session, acks


def _first(t: Transport) -> str:
    out = t.peek(1 << 20) or b""
    attach, transfer = out.find(b"\x00\x53\x12"), out.find(b"\x00\x53\x14")
    assert attach >= 0 and transfer >= 0
    return "attach" if attach < transfer else "transfer"


def _queue_an_ack(acks: Any) -> None:
    d = acks.delivery(b"1")
    acks.send(Message(body="acks").encode())
    acks.advance()
    d.settle()


def test_proton_writes_a_turns_attaches_before_its_transfers() -> None:
    """Why the backup encodes its output before it attaches a replication link (`Backup.receiver`)."""
    t, session, acks = _wired()
    _queue_an_ack(acks)
    session.receiver("ha-q-new").open()
    assert _first(t) == "attach"


def test_a_new_replication_link_is_attached_after_the_acknowledgements_queued_before_it() -> None:
    """The old link's acknowledgements went out (sync done) in the turn that attaches the queue's new link: the
    primary must read them before the attach, while no browser of that name takes them."""
    t, session, acks = _wired()
    b: Any = object.__new__(Backup)
    b.session = session
    b.conn = SimpleNamespace(pending_output=t.pending)
    _queue_an_ack(acks)
    b.receiver("$ha.queue:q", "ha-q-q", credit=10)
    assert _first(t) == "transfer"
