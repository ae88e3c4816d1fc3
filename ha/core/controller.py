"""One broker's HA controller (pure: an event in, the actions to carry out back; no I/O, no clock, no broker).

`Controller.handle(event)` is the only way the broker's HA state, epoch, `ready_epoch` and journaled member list
change. The edges only translate: the backup's connection to its primary reports `Connected`, `CaughtUp` and
`Lost`; the primary reports `Recovered`; every promotion, whoever asks for it (`ha-admin promote`, the Pacemaker
agent and `understudy-cluster` through the same management request, ZooKeeper's election through
`ha.coordinated.CoordinatedRole`), is a `Promote` event and every step-down a `Demote`; epochs and member lists a
broker learns arrive as `EpochSeen` and `ViewSeen`. `ha.node.HaNode` runs the actions (`NodeActions`) in order.

Which state an event leads to is data: the event's trigger (`TRIGGERS`, or the promotion rule's for `Promote`)
picks the transition of `ha.core.states.TRANSITIONS` (`fire`); whether a broker may be promoted, and how, is
`ha.core.promotion.decide`. The page docs/states.md lists both tables (`python -m ha.core.controller`).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from ha.core import promotion, states
from ha.core.restart import ReadyView
from ha.core.states import HaState, Role, Trigger, fire

# ----- events ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Started:
    """The broker is up (with what its journal says of its standing)."""

    ready_epoch: int = 0
    view: ReadyView | None = None


@dataclass(frozen=True)
class _Reported:
    reason: str  # logged with the transition (ha.state)


class Connected(_Reported):
    """A backup's connection to its primary was accepted and the wiring mirrored: catch-up begins."""


class CaughtUp(_Reported):
    """Every replicated queue caught up."""


class Lost(_Reported):
    """A backup in catch-up lost (or was refused by) its primary."""


@dataclass(frozen=True)
class EpochSeen:
    """An epoch learnt from a primary or a coordinator."""

    epoch: int


@dataclass(frozen=True)
class ViewSeen:
    """The ready member list of a membership the broker adopted (`ReadyView.of`)."""

    view: ReadyView


@dataclass(frozen=True)
class Promote:
    """Become primary, if the promotion rule allows. `ready` are the members the broker last knew ready (the
    backups the new primary waits for before it is active)."""

    forced: bool = False
    epoch: int | None = None
    newest_store: bool = False
    ready: tuple[str, ...] = ()


@dataclass(frozen=True)
class Recovered:
    """A recovering primary's expected backups caught up (or `--ha-backup-timeout` passed for `timed_out`)."""

    waited: float
    timed_out: tuple[str, ...] = ()


class Demote(_Reported):
    """Step down (operator, lost lease or leadership, a newer epoch seen)."""


Event = Started | Connected | CaughtUp | Lost | EpochSeen | ViewSeen | Promote | Recovered | Demote

# The trigger each backup-side or primary-side event fires (the state table decides where it leads).
TRIGGERS: Mapping[type, Trigger] = MappingProxyType({
    Connected: Trigger.PRIMARY_CONNECTED,
    CaughtUp: Trigger.CAUGHT_UP,
    Lost: Trigger.PRIMARY_LOST,
    Recovered: Trigger.RECOVERED,
    Demote: Trigger.DEMOTE,
})

# ----- actions --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StartBackup:
    """Lock the replicated queues and connect to the primary."""


@dataclass(frozen=True)
class StopBackup:
    pass


@dataclass(frozen=True)
class StartPrimary:
    """Unlock the queues and serve clients; wait for `expected` (ready before the failover) to catch up."""

    expected: tuple[str, ...]
    previous_epoch: int


@dataclass(frozen=True)
class StopPrimary:
    """Stop serving: forget unanswered settlements, close every client connection (links first)."""

    reason: str


@dataclass(frozen=True)
class PersistEpoch:
    """Raise the epoch file to `epoch` (before anything of the new epoch happens)."""

    epoch: int


@dataclass(frozen=True)
class RecordStanding:
    """Journal the broker's standing as it is at this step: what a whole-cluster restart compares
    (ha.core.restart)."""

    epoch: int
    state: HaState
    ready_epoch: int
    view: ReadyView | None


@dataclass(frozen=True)
class StateChanged:
    """Tell the parts that follow the state (the primary's member list, the coordinator)."""

    old: HaState
    new: HaState


@dataclass(frozen=True)
class Log:
    event: str
    level: str
    fields: tuple[tuple[str, Any], ...]


@dataclass(frozen=True)
class Answer:
    """The reply to whoever asked (a promotion)."""

    ok: bool
    text: str


Action = (StartBackup | StopBackup | StartPrimary | StopPrimary | PersistEpoch | RecordStanding | StateChanged | Log
          | Answer)


def _log(event: str, level: str = "info", **fields: Any) -> Log:
    return Log(event, level, tuple(fields.items()))


