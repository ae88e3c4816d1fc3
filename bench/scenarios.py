"""The named targets the bench can run. Add a scenario here (name -> factory)."""

from __future__ import annotations

from collections.abc import Callable

from bench.ours import OursReplicated, OursStandalone
from bench.protonc import ProtonCBroker
from bench.rabbit import RabbitCluster, RabbitTarget
from bench.targets import Target

SCENARIOS: dict[str, Callable[[], Target]] = {
    "ours": OursStandalone,
    # replicated: primary + N backups (clients on the primary)
    "ours-replicated-1": lambda: OursReplicated(1),
    "ours-replicated-2": lambda: OursReplicated(2),
    # the proton-C example broker: the engine-limit baseline
    "proton-c-broker": ProtonCBroker,
    "rabbit-classic": lambda: RabbitTarget("classic"),
    "rabbit-quorum": lambda: RabbitTarget("quorum"),
    # three clustered nodes, one quorum queue with 3 replicas (clients on node 1)
    "rabbit-quorum-3": lambda: RabbitCluster(3, "quorum"),
    # durable store (issue 11): durable queues (journaled under --data-dir) and durable messages in every phase
    "ours-durable": lambda: OursStandalone(durable=True),
    "ours-replicated-1-durable": lambda: OursReplicated(1, durable=True),
    "ours-replicated-2-durable": lambda: OursReplicated(2, durable=True),
    "rabbit-quorum-3-durable": lambda: RabbitCluster(3, "quorum", durable_messages=True),
}
DEFAULT = ["ours", "ours-replicated-1", "ours-replicated-2", "proton-c-broker", "rabbit-classic", "rabbit-quorum-3"]
#: the targets of the durable-store goals (`--preset durable`): the durable variants plus the non-durable reference
DURABLE = ["ours-replicated-1", "ours-replicated-1-durable", "ours-durable", "ours-replicated-2-durable",
           "rabbit-quorum-3-durable"]
BASELINE = "rabbit-classic"
