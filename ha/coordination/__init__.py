"""Coordination: who leads the HA cluster and at which epoch (see base.py for the contract).

Backends: `zookeeper.ZooKeeperCoordinator` (kazoo election), `external.ExternalCoordinator` (Pacemaker/operator),
`memory.MemoryStore` (in-memory fake for tests).  Pure rules: `election`.  Persisted epoch: `epoch_store`.
"""

from ha.coordination.base import (
    Callbacks,
    ClusterView,
    Coordinator,
    CoordinatorError,
    Dispatch,
    MemberRecord,
    Session,
    WaitReason,
)

__all__ = [
    "Callbacks",
    "ClusterView",
    "Coordinator",
    "CoordinatorError",
    "Dispatch",
    "MemberRecord",
    "Session",
    "WaitReason",
]
