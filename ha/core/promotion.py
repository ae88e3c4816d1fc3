"""Whether a broker may become primary, and how (pure: facts in, a decision out). HaNode.promote carries it out;
every way in (ha-admin, Pacemaker's agent, ZooKeeper's election, understudy-cluster's manager) asks this one rule.

A broker may be promoted when it is a ready backup (it holds every acknowledged message), when the operator forces
it (disaster recovery: acknowledged messages may be lost), when it is brand new (it never followed a primary, so it
holds nothing a client was promised: a new cluster's first primary), or when it was chosen as the newest store after
a whole-cluster outage and its own journal agrees (ha.core.restart.may_restart_as_newest). The trigger of the state
table follows: `promote` from ready, `force-promote` from anything else (ha.core.states).
"""

from __future__ import annotations

from dataclasses import dataclass

from ha.core.restart import ReadyView, may_restart_as_newest
from ha.core.states import HaState, Role, Trigger


@dataclass(frozen=True)
class Facts:
    """What the broker knows of itself."""

    name: str
    state: HaState
    epoch: int
    ready_epoch: int  # the newest epoch it was primary or ready in (journaled)
    view: ReadyView | None  # its newest journaled member list


@dataclass(frozen=True)
class Request:
    forced: bool = False  # ha-admin promote --force
    epoch: int | None = None  # the epoch a coordinator gave it (ZooKeeper's election), if any
    newest_store: bool = False  # chosen as the newest store after a whole-cluster outage


@dataclass(frozen=True)
class Decision:
    ok: bool
    text: str  # the answer to the requester (a refusal says why and what to do)
    already: bool = False  # it is primary already: nothing to do
    epoch: int = 0  # the epoch to take
    trigger: Trigger | None = None
    forced_transition: bool = False  # the state table's forced entry is taken (from joining or catchup)
    reason: str = ""  # of the state change (logged in ha.state)


def brand_new(state: HaState, epoch: int) -> bool:
    """Never followed a primary (epoch 0): holds nothing a client was promised."""
    return epoch == 0 and state == HaState.JOINING


def decide(f: Facts, r: Request) -> Decision:
    if f.state.role is Role.PRIMARY:
        return Decision(True, f"already primary ({f.state.value})", already=True, epoch=f.epoch)
    restarted = (r.newest_store and f.state == HaState.JOINING
                 and may_restart_as_newest(f.name, f.ready_epoch, f.view))
    if f.state != HaState.READY and not r.forced and not restarted and not brand_new(f.state, f.epoch):
        if r.newest_store and f.state == HaState.JOINING:
            return Decision(False, (
                f"refusing to promote with the newest store: this broker's journal does not show it primary or "
                f"ready in its newest member list (ready_epoch {f.ready_epoch}, list "
                f"{f.view.to_json() if f.view else None}); use --force for disaster recovery"))
        return Decision(False, f"refusing to promote a backup in state {f.state.value}: it may lack acknowledged "
                               "messages (use --force for disaster recovery)")
    ready = f.state == HaState.READY
    return Decision(True, "", epoch=max(f.epoch + 1, r.epoch or 0),
                    trigger=Trigger.PROMOTE if ready else Trigger.FORCE_PROMOTE,
                    forced_transition=r.forced or not ready,
                    reason="promoted with the newest store" if restarted else "promoted")
