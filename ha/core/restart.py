"""After a whole-cluster outage: which broker to promote so that the newest store wins, never an older one.

Every broker journals, with its HA standing, the newest member list it knows from a primary as a `ReadyView`: the
epoch, the list's number in that epoch (`Membership.seq`), the primary and the backups it counted ready. A primary
journals every list it makes, and when it drops a ready backup it confirms nothing more until that list is on disk
(ha/primary.py); a backup journals every list it receives, before it acknowledges anything that follows it.

When every broker went down at once and they come back (each with its journal, all `joining`, none primary):

1. The view with the highest (epoch, seq) among those reported is the newest knowledge of the cluster. Its primary
   and its ready backups hold every message confirmed until the outage. A backup the primary dropped (it stopped
   answering, the primary carried on without it) is not in it, though its own record, older, still names it ready.
   A list whose own primary reported with an older one is left out (`disowned`): that primary crashed before its
   journal held the list, so it confirmed nothing under it.
2. Only they may be promoted, and only if their own journal says they were primary or ready in that epoch
   (`ready_epoch`) and agrees (`may_restart_as_newest`, the check the broker itself makes before it accepts):
   the best by (epoch, position), `ha.core.epoch.best_candidate`.
3. Decide once every configured broker reported. Before that, wait; once the caller has waited long enough
   (`waited_out`: a broker does not come back), decide only if every broker the newest view names has reported. A
   broker that never returns might be the primary that dropped someone after the views we see.
4. If no broker the newest view names is up (or its journal is older than the view), nothing is promoted
   automatically: an operator decides (`ha-admin promote --force`), and the decision says why.
5. A brand-new cluster (no broker was ever primary or ready, and none holds a list that counts or any message) is
   the caller's bootstrap rule (promote any of them; nothing was confirmed), once every configured broker
   reported: a broker that has not may hold a store (a fresh disk must not win over it).

Pure and standard library only. The Pacemaker agent carries a copy (resource_agents/agent_core.py, it runs outside
the project's virtualenv); tests/unit/test_restart_agent_copy.py checks that both decide alike.

Usage::

    d = decide_restart([Standing("b1", 3, 120, 3, ReadyView(3, 5, "b1", frozenset({"b2"}))), ...], expected=3)
    if d.action is RestartAction.PROMOTE:
        promote(d.winner, epoch=d.epoch, newest_store=True)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum, StrEnum
from typing import Any

from ha.core.epoch import Rank, best_candidate
from ha.core.membership import Membership


@dataclass(frozen=True)
class ReadyView:
    """A primary's member list as one broker last knew it: who was primary and which backups were ready."""

    epoch: int
    seq: int
    primary: str
    ready: frozenset[str] = frozenset()

    @property
    def key(self) -> tuple[int, int]:
        return (self.epoch, self.seq)

    @property
    def eligible(self) -> frozenset[str]:
        """The brokers that held every confirmed message when this list was made."""
        return self.ready | {self.primary}

    @classmethod
    def of(cls, m: Membership) -> ReadyView | None:
        """The view of a primary's list (None when it names no primary: nothing to learn from it)."""
        p = m.primary
        return None if p is None else cls(m.epoch, m.seq, p.name, frozenset(m.ready_names) - {p.name})

    def to_json(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "seq": self.seq, "primary": self.primary, "ready": sorted(self.ready)}

    @classmethod
    def from_json(cls, data: object) -> ReadyView | None:
        """The journaled form; None for anything unreadable (a record of an older release has none)."""
        if not isinstance(data, Mapping):
            return None
        try:
            epoch, seq, primary, ready = data["epoch"], data["seq"], data["primary"], data.get("ready") or []
        except KeyError:
            return None
        if not (_count(epoch) and _count(seq) and isinstance(primary, str) and primary
                and isinstance(ready, list | tuple) and all(isinstance(n, str) for n in ready)):
            return None
        return cls(epoch, seq, primary, frozenset(ready))


