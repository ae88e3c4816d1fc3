"""`broker.connections.guarded`: a bug in a connection event handler is logged and closes what it concerns, with
amqp:internal-error; a connection whose open was not answered yet is answered first (its client would otherwise
wait out its own timeout on an open that never comes). Fakes for proton's endpoints: the wrapper is pure logic."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from proton import Endpoint

from broker.connections import guarded


@dataclass
class FakeConnection:
    state: int
    calls: list[str] = field(default_factory=list)
    condition: Any = None

    def open(self) -> None:
        self.calls.append("open")

    def close(self) -> None:
        self.calls.append("close")


@dataclass
class FakeEvent:
    connection: FakeConnection
    link: Any = None


class Handlers:
    @guarded
    def on_connection_remote_open(self, event: Any) -> None:
        raise RuntimeError("a bug")


def test_an_unanswered_open_is_answered_then_closed_with_the_error() -> None:
    conn = FakeConnection(Endpoint.LOCAL_UNINIT | Endpoint.REMOTE_ACTIVE)
    Handlers().on_connection_remote_open(FakeEvent(conn))
    assert conn.calls == ["open", "close"]
    assert (conn.condition.name, conn.condition.description) == ("amqp:internal-error", "RuntimeError: a bug")


def test_an_open_connection_is_closed_and_a_closed_one_left_alone() -> None:
    active = FakeConnection(Endpoint.LOCAL_ACTIVE | Endpoint.REMOTE_ACTIVE)
    Handlers().on_connection_remote_open(FakeEvent(active))
    assert active.calls == ["close"]
    closed = FakeConnection(Endpoint.LOCAL_CLOSED | Endpoint.REMOTE_ACTIVE)
    Handlers().on_connection_remote_open(FakeEvent(closed))
    assert closed.calls == [] and closed.condition is None
