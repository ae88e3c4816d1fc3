"""The coordinator abstraction: who leads the cluster, at which epoch, and who the members are.

A `Coordinator` is the broker's only window on the coordination store (ZooKeeper, or an external manager such as
Pacemaker or an operator).  It offers a small set of operations and reports everything it knows as one immutable
snapshot, `ClusterView`.  The decision *what to do* about a view lives in `ha.coordination.election` (pure).

Operations (all non-blocking; they return at once and the backend does its I/O on its own thread):

- ``start(callbacks)``: connect and begin reporting.  Callbacks arrive only between ``start`` and ``stop``.
- ``stop()``: resign leadership (if held), remove this member, disconnect.  No callback runs after it returns.
- ``publish(record)``: my own `MemberRecord` (role, state, epoch = highest epoch seen, position), for
  ``ha-status`` and for ranking candidates.  Publish again whenever one of those fields changes.
- ``contend(force=False)``: become a candidate.  The backend attempts leadership whenever the cluster is
  leaderless and `election.should_attempt` says this member is the best eligible candidate.  ``force=True``
  (operator ``promote --force``) skips ranking and the ready-set rule.  Idempotent.
- ``withdraw()``: stop being a candidate; if this member leads, release leadership (reported by ``on_lost``).
- ``publish_ready_set(names, on_published)``: (leader only) the backups the primary currently counts as ready.
  Only those may win the next election.  ``on_published`` runs (through ``dispatch``) once the store holds it;
  the primary must not settle without a dropped backup before then.
- ``view()``: the latest `ClusterView` (thread-safe, cheap).
- ``holds_lease()``: True while this member leads *and* its leadership is certain right now.  This is the fence:
  check it on the settling path, from any thread.  It turns False by itself when the lease runs out, even before
  any callback is delivered (e.g. a process waking from SIGSTOP).

Callbacks (`Callbacks`), always delivered by calling ``dispatch(fn)`` with a no-argument function, so the broker
can marshal them onto its reactor thread (e.g. with proton's ``EventInjector``); the default dispatch calls
``fn`` directly on the backend's thread.  The order of ``dispatch`` calls is the order of events.

- ``on_elected(epoch)``: this member now leads with the new ``epoch`` (already committed in the store).
- ``on_suspended()``: the connection to the store is gone; the session may still live.  A primary stops
  settling (``holds_lease()`` is already False).  Delivered to every member.
- ``on_resumed()``: the connection is back with the same session; leadership, if held, is intact.
- ``on_lost()``: leadership is gone (session expired, leader record removed, ``withdraw()``).  Only delivered
  to a member that led.  A primary demotes at once.
- ``on_view(view)``: the view changed.
"""

from __future__ import annotations

import json
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any

Dispatch = Callable[[Callable[[], None]], None]


def call_now(fn: Callable[[], None]) -> None:
    """The default `Dispatch`: run the callback on the caller's thread."""
    fn()


class CoordinatorError(Exception):
    """The coordination store could not be reached or holds something we cannot read."""


class Session(StrEnum):
    """Our session with the coordination store, as the backend last saw it."""

    CONNECTED = "connected"
    SUSPENDED = "suspended"  # connection lost; session may still be alive
    LOST = "lost"  # session expired; ephemeral records gone


class WaitReason(StrEnum):
    """Why a leaderless cluster has no leader yet (shown by ``ha-status``)."""

    ELECTION_PENDING = "election_pending"  # eligible candidates exist; one is about to win
    NO_READY_MEMBER = "no_ready_member"  # nobody may contend: no ready backup (the cluster waits)
    NO_CANDIDATE_IN_READY_SET = "no_candidate_in_ready_set"  # candidates exist, none was ready under the last leader


@dataclass(frozen=True, slots=True)
class MemberRecord:
    """What one broker publishes about itself.  ``epoch`` is the highest epoch it has seen."""

    name: str
    address: str
    role: str  # "primary" | "backup" | "standalone"
    state: str  # "joining" | "catchup" | "ready" | "recovering" | "active" | "standalone"
    epoch: int = 0
    position: int = 0
    updated_ts: float = field(default_factory=time.time)
    ready_epoch: int = 0  # the newest epoch it was primary or ready in (journaled: survives a restart)

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes) -> MemberRecord:
        try:
            raw: Any = json.loads(data.decode())
            return cls(
                name=str(raw["name"]),
                address=str(raw["address"]),
                role=str(raw["role"]),
                state=str(raw["state"]),
                epoch=int(raw.get("epoch", 0)),
                position=int(raw.get("position", 0)),
                updated_ts=float(raw.get("updated_ts", 0.0)),
                ready_epoch=int(raw.get("ready_epoch", 0)),
            )
        except (ValueError, KeyError, TypeError, UnicodeDecodeError) as exc:
            raise CoordinatorError(f"unreadable member record: {exc}") from exc

    def rank(self) -> tuple[int, int]:
        """How current this member's data is: (epoch, position), higher is newer."""
        return (self.epoch, self.position)


@dataclass(frozen=True, slots=True)
class ClusterView:
    """One immutable snapshot of the cluster as this member's coordinator sees it."""

    cluster: str  # cluster name (last component of the path)
    path: str  # coordination path, e.g. /understudy/CLUSTER
    leader: str | None  # name of the current leader, None while leaderless
    epoch: int  # the cluster epoch: the epoch of the current (or last) leader; 0 = never elected
    members: tuple[MemberRecord, ...] = ()  # sorted by name
    candidates: tuple[str, ...] = ()  # names currently contending, sorted
    ready_set: frozenset[str] | None = None  # backups the latest leader counted as ready; None = never published
    ready_leader: str | None = None  # the leader that published the ready set (it was primary in ready_epoch)
    ready_epoch: int = 0  # the epoch the ready set was published in
    i_am_leader: bool = False
    session: Session = Session.CONNECTED
    reason: WaitReason | None = None  # set while leaderless

    def member(self, name: str) -> MemberRecord | None:
        return next((m for m in self.members if m.name == name), None)


@dataclass(frozen=True, slots=True)
class Callbacks:
    """What a coordinator reports, and how (see the module docstring for the threading contract)."""

    on_elected: Callable[[int], None] = lambda epoch: None
    on_suspended: Callable[[], None] = lambda: None
    on_resumed: Callable[[], None] = lambda: None
    on_lost: Callable[[], None] = lambda: None
    on_view: Callable[[ClusterView], None] = lambda view: None
    dispatch: Dispatch = call_now


class Coordinator(ABC):
    """The operations every backend offers (documented in the module docstring)."""

    @abstractmethod
    def start(self, callbacks: Callbacks) -> None: ...

    @abstractmethod
    def stop(self) -> None: ...

    @abstractmethod
    def publish(self, record: MemberRecord) -> None: ...

    @abstractmethod
    def contend(self, force: bool = False) -> None: ...

    @abstractmethod
    def withdraw(self) -> None: ...

    @abstractmethod
    def publish_ready_set(self, names: Iterable[str], on_published: Callable[[], None] | None = None) -> None: ...

    @abstractmethod
    def view(self) -> ClusterView: ...

    @abstractmethod
    def holds_lease(self) -> bool: ...
