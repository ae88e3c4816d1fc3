"""What the role objects (ha.primary.Primary, ha.backup.Backup) use of their broker's HA node (ha.node.HaNode).

HaNode owns them and imports them; they see it only through `NodeSide`, so no module under ha/ imports its owner
(no import circle: tests/unit/test_ha_imports.py). mypy checks that HaNode satisfies it where it passes itself.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from broker.config import BrokerConfig
    from broker.server import Server
    from ha.coordinated import CoordinatedRole
    from ha.core.controller import Action, Event
    from ha.core.membership import Membership
    from ha.core.states import HaState


class NodeSide(Protocol):
    server: Server
    config: BrokerConfig
    address: str
    membership: Membership
    default_level: str  # the cluster's replication level; a backup takes its primary's
    primary_public_url: str | None  # a backup learns it from its primary

    @property
    def coordinated(self) -> CoordinatedRole | None: ...

    @property
    def epoch(self) -> int: ...

    @property
    def ready_epoch(self) -> int: ...  # the newest epoch it was primary or ready in

    @property
    def state(self) -> HaState: ...

    def handle(self, event: Event) -> list[Action]: ...  # the HA controller's (ha.core.controller)

    def set_membership(self, m: Membership) -> None: ...

    def adopt_epoch(self, epoch: int) -> None: ...

    def recovered(self, waited: float, timed_out: list[str]) -> None: ...

    def demote(self, reason: str) -> None: ...