def _count(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


@dataclass(frozen=True)
class Standing:
    """What one broker's journal says after the outage (and how much data it holds)."""

    name: str
    epoch: int
    position: int
    ready_epoch: int = 0  # the newest epoch it was primary or a ready backup in
    view: ReadyView | None = None

    @property
    def fresh(self) -> bool:
        """Never primary or ready, and no member list: holds nothing a client was promised (a primary journals
        its ready epoch and its first list before it confirms anything; it may have adopted an epoch)."""
        return self.ready_epoch == 0 and self.view is None


class RestartAction(Enum):
    NEW_CLUSTER = "new_cluster"  # nobody holds a standing: the caller's bootstrap rule
    WAIT = "wait"  # not enough brokers reported yet
    PROMOTE = "promote"  # promote `winner` (PROMOTE with newest_store)
    OPERATOR = "operator"  # nothing will be promoted automatically: an operator decides


class RestartReason(StrEnum):
    NEW_CLUSTER = "new_cluster"
    NEWEST_STORE = "newest_store"
    WAITING_FOR_MEMBERS = "waiting_for_members"
    WAITING_FOR_ELIGIBLE = "waiting_for_eligible"
    NO_READY_VIEW = "no_ready_view"
    NO_ELIGIBLE_UP = "no_eligible_up"


@dataclass(frozen=True)
class RestartDecision:
    action: RestartAction
    reason: RestartReason
    winner: str | None = None
    epoch: int = 0  # to promote with: one above every epoch reported
    newest: ReadyView | None = None
    eligible: tuple[str, ...] = ()  # the brokers the newest view allows, sorted
    missing: tuple[str, ...] = field(default=())  # of those, the ones that have not reported

    def describe(self) -> str:
        """One line for an operator: what happens and why."""
        view = "" if self.newest is None else (
            f" (newest ready set: epoch {self.newest.epoch} list {self.newest.seq}, primary {self.newest.primary}, "
            f"ready {', '.join(sorted(self.newest.ready)) or 'none'})")
        text = {
            RestartReason.NEW_CLUSTER: "brand-new cluster: nobody holds a store",
            RestartReason.NEWEST_STORE: f"{self.winner} holds the newest store: promote it with epoch {self.epoch}",
            RestartReason.WAITING_FOR_MEMBERS: "waiting for every broker to report its journal",
            RestartReason.WAITING_FOR_ELIGIBLE: (
                f"waiting for {', '.join(self.missing)}: only {', '.join(self.eligible)} may hold every confirmed "
                "message"),
            RestartReason.NO_READY_VIEW: ("no journal names a primary and its ready backups (written by an older "
                                          "release?): choose with ha-admin promote --force"),
            RestartReason.NO_ELIGIBLE_UP: (
                f"none of {', '.join(self.eligible)} is up with its store: nothing is promoted automatically; "
                "choose with ha-admin promote --force (acknowledged messages may be lost)"),
        }[self.reason]
        return text + view


def disowned(v: ReadyView, reported: Mapping[str, Standing]) -> bool:
    """A list its own primary's journal does not reach: that primary reported, and holds only older lists (or, with
    nobody ready in the list, none at all). A primary syncs its journal, lists included, before it confirms anything,
    so nothing was confirmed under such a list: it crashed before it synced it (or its disk was replaced, and with
    nobody ready what it confirmed under the list is gone with it)."""
    p = reported.get(v.primary)
    if p is None:
        return False
    if p.fresh:
        return not v.ready
    return p.view is None or p.view.key < v.key


def newest_view(standings: Iterable[Standing]) -> tuple[ReadyView | None, frozenset[str]]:
    """The newest view reported (leaving out the disowned ones) and the brokers it allows. Views of the same
    (epoch, seq) come from one primary and agree; should they not (two primaries in one epoch), only the brokers
    every one of them allows count."""
    reported = {s.name: s for s in standings}
    views = [s.view for s in reported.values() if s.view is not None and not disowned(s.view, reported)]
    if not views:
        return None, frozenset()
    key = max(v.key for v in views)
    same = sorted((v for v in views if v.key == key), key=lambda v: (v.primary, sorted(v.ready)))
    eligible = frozenset.intersection(*(v.eligible for v in same))
    return same[0], eligible


def decide_restart(standings: Iterable[Standing], expected: int, waited_out: bool = False) -> RestartDecision:
    """Whom to promote when every reporting broker is `joining` and none is primary (see the module docstring).

    `standings`: one per broker that is up (names unique); `expected`: how many brokers the cluster has;
    `waited_out`: the caller has waited long enough for the missing ones."""
    reported = {s.name: s for s in standings}
    epoch = max((s.epoch for s in reported.values()), default=0) + 1
    everyone = len(reported) >= expected
    newest, allowed = newest_view(reported.values())
    # Brand new: nobody was ever primary or ready, and no list counts or nothing at all is stored (a backup may hold
    # the first list of a primary that lost its journal before it synced anything, so confirmed nothing).
    if reported and all(s.ready_epoch == 0 for s in reported.values()) and (
            newest is None or all(s.position == 0 for s in reported.values())):
        if everyone:
            return RestartDecision(RestartAction.NEW_CLUSTER, RestartReason.NEW_CLUSTER, epoch=epoch)
        return RestartDecision(RestartAction.WAIT, RestartReason.WAITING_FOR_MEMBERS, epoch=epoch)
    if newest is None:
        if everyone:
            return RestartDecision(RestartAction.OPERATOR, RestartReason.NO_READY_VIEW, epoch=epoch)
        return RestartDecision(RestartAction.WAIT, RestartReason.WAITING_FOR_MEMBERS, epoch=epoch)
    eligible = tuple(sorted(allowed))
    missing = tuple(n for n in eligible if n not in reported)
    if not everyone and (not waited_out or missing):
        reason = RestartReason.WAITING_FOR_ELIGIBLE if waited_out else RestartReason.WAITING_FOR_MEMBERS
        return RestartDecision(RestartAction.WAIT, reason, epoch=epoch, newest=newest, eligible=eligible,
                               missing=missing)
    winner = best_candidate((n, Rank(s.epoch, s.position)) for n, s in reported.items()
                            if n in allowed and s.ready_epoch >= newest.epoch
                            and may_restart_as_newest(n, s.ready_epoch, s.view))
    if winner is None:
        return RestartDecision(RestartAction.OPERATOR, RestartReason.NO_ELIGIBLE_UP, epoch=epoch, newest=newest,
                               eligible=eligible, missing=missing)
    return RestartDecision(RestartAction.PROMOTE, RestartReason.NEWEST_STORE, winner=winner, epoch=epoch,
                           newest=newest, eligible=eligible, missing=missing)


def may_restart_as_newest(name: str, ready_epoch: int, view: ReadyView | None) -> bool:
    """The broker's own check before it accepts a promotion with the newest store: its journal says it was primary
    or ready in some epoch and, when it holds a view, that the view names it (a record of an older release has
    none). Whether another broker holds a newer view only the cluster-wide rule knows (`decide_restart`)."""
    if ready_epoch <= 0:
        return False
    return view is None or (name in view.eligible and view.epoch <= ready_epoch)


def dropped_by(name: str, held: tuple[int, int], views: Iterable[ReadyView]) -> ReadyView | None:
    """A member list newer than the one a ready backup holds (`held`: its epoch and the number of its newest list
    of that epoch) that does not name it (`name`): the newest such, or None. Its primary dropped it and may have
    confirmed messages without it (a primary journals such a list before it confirms anything more), so it must not
    be promoted while a broker that is down holds that list in its journal: the brokers that do hold it must come
    back first (the Pacemaker agent and understudy-cluster; under ZooKeeper the ready set says it)."""
    newer = [v for v in views if v.key > held and name not in v.eligible]
    return max(newer, key=lambda v: v.key, default=None)
