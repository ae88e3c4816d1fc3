"""Many connections and links at once: the event loop serves each, whatever the others do."""

from __future__ import annotations

import os
import resource
import socket
import time
from pathlib import Path
from typing import Any

import pytest
from proton import Message
from proton.handlers import MessagingHandler
from proton.reactor import Container

from tests.support.procs import BrokerProcess


class ManyLinks(MessagingHandler):  # type: ignore[misc]
    """`conns` connections, each with `pairs` queues: a sender and a receiver per queue (2 * pairs links each).
    Every sender sends `per_link` messages; done when every receiver got its own queue's messages in order."""

    def __init__(self, url: str, conns: int, pairs: int, per_link: int, deadline: float) -> None:
        super().__init__(prefetch=50)
        self.url, self.conns, self.pairs, self.per_link = url, conns, pairs, per_link
        self.deadline = deadline
        self.received: dict[str, list[int]] = {}
        self.sent: dict[Any, int] = {}
        self.links_open = 0
        self.error: str | None = None
        self.connections: list[Any] = []

    def on_start(self, event: Any) -> None:
        self.container = event.container
        for c in range(self.conns):
            conn = event.container.connect(self.url, reconnect=False)
            self.connections.append(conn)
            for p in range(self.pairs):
                q = f"scale-{c}-{p}"
                self.received[q] = []
                s = event.container.create_sender(conn, q)
                self.sent[s] = 0
                event.container.create_receiver(conn, q)
        self.timer = event.container.schedule(max(self.deadline - time.monotonic(), 0.1), self)

    def on_timer_task(self, event: Any) -> None:
        self.error = self.error or "deadline passed"
        self._stop()

    def on_link_opened(self, event: Any) -> None:
        self.links_open += 1

    def on_sendable(self, event: Any) -> None:
        s = event.sender
        while s.credit and self.sent[s] < self.per_link:
            self.sent[s] += 1
            s.send(Message(body=self.sent[s]))

    def on_message(self, event: Any) -> None:
        self.received[event.receiver.source.address].append(event.message.body)
        if all(len(v) == self.per_link for v in self.received.values()):
            self._stop()

    def on_link_error(self, event: Any) -> None:
        self.error = f"link error: {event.link.remote_condition}"
        self._stop()

    def on_transport_error(self, event: Any) -> None:
        self.error = f"transport error: {event.transport.condition}"
        self._stop()

    def _stop(self) -> None:
        self.timer.cancel()
        for c in self.connections:
            c.close()


