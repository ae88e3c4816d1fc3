from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.support.cluster import Cluster
from tests.support.procs import BrokerFactory


@pytest.fixture
def cluster(brokers: BrokerFactory) -> Callable[..., Cluster]:
    """`cluster(3)` -> a Cluster of 3 HA brokers on loopback (not started); extra flags as further args."""

    def make(n: int, *extra: str, heartbeat: float = 1.0) -> Cluster:
        return Cluster(brokers, n, list(extra), heartbeat)

    return make
