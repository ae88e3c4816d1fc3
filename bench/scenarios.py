"""The named targets the bench can run. Add a scenario here (name -> factory)."""

from __future__ import annotations

from collections.abc import Callable

from bench.ours import OursReplicated, OursStandalone
from bench.rabbit import RabbitTarget
from bench.targets import Target

SCENARIOS: dict[str, Callable[[], Target]] = {
    "ours": OursStandalone,
    "rabbit-classic": lambda: RabbitTarget("classic"),
    "rabbit-quorum": lambda: RabbitTarget("quorum"),
    # HA hook: available once `ha-broker --ha-cluster` lands; see OursReplicated.
    "ours-replicated-1": lambda: OursReplicated(1),
    "ours-replicated-2": lambda: OursReplicated(2),
}
DEFAULT = ["ours", "rabbit-classic", "rabbit-quorum"]
BASELINE = "rabbit-classic"
