"""`ha-broker`: the broker with the HA plugin (active when --ha-cluster is given)."""

from __future__ import annotations

from broker.cli import make_command
from broker.config import BrokerConfig, Coordinator
from ha.node import install


def check_ha(cfg: BrokerConfig) -> list[str]:
    """Cross-checks that need HA knowledge: ZooKeeper session vs heartbeat."""
    if cfg.ha_cluster and cfg.ha_coordinator == Coordinator.ZOOKEEPER:
        from ha.coordination.zookeeper import validate_timing  # kazoo: only under ZooKeeper (start time)

        return validate_timing(cfg.zk_session_timeout, cfg.ha_heartbeat)
    return []


def main() -> None:
    make_command([install], [check_ha])()