def test_a_thousand_links_on_a_hundred_connections_all_flow(brokers: Any) -> None:
    b: BrokerProcess = brokers("--auto-create-queues")
    h = ManyLinks(b.url, conns=100, pairs=5, per_link=20, deadline=time.monotonic() + 120)
    Container(h).run()
    assert h.error is None, h.error
    assert h.links_open == 1000
    assert all(v == list(range(1, 21)) for v in h.received.values()), "every queue got its messages, in order"
    assert b.alive
    opened = [e for e in b.events() if e["event"] == "connection.opened"]
    assert len(opened) == 100


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_the_start_takes_the_hard_limit_of_open_files(brokers: Any) -> None:
    """A login shell or systemd gives 1024 open files (soft): a broker would refuse its 1000th client."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))  # the broker inherits it
    try:
        b = brokers()
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    started = next(e for e in b.events() if e["event"] == "broker.started")
    assert started["max_open_files"] == (hard if hard != resource.RLIM_INFINITY else 1 << 20)


def test_out_of_file_descriptors_the_listener_rests_and_accepts_again(brokers: Any) -> None:
    """Out of descriptors, a listening socket stays readable: accepting at every pass was a busy loop logging an
    error each time. It rests (logged once), the broker serves its connections, and it accepts again once
    descriptors are free."""
    from tests.broker.helpers import Sentinel
    from tests.support.amqp import mgmt

    b = brokers()
    assert b.proc is not None
    pid = b.proc.pid
    sentinel = Sentinel(b.url, "kept")
    hard = resource.prlimit(pid, resource.RLIMIT_NOFILE)[1]
    resource.prlimit(pid, resource.RLIMIT_NOFILE, (len(os.listdir(f"/proc/{pid}/fd")) + 5, hard))
    peers = []
    try:
        for _ in range(20):  # 5 are taken; the others wait in the listen backlog
            s = socket.create_connection(("127.0.0.1", b.port or 0), timeout=5)
            s.sendall(b"AMQP\x00\x01\x00\x00")
            peers.append(s)
        wait_for_event = time.monotonic() + 10
        while not [e for e in b.events() if e["event"] == "connection.accept_failed"]:
            assert time.monotonic() < wait_for_event, "no connection.accept_failed"
            time.sleep(0.05)
        before = _cpu_seconds(pid)
        time.sleep(2.0)
        assert _cpu_seconds(pid) - before < 0.5  # a busy loop takes the whole 2 s
        failed = [e for e in b.events() if e["event"] == "connection.accept_failed"]
        assert len(failed) == 1 and "Too many open files" in failed[0]["description"], failed
    finally:
        for s in peers:
            s.close()
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (hard, hard))
    with mgmt(b.url) as m:  # accepted again (within the 2 s a rest lasts at most)
        assert m.call("READ", "queue", "kept").body["depth"] == len(sentinel.bodies)
    sentinel.check()
    resumed = [e for e in b.events() if e["event"] == "connection.accept_resumed"]
    assert len(resumed) == 1 and resumed[0]["failures"] >= 1


def test_max_connections_refuses_one_client_more_but_never_a_tool_and_a_closed_one_makes_room(brokers: Any) -> None:
    """A client that leaks connections would take descriptors until no one gets in (the listener rests). With
    --max-connections the client one over the bound is refused at its open, the connections held keep working, an
    operator's tool still gets in, and a client that closes makes room for the next."""
    from proton.utils import BlockingConnection, ConnectionClosed

    from tests.support.amqp import mgmt, receive, send

    b = brokers("--max-connections", "3", "--auto-create-queues")
    held = [BlockingConnection(b.url, timeout=10) for _ in range(3)]
    try:
        with pytest.raises(ConnectionClosed) as e:
            BlockingConnection(b.url, timeout=10)
        assert "amqp:resource-limit-exceeded" in str(e.value)
        assert "3 client connections are open, the broker's limit (--max-connections 3)" in str(e.value)
        held[0].create_sender("kept").send(Message(body="on a held connection"))
        with mgmt(b.url) as m:  # an operator's tool is not counted
            assert m.call("READ", "queue", "kept").body["depth"] == 1
        held.pop().close()
        send(b.url, "kept", ["from a new client"])  # room again (the broker saw the close before this open)
        assert receive(b.url, "kept", 2) == ["on a held connection", "from a new client"]
    finally:
        for c in held:
            c.close()
    refused = [e for e in b.events() if e["event"] == "connection.refused"]
    assert [e["condition"] for e in refused] == ["amqp:resource-limit-exceeded"], refused


def test_max_connections_per_user_keeps_one_users_leak_from_the_others(brokers: Any, tmp_path: Path) -> None:
    """--max-connections-per-user (Qpid's max-connections-per-user): a user's client connections over the bound are
    refused at their open; other users' clients and operators' tools still get in; a close makes room."""
    from proton.utils import BlockingConnection, ConnectionClosed

    from broker.client import ManagementClient

    (tmp_path / "users.toml").write_text('[users.ops]\npassword = "o"\nadmin = true\n\n'
                                         '[users.bob]\npassword = "b"\n\n[users.carol]\npassword = "c"\n')

    def login(user: str) -> BlockingConnection:
        return BlockingConnection(b.url, timeout=10, reconnect=False, user=user, password=user[0],
                                  sasl_enabled=True, allowed_mechs="PLAIN", allow_insecure_mechs=True)

    b = brokers("--users-file", str(tmp_path / "users.toml"), "--max-connections-per-user", "2",
                "--auto-create-queues")
    held = [login("bob"), login("bob")]
    try:
        with pytest.raises(ConnectionClosed) as e:
            login("bob")
        assert "amqp:resource-limit-exceeded" in str(e.value)
        assert ("user 'bob' has 2 client connections open, the broker's limit per user "
                "(--max-connections-per-user 2)") in str(e.value)
        held.append(login("carol"))  # another user's clients are not kept out
        held[-1].create_sender("q").send(Message(body="from carol"))
        with ManagementClient(b.url, user="ops", password="o") as m:  # nor an operator's tool
            assert m.call("READ", "queue", "q").body["depth"] == 1
        held.pop(0).close()
        held.append(login("bob"))  # room again for bob
    finally:
        for c in held:
            c.close()
    refused = [e for e in b.events() if e["event"] == "connection.refused"]
    assert len(refused) == 1 and "user 'bob'" in refused[0]["description"], refused
