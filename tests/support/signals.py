"""SIGTERM as Ctrl-C, for pytest runs (conftest.py) and the chaos run's command line (tests/chaos/__main__.py): the
stop raises KeyboardInterrupt, so fixtures and `finally` blocks still stop the brokers, ZooKeeper, namespaces and
iptables rules they started; SIGTERM's default would end the process and leave them running."""

from __future__ import annotations

import signal
from types import FrameType


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def interrupt_on_sigterm() -> None:
    signal.signal(signal.SIGTERM, _interrupt)
