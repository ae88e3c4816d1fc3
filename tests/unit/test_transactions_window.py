"""A transaction's messages and the duplicate window (broker.router `follow`): a real Server, no network."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from proton import Message

from broker.config import BrokerConfig
from broker.links import Completion
from broker.server import Server


def test_a_commit_holding_one_message_id_twice_does_not_wait_for_itself(tmp_path: Path) -> None:
    """Two messages with the same id for a windowed queue in one transaction: the window drops the second, whose
    original is the commit itself; following it would leave the commit waiting for good."""
    s = Server(BrokerConfig(port=0, data_dir=tmp_path), "unit")
    s.start()
    q, _ = s.wiring.declare_queue("orders", {"durable": True, "duplicate-window": 10})
    data = bytes(Message(id="order-1", body="x", durable=True).encode())
    settled: list[Completion] = []
    c = Completion(SimpleNamespace(server=SimpleNamespace(to_settle=settled)), None)  # type: ignore[arg-type]
    c.pending = 2  # held by the store and released once, as a commit's is
    for _ in range(2):
        went, dropped = s.router.enqueue_committed("orders", data)
        s.router.follow(c, went, dropped)
    assert q.depth == 1 and c.followers is None
    c.release()
    c.release()
    assert settled == [c]
    assert s.store is not None
    s.store.close()
    s.engine.close()
