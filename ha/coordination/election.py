"""Pure election rules: who may contend, who may take leadership, and what a broker does about a view.

No I/O here.  Backends call `should_attempt`, `next_epoch` and `wait_reason`; the broker calls `decide` once per
view or session change and carries out the returned `Decision` (one turn, one decision, one log line).

Rules:

- Only *ready* backups contend.  When the cluster is brand new (no election ever happened at this path, and no
  member - including me - has an epoch or any data) every broker contends, so three fresh brokers form a cluster.
- After an outage of the whole cluster (no leader; brokers back with their journals, none ready yet), or when the
  primary was deposed with no ready backup, a broker contends when its journal says it was the last leader or one
  of its ready backups in the newest epoch with a published ready set (its `ready_epoch` is that epoch, and the
  ready set names it or its leader was it): it holds every message confirmed in that epoch, and no later epoch
  confirmed anything (a primary settles nothing before it published its epoch's ready set). Anyone else waits: a broker with an older store is never promoted over a
  newer one; if every broker with the newest store stays down, an operator decides (`ha-admin promote --force`).
- Among candidates, the one with the newest data (epoch, position) takes leadership; ties go to the smallest
  name (`ha.core.epoch.best_candidate`, the same rule the Pacemaker agent uses).  If the last leader published a ready set, only candidates in it may win: a backup the primary dropped
  may still say "ready" about itself but holds stale data.
- A primary demotes at once when its session is lost, when someone else leads, or when the cluster epoch is
  higher than its own; while suspended it pauses (settles nothing).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

from ha.coordination.base import ClusterView, MemberRecord, Session, WaitReason
from ha.core.epoch import Rank, best_candidate
from ha.core.states import HaState, Role

CONTENDING_STATES = frozenset({HaState.READY.value})
PRIMARY_ROLE = Role.PRIMARY.value


class Action(StrEnum):
    CONTEND = "contend"  # call coordinator.contend() (idempotent)
    WITHDRAW = "withdraw"  # call coordinator.withdraw() (idempotent; releases leadership if held)
    PROMOTE = "promote"  # I lead: become primary with view.epoch
    DEMOTE = "demote"  # primary: step down now and come back as a backup
    PAUSE = "pause"  # primary: settle nothing until the session is back
    CARRY_ON = "carry_on"  # primary: keep serving


class Reason(StrEnum):
    ELECTED = "elected"
    LEADING = "leading"
    SESSION_SUSPENDED = "session_suspended"
    SESSION_LOST = "session_lost"
    OTHER_LEADER = "other_leader"
    HIGHER_EPOCH = "higher_epoch"
    NEW_CLUSTER = "new_cluster"
    NEWEST_STORE = "newest_store"  # restarted after a whole-cluster outage with the newest journal
    READY = "ready"
    NOT_READY = "not_ready"
    FORCED = "forced"


@dataclass(frozen=True, slots=True)
class Decision:
    action: Action
    reason: Reason
    epoch: int  # the epoch the action refers to (the view's epoch)


def cluster_is_new(view: ClusterView, me: MemberRecord) -> bool:
    """No known broker has an epoch or data, and no election happened at this path (except the one I just won:
    with every record at epoch 0, winning epoch 1 proves the counter was 0)."""
    records = (*view.members, me)
    untouched = all(r.epoch == 0 and r.position == 0 for r in records)
    return untouched and (view.epoch == 0 or (view.i_am_leader and view.epoch == 1))


def restarted_with_newest_store(me: MemberRecord, view: ClusterView) -> bool:
    """No primary (the whole cluster went down, or the primary was deposed) and this broker's journal holds
    everything confirmed in the newest epoch in which anything was: the epoch of the last published ready set (a
    primary settles nothing before it published the ready set of its epoch, `CoordinatedRole.may_settle`), which
    names this broker or was published by it. The election counter may be higher: an election whose winner never
    became primary (it refused, or died first) confirmed nothing, and must not leave the cluster without a
    candidate."""
    won = view.i_am_leader and view.leader == me.name
    if view.leader is not None and not won:
        return False
    newest = view.ready_epoch
    return (newest > 0 and me.ready_epoch == newest
            and (me.name == view.ready_leader or (view.ready_set is not None and me.name in view.ready_set)))


def eligible(me: MemberRecord, view: ClusterView) -> bool:
    """May this broker be a candidate?"""
    return me.state in CONTENDING_STATES or cluster_is_new(view, me) or restarted_with_newest_store(me, view)


def decide(me: MemberRecord, view: ClusterView, forced: bool = False) -> Decision:
    """What the broker described by ``me`` should do about ``view``.

    ``forced``: an operator asked for this broker's promotion (``ha-admin promote --force``): it contends (with
    ``contend(force=True)``) whatever its state, until it leads or is told otherwise.
    """
    if me.role == PRIMARY_ROLE:
        return _decide_primary(me, view)
    if not (forced or eligible(me, view)):
        return Decision(Action.WITHDRAW, Reason.NOT_READY, view.epoch)
    if view.i_am_leader and view.session is Session.CONNECTED:
        return Decision(Action.PROMOTE, Reason.ELECTED, view.epoch)
    if forced:
        return Decision(Action.CONTEND, Reason.FORCED, view.epoch)
    if me.state in CONTENDING_STATES:
        reason = Reason.READY
    elif cluster_is_new(view, me):
        reason = Reason.NEW_CLUSTER
    else:
        reason = Reason.NEWEST_STORE
    return Decision(Action.CONTEND, reason, view.epoch)


def _decide_primary(me: MemberRecord, view: ClusterView) -> Decision:
    if view.session is Session.LOST:
        return Decision(Action.DEMOTE, Reason.SESSION_LOST, view.epoch)
    if view.epoch > me.epoch:
        return Decision(Action.DEMOTE, Reason.HIGHER_EPOCH, view.epoch)
    if view.session is Session.SUSPENDED:
        return Decision(Action.PAUSE, Reason.SESSION_SUSPENDED, view.epoch)
    if not view.i_am_leader:
        return Decision(Action.DEMOTE, Reason.OTHER_LEADER, view.epoch)
    return Decision(Action.CARRY_ON, Reason.LEADING, view.epoch)


def _in_ready_set(name: str, view: ClusterView) -> bool:
    return view.ready_set is None or name in view.ready_set or name == view.ready_leader


def should_attempt(name: str, view: ClusterView, force: bool = False) -> bool:
    """Should candidate ``name`` try to take leadership now?  (Backends call this.)"""
    if view.leader is not None or name not in view.candidates:
        return False
    if force:
        return True
    eligible_candidates = [
        (m.name, Rank(m.epoch, m.position))
        for m in view.members
        if m.name in view.candidates and _in_ready_set(m.name, view)
    ]
    return best_candidate(eligible_candidates) == name


def next_epoch(counter: int, members: Iterable[MemberRecord]) -> int:
    """The epoch a new leader takes: above the store's counter and above every epoch any member has seen."""
    return max([counter, *(m.epoch for m in members)]) + 1


def wait_reason(view: ClusterView) -> WaitReason | None:
    """Why a leaderless view has no leader (None when there is a leader)."""
    if view.leader is not None:
        return None
    if not view.candidates:
        return WaitReason.NO_READY_MEMBER
    if not any(_in_ready_set(c, view) for c in view.candidates):
        return WaitReason.NO_CANDIDATE_IN_READY_SET
    return WaitReason.ELECTION_PENDING
