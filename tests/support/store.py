"""A real Server with its journal on disk, for unit tests that turn the event loop by hand."""

from __future__ import annotations

import time
from pathlib import Path

from broker.config import BrokerConfig
from broker.server import Server


def journaled(data_dir: Path, max_memory: int = 0, name: str = "unit") -> Server:
    """A started broker journaling under `data_dir` (with `--max-memory` when given)."""
    s = Server(BrokerConfig(port=0, data_dir=data_dir, max_memory=max_memory), name)
    assert s.store is not None
    s.start()
    return s


def wait_synced(s: Server) -> None:
    """Let every sync in flight report back (within 5 s)."""
    store = s.store
    assert store is not None
    deadline = time.monotonic() + 5
    while store.tickets and time.monotonic() < deadline:
        s.engine.run_once(0.02)
    assert not store.tickets


def commit(s: Server) -> None:
    """End the pass (its journal write) and wait for its sync."""
    assert s.store is not None
    s.store.end_of_pass()
    wait_synced(s)


def close(s: Server) -> None:
    assert s.store is not None
    s.store.close()
    s.engine.close()
