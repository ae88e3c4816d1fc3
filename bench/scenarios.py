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
    # replicated: primary + N backups (clients on the primary)
    "ours-replicated-1": lambda: OursReplicated(1),
    "ours-replicated-2": lambda: OursReplicated(2),
}
DEFAULT = ["ours", "ours-replicated-1", "ours-replicated-2", "rabbit-classic", "rabbit-quorum"]
BASELINE = "rabbit-classic"
