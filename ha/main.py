"""`ha-broker`: the broker with the HA plugin (active when --ha-cluster is given)."""

from __future__ import annotations

from broker.cli import make_command
from ha.node import install


def main() -> None:
    make_command([install])()
