"""Scenarios: a `Target` is a set of broker processes the bench starts, loads and stops.

A target says how to start and stop its brokers, where clients connect, how a queue is named on the wire, how to
create/delete a queue, and which processes' CPU counts as "broker CPU" (grouped by role, e.g. primary/backup-1).
Every phase of the benchmark runs against each selected target in turn, so adding a scenario is adding a class here
and a line in `scenarios.SCENARIOS` (see `ours.OursReplicated` for the HA hook).
"""

from __future__ import annotations

import abc
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class ClientSpec:
    """Everything a client process needs to reach a target (picklable: sent to worker processes)."""

    url: str  # host:port
    user: str | None = None
    password: str | None = None

    def connect_kwargs(self) -> dict[str, Any]:
        kw: dict[str, Any] = {"reconnect": False}
        if self.user is not None:
            kw.update(user=self.user, password=self.password, allowed_mechs="PLAIN", allow_insecure_mechs=True,
                      sasl_enabled=True)
        return kw


@dataclass
class TargetInfo:
    """Descriptive facts recorded in the results (versions, settings)."""

    kind: str
    details: dict[str, Any] = field(default_factory=dict)


class Target(abc.ABC):
    """One broker set under test. Lifecycle: start(workdir) -> [create_queue, phases, delete_queue]* -> stop()."""

    name: str = "target"
    #: the target the others are compared with in the ratio table is marked with `baseline = True`
    baseline: bool = False
    #: every phase sends durable messages (AMQP header durable=true) to this target, whatever `--durable` says
    durable_messages: bool = False
    #: its brokers are ours: their CPU is also reported by part (event loop, other threads, sync process)
    broker_parts: bool = False

    @abc.abstractmethod
    def start(self, workdir: Path) -> None: ...

    @abc.abstractmethod
    def stop(self) -> None:
        """Stop every process this target started (idempotent, also after a failed start)."""

    @abc.abstractmethod
    def client(self) -> ClientSpec: ...

    @abc.abstractmethod
    def address(self, queue: str) -> str:
        """The AMQP 1.0 address (target and source) of an existing queue."""

    @abc.abstractmethod
    def create_queue(self, queue: str) -> None: ...

    @abc.abstractmethod
    def delete_queue(self, queue: str, timeout: float = 5.0) -> None: ...

    @abc.abstractmethod
    def pid_groups(self) -> dict[str, list[int]]:
        """Processes whose CPU is broker CPU, by role; re-evaluated at each sample (process trees may change)."""

    def info(self) -> TargetInfo:
        return TargetInfo(kind=type(self).__name__)

    def __enter__(self) -> Target:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])

