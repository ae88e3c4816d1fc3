"""Where the ZooKeeper backend keeps things, and how it reads them back (one snapshot per read).

Layout under the cluster path (``--zk-path``, e.g. ``/understudy/CLUSTER``)::

    epoch               persistent  the cluster epoch, decimal; changed only in the transaction that elects a leader
    leader              ephemeral   {"name", "address", "epoch"} of the current leader (owned by its session)
    members/<name>      ephemeral   a MemberRecord as JSON, one per running broker
    candidates/<name>   ephemeral   empty; present while the broker contends
    ready               persistent  {"epoch", "leader", "names"}: backups the latest leader counted as ready
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError
from kazoo.protocol.states import WatchedEvent

from ha.coordination.base import CoordinatorError, MemberRecord

Watch = Callable[[WatchedEvent], None] | None


@dataclass(frozen=True, slots=True)
class Layout:
    root: str

    @property
    def epoch(self) -> str:
        return f"{self.root}/epoch"

    @property
    def leader(self) -> str:
        return f"{self.root}/leader"

    @property
    def members(self) -> str:
        return f"{self.root}/members"

    @property
    def candidates(self) -> str:
        return f"{self.root}/candidates"

    @property
    def ready(self) -> str:
        return f"{self.root}/ready"

    def member(self, name: str) -> str:
        return f"{self.members}/{name}"

    def candidate(self, name: str) -> str:
        return f"{self.candidates}/{name}"

    @property
    def cluster_name(self) -> str:
        return self.root.rstrip("/").rsplit("/", 1)[-1]


class TimedOps:
    """The kazoo calls we make, each giving up after ``timeout`` seconds.

    kazoo's synchronous calls queue a request made while reconnecting and wait for it without limit; the
    coordinator's worker must never hang like that, or it could not report SUSPENDED.  A call that times out
    raises `KazooTimeoutError`.
    """

    def __init__(self, client: KazooClient, timeout: float) -> None:
        self.client = client
        self.timeout = timeout

    def exists(self, path: str, watch: Watch = None) -> Any:
        return self.client.exists_async(path, watch=watch).get(timeout=self.timeout)

    def get(self, path: str, watch: Watch = None) -> tuple[bytes, Any]:
        data, stat = self.client.get_async(path, watch=watch).get(timeout=self.timeout)
        return data, stat

    def get_children(self, path: str, watch: Watch = None) -> list[str]:
        return list(self.client.get_children_async(path, watch=watch).get(timeout=self.timeout))

    def create(self, path: str, value: bytes = b"", ephemeral: bool = False) -> None:
        self.client.create_async(path, value, ephemeral=ephemeral).get(timeout=self.timeout)

    def set(self, path: str, value: bytes) -> None:
        self.client.set_async(path, value).get(timeout=self.timeout)

    def delete(self, path: str) -> None:
        self.client.delete_async(path).get(timeout=self.timeout)

    def ensure_path(self, path: str) -> None:
        self.client.ensure_path_async(path).get(timeout=self.timeout)

    def commit(self, transaction: Any) -> list[Any]:
        return list(transaction.commit_async().get(timeout=self.timeout))


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything stored under the cluster path, as read in one pass."""

    leader: str | None
    leader_owner: int | None  # session id owning the leader znode
    epoch: int
    epoch_version: int  # -1 when the epoch znode does not exist yet
    members: tuple[MemberRecord, ...]
    candidates: tuple[str, ...]
    ready_set: frozenset[str] | None
    ready_leader: str | None = None  # the leader that published the ready set
    ready_epoch: int = 0  # the epoch it published it in


def leader_data(name: str, address: str, epoch: int) -> bytes:
    return json.dumps({"name": name, "address": address, "epoch": epoch}, sort_keys=True).encode()


def ready_data(epoch: int, leader: str, names: frozenset[str]) -> bytes:
    return json.dumps({"epoch": epoch, "leader": leader, "names": sorted(names)}, sort_keys=True).encode()


def _json(data: bytes, what: str) -> Any:
    try:
        return json.loads(data.decode())
    except (ValueError, UnicodeDecodeError) as exc:
        raise CoordinatorError(f"unreadable {what} znode: {exc}") from exc


def _parse_epoch(data: bytes) -> int:
    text = data.decode(errors="replace").strip()
    if not text:
        return 0
    try:
        return int(text)
    except ValueError as exc:
        raise CoordinatorError(f"unreadable epoch znode: {text!r}") from exc


def read_snapshot(client: TimedOps, layout: Layout, watch: Watch = None) -> Snapshot:
    """Read the whole cluster path; ``watch`` (if given) is set on every znode read, to learn of any change."""
    epoch, epoch_version = 0, -1
    if client.exists(layout.epoch, watch=watch) is not None:
        try:
            data, stat = client.get(layout.epoch, watch=watch)
            epoch, epoch_version = _parse_epoch(data), stat.version
        except NoNodeError:
            pass
    leader: str | None = None
    leader_owner: int | None = None
    if client.exists(layout.leader, watch=watch) is not None:
        try:
            data, stat = client.get(layout.leader, watch=watch)
            leader, leader_owner = str(_json(data, "leader")["name"]), stat.ephemeralOwner
        except NoNodeError:
            pass
    members = []
    for name in _children(client, layout.members, watch):
        try:
            data, _ = client.get(layout.member(name), watch=watch)
        except NoNodeError:
            continue
        members.append(MemberRecord.from_json(data))
    candidates = tuple(sorted(_children(client, layout.candidates, watch)))
    ready_set: frozenset[str] | None = None
    ready_leader: str | None = None
    ready_epoch = 0
    if client.exists(layout.ready, watch=watch) is not None:
        try:
            data, _ = client.get(layout.ready, watch=watch)
            if data:
                doc = _json(data, "ready")
                ready_set = frozenset(str(n) for n in doc["names"])
                ready_leader = str(doc["leader"]) if doc.get("leader") else None
                ready_epoch = int(doc.get("epoch", 0) or 0)
        except NoNodeError:
            pass
    return Snapshot(
        leader=leader,
        leader_owner=leader_owner,
        epoch=epoch,
        epoch_version=epoch_version,
        members=tuple(sorted(members, key=lambda m: m.name)),
        candidates=candidates,
        ready_set=ready_set,
        ready_leader=ready_leader,
        ready_epoch=ready_epoch,
    )


def _children(client: TimedOps, path: str, watch: Watch) -> list[str]:
    try:
        return client.get_children(path, watch=watch)
    except NoNodeError:
        return []
