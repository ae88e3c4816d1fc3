"""Coordination: who leads the HA cluster and at which epoch (see base.py for the contract).

Backends: `zookeeper.ZooKeeperCoordinator` (kazoo election), `memory.MemoryStore` (in-memory fake for tests).
Without ZooKeeper there is no election here: the operator, Pacemaker's agent or understudy-cluster promotes
through the management request, and every promotion is the HA controller's `Promote` event (ha.core.controller).
Pure rules: `election`.  Persisted epoch: `epoch_store`.
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