class Controller:
    """The HA facts of one broker and the rules that change them."""

    def __init__(self, name: str, epoch: int = 0) -> None:
        self.name = name
        self.state = HaState.JOINING
        self.epoch = epoch
        self.ready_epoch = 0  # the newest epoch this broker was primary or ready in (journaled)
        self.view: ReadyView | None = None  # the newest member list it knows from a primary (journaled)

    @property
    def role(self) -> Role:
        return self.state.role

    def handle(self, event: Event) -> list[Action]:
        """The actions `event` calls for, in order. Raises `IllegalTransition` (nothing changed) for an event the
        state table has no entry for in the current state."""
        if isinstance(event, Started):
            return self._started(event)
        if isinstance(event, EpochSeen):
            return self._adopt(event.epoch)
        if isinstance(event, ViewSeen):
            if event.view == self.view:
                return []
            self.view = event.view
            return [self._standing()]
        if isinstance(event, Promote):
            return self._promote(event)
        if isinstance(event, Demote):
            return self._demote(event)
        if isinstance(event, Recovered):
            reason = "expected backups caught up" if not event.timed_out else "backup timeout"
            return [*self._enter(Trigger.RECOVERED, reason),
                    _log("ha.active", epoch=self.epoch, waited_seconds=round(event.waited, 3),
                         timed_out=list(event.timed_out))]
        return self._enter(TRIGGERS[type(event)], event.reason)

    def _standing(self) -> RecordStanding:
        return RecordStanding(self.epoch, self.state, self.ready_epoch, self.view)

    # ----- rules ----------------------------------------------------------------------------------------------
    def _started(self, e: Started) -> list[Action]:
        self.ready_epoch, self.view = e.ready_epoch, e.view
        return [_log("ha.state", from_state=None, to_state=self.state.value, role=self.role.value, epoch=self.epoch,
                     reason="started with --ha-cluster"),
                StartBackup()]

    def _adopt(self, epoch: int) -> list[Action]:
        if epoch <= self.epoch:
            return []
        self.epoch = epoch
        return [PersistEpoch(epoch), self._standing()]

    def _enter(self, trigger: Trigger, reason: str, forced: bool = False) -> list[Action]:
        old = self.state
        new = fire(old, trigger, reason, forced=forced)  # IllegalTransition: nothing changed
        self.state = new
        if new in (HaState.READY, HaState.RECOVERING, HaState.ACTIVE):
            # Only here: a ready backup that adopts a newer epoch (its primary was deposed) is not ready in it, and
            # its queues hold what the old primary sent (the new one may have assigned those positions again).
            self.ready_epoch = max(self.ready_epoch, self.epoch)
        return [_log("ha.state", from_state=old.value, to_state=new.value, role=new.role.value, epoch=self.epoch,
                     reason=reason),
                self._standing(), StateChanged(old, new)]

    def _promote(self, e: Promote) -> list[Action]:
        d = promotion.decide(promotion.Facts(self.name, self.state, self.epoch, self.ready_epoch, self.view),
                             promotion.Request(e.forced, e.epoch, e.newest_store))
        if d.already or not d.ok:
            return [Answer(d.ok, d.text)]
        assert d.trigger is not None
        fire(self.state, d.trigger, d.reason, forced=d.forced_transition)  # refused here: nothing changed
        from_state, previous = self.state, self.epoch
        expected = tuple(name for name in e.ready if name != self.name)
        actions: list[Action] = [StopBackup(), *self._adopt(d.epoch)]
        # Journaled with the state change: "primary of this epoch, nobody ready yet", before the first list is (a
        # crash in between must not leave a primary whose journal names no list of its epoch; ha.core.restart).
        self.view = ReadyView(self.epoch, 0, self.name)
        actions += self._enter(d.trigger, d.reason, forced=d.forced_transition)
        actions += [_log("ha.promoted", "warning", epoch=self.epoch, from_state=from_state.value, forced=e.forced,
                         expected_backups=list(expected)),
                    StartPrimary(expected, previous),
                    Answer(True, f"promoted to primary, epoch {self.epoch}")]
        return actions

    def _demote(self, e: Demote) -> list[Action]:
        if self.role is not Role.PRIMARY:
            return []
        return [_log("ha.demoted", "warning", epoch=self.epoch, reason=e.reason),
                StopPrimary(e.reason),
                *self._enter(Trigger.DEMOTE, e.reason),
                StartBackup()]


def answer(actions: list[Action]) -> tuple[bool, str]:
    """The `Answer` among `actions` (a promotion's reply)."""
    for a in actions:
        if isinstance(a, Answer):
            return a.ok, a.text
    return True, ""


# ----- docs/states.md -------------------------------------------------------------------------------------------
EVENTS: tuple[type, ...] = (Started, Connected, CaughtUp, Lost, Promote, Recovered, Demote, EpochSeen, ViewSeen)
_NO_TRANSITION = {Started: "none (starts `joining`)", EpochSeen: "none", ViewSeen: "none",
                  Promote: "`promote` from `ready`, else `force-promote` (ha.core.promotion)"}


def _summary(cls: type) -> str:
    return " ".join((cls.__doc__ or "").split())


def render_markdown() -> str:
    """The whole docs/states.md page: the state table and the controller's events."""
    rows = [
        "## What moves a broker: the controller's events",
        "",
        "The broker reports what happened to its HA controller (`ha/core/controller.py`, pure: an event in, the",
        "actions to carry out back); the event's trigger picks the transition above. Every promotion, whoever asks",
        "(ha-admin, the Pacemaker agent, understudy-cluster, ZooKeeper's election), is a `Promote` event.",
        "",
        "| event | trigger | meaning |",
        "|-------|---------|---------|",
    ]
    for cls in EVENTS:
        trigger = f"`{TRIGGERS[cls].value}`" if cls in TRIGGERS else _NO_TRANSITION[cls]
        rows.append(f"| `{cls.__name__}` | {trigger} | {_summary(cls)} |")
    return states.render_markdown("\n".join(["", *rows, ""]))


if __name__ == "__main__":
    sys.stdout.write(render_markdown())
