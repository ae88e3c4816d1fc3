"""Decisions of the ``understudy`` OCF agent, without I/O (unit-tested in tests/pacemaker/test_agent_core.py).

The agent (``resource_agents/understudy``) gathers facts -- the broker's ``ha-admin query`` answer, whether its
process is alive, the statuses other instances published as private node attributes, what the broker's journal says
(read here without the broker: ``read_standing``) -- and asks this module what to return to Pacemaker, which promotion
score to set, and whether a promote may go ahead.

Standard library only: the agent runs under the system ``python3`` that Pacemaker's executor starts.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import struct
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from enum import Enum
from urllib.parse import quote, unquote

# OCF exit codes (the values of resource-agents' ocf.py, repeated so this module imports without it).
OCF_SUCCESS = 0
OCF_ERR_GENERIC = 1
OCF_ERR_ARGS = 2
OCF_ERR_UNIMPLEMENTED = 3
OCF_ERR_INSTALLED = 5
OCF_ERR_CONFIGURED = 6
OCF_NOT_RUNNING = 7
OCF_RUNNING_PROMOTED = 8
OCF_FAILED_PROMOTED = 9

# Promotion scores. Only a primary or a ready backup ever gets one (see promotion_score).
PRIMARY_SCORE = 1001
BEST_READY_SCORE = 1000
RANK_STEP = 10
MIN_READY_SCORE = 10
BOOTSTRAP_SCORE = 1
ABORTED_SCORE = 1
NEWEST_STORE_SCORE = 1000  # after a whole-cluster outage: the one broker the restart rule picks

BACKUP_STATES = frozenset({"joining", "catchup", "ready"})
PRIMARY_STATES = frozenset({"recovering", "active"})


@dataclass(frozen=True, order=False)
class BrokerStatus:
    """What an instance reports about itself: ``ha-admin query`` or a published node attribute."""

    role: str  # primary | backup | standalone
    state: str  # joining | catchup | ready | recovering | active | standalone
    epoch: int
    position: int
    lost_primary: bool = False  # see effective_status: was ready until its primary vanished
    view: int = 0  # the number of the newest member list of its epoch it holds from the primary (0: none)

    @property
    def is_primary(self) -> bool:
        return self.role == "primary" and self.state in PRIMARY_STATES

    @property
    def is_ready_backup(self) -> bool:
        return self.role == "backup" and self.state == "ready"

    @property
    def currency(self) -> tuple[int, int, int]:
        """How current the data is: epoch first; within an epoch the newer member list, then the position (the
        rule of ha.core.epoch.Rank). A ready backup the primary dropped holds an older list than every backup the
        primary settled anything with afterwards: the primary waits until they hold the newer one."""
        return (self.epoch, self.view, self.position)

    def encode(self) -> str:
        """Compact form stored in a node attribute: ``role:state:epoch:position:view[:lost]``."""
        text = f"{self.role}:{self.state}:{self.epoch}:{self.position}:{self.view}"
        return text + ":lost" if self.lost_primary else text

    @classmethod
    def decode(cls, text: str) -> BrokerStatus:
        """The form ``encode`` writes; also the older ``role:state:epoch:position[:lost]`` (no member list)."""
        parts = text.strip().split(":")
        lost = parts[-1] == "lost"
        if lost:
            parts.pop()
        if len(parts) not in (4, 5):
            raise ValueError(f"bad published status {text!r}")
        return cls(
            role=parts[0],
            state=parts[1],
            epoch=int(parts[2]),
            position=int(parts[3]),
            lost_primary=lost,
            view=int(parts[4]) if len(parts) == 5 else 0,
        )


def status_from(data: object) -> BrokerStatus:
    """The broker's STATUS answer (contract: name, role, state, epoch, position, ...) as a BrokerStatus."""
    if not isinstance(data, dict):
        raise ValueError(f"unexpected status answer: not an object: {str(data)[:200]!r}")
    try:
        epoch = int(data["epoch"])
        return BrokerStatus(
            role=str(data["role"]),
            state=str(data["state"]),
            epoch=epoch,
            position=int(data["position"]),
            view=_view_number(data.get("ready_view"), epoch),
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"unexpected status answer: {exc!r}: {str(data)[:200]!r}") from exc


def _view_number(view: object, epoch: int) -> int:
    """The number of the member list a STATUS answer's ``ready_view`` names, if it is one of ``epoch`` (a list of
    an older primary says nothing about this one's)."""
    if isinstance(view, dict) and view.get("epoch") == epoch:
        seq = view.get("seq")
        if isinstance(seq, int) and not isinstance(seq, bool) and seq >= 0:
            return seq
    return 0


_ATTRD_LINE = re.compile(r'host="(?P<host>[^"]*)"\s+value="(?P<value>[^"]*)"')


def parse_attrd_query(text: str) -> dict[str, str]:
    """``attrd_updater -Q -A -n NAME`` output -> {node: value} (nodes without a value are left out)."""
    values: dict[str, str] = {}
    for line in text.splitlines():
        m = _ATTRD_LINE.search(line)
        if m and m.group("value"):
            values[m.group("host")] = m.group("value")
    return values


def decode_published(raw: Mapping[str, str]) -> dict[str, BrokerStatus]:
    """Decode published statuses, dropping unreadable ones (an old agent version, a torn write)."""
    out: dict[str, BrokerStatus] = {}
    for node, text in raw.items():
        try:
            out[node] = BrokerStatus.decode(text)
        except ValueError:
            continue
    return out


@dataclass(frozen=True)
class ReadyMark:
    """Written by monitor whenever the broker reports ``ready``: the epoch and when (monotonic-free wall time)."""

    epoch: int
    at: float

    def encode(self) -> str:
        return f"{self.epoch} {self.at:.3f}"

    @classmethod
    def decode(cls, text: str) -> ReadyMark:
        epoch, at = text.split()
        return cls(epoch=int(epoch), at=float(at))


READY_MARK_WINDOW = 60.0  # seconds a ready mark vouches for a backup that has just lost its primary


def effective_status(
    status: BrokerStatus, mark: ReadyMark | None, now: float, sole_member: bool = False
) -> BrokerStatus:
    """The status promotion decisions use.

    A ready backup that loses its primary stays ``ready`` in the broker itself (docs/states.md), so it remains a
    candidate without help from the agent; a ``joining`` broker is never vouched for (the ready mark is kept for
    the operator's information only: a backup that went back to joining may have been dropped by a primary that
    carried on without it).

    A broker whose ``brokers_url`` names only itself (``sole_member``) is always a candidate: no other broker can
    hold a message it lacks.
    """
    if sole_member and status.role == "backup" and status.state in BACKUP_STATES:
        return replace(status, state="ready", lost_primary=status.state != "ready")
    return status


# ---- monitor -------------------------------------------------------------------------------------------------


def monitor_code(process_alive: bool, status: BrokerStatus | None, expected_promoted: bool) -> int:
    """OCF code for monitor: 7 stopped, 8 primary, 0 backup, 9/1 when the process lives but does not answer.

    A hung (SIGSTOPped) broker is alive but cannot answer ``ha-admin query`` within the timeout, so it fails
    monitor instead of passing it.
    """
    if not process_alive:
        return OCF_NOT_RUNNING
    if status is None:
        return OCF_FAILED_PROMOTED if expected_promoted else OCF_ERR_GENERIC
    if status.is_primary:
        return OCF_RUNNING_PROMOTED
    if status.role == "backup" and status.state in BACKUP_STATES:
        return OCF_SUCCESS
    return OCF_ERR_GENERIC  # standalone (no --ha-cluster) or a state we do not know


def promotion_score(
    node: str,
    own: BrokerStatus,
    published: Mapping[str, BrokerStatus],
    restart: Restart | None = None,
    standings: Mapping[str, Standing] | None = None,
    name: str | None = None,
) -> int | None:
    """The promotion score this node should carry, or None to delete it.

    - the primary keeps PRIMARY_SCORE (a promoted instance without a score would be demoted);
    - ready backups are ranked by currency (epoch, member list, position) among all ready instances: the most
      current gets
      BEST_READY_SCORE, each rank below loses RANK_STEP (equal currency, equal score);
    - a ready backup its primary dropped gets none while a broker that is down holds, in its published journal
      standing, the newer member list without it (``standings``; ``name``: this broker's): it may lack messages
      confirmed after the drop;
    - joining/catchup backups get none, so Pacemaker never promotes a backup that lacks acknowledged messages;
    - whole-cluster restart (``restart``, see ``whole_cluster_restart``): the one node whose broker the restart
      rule picks (the newest store) gets NEWEST_STORE_SCORE, every other none;
    - bootstrap exception: a brand-new backup (``joining``, epoch 0) gets BOOTSTRAP_SCORE while no instance
      anywhere is primary or ready and no published journal holds a store, so that a new cluster gets its first
      primary at all.
    """
    if own.is_primary:
        return PRIMARY_SCORE
    if own.is_ready_backup:
        if dropped_ready(node, name, own, standings) is not None:
            return None
        ready = {n: s for n, s in published.items() if s.is_ready_backup and n != node}
        better = sorted({s.currency for s in ready.values() if s.currency > own.currency}, reverse=True)
        return max(BEST_READY_SCORE - RANK_STEP * len(better), MIN_READY_SCORE)
    if restart is not None and restart.decision.action is RestartAction.PROMOTE:
        return NEWEST_STORE_SCORE if restart.winner_node == node else None
    if _bootstrap(own, restart) and not _anyone_serving(node, published, standings) and _no_store(restart):
        return BOOTSTRAP_SCORE
    return None


def _bootstrap(own: BrokerStatus, restart: Restart | None) -> bool:
    """A new cluster's first primary may come from this broker: it never followed a primary (epoch 0), or every
    journal says nobody was ever primary or ready (the restart rule's NEW_CLUSTER: a first primary that crashed
    before its first journal sync left its backups with an epoch they adopted, and nothing confirmed)."""
    if _brand_new(own):
        return True
    return (own.role == "backup" and own.state == "joining" and restart is not None
            and restart.decision.action is RestartAction.NEW_CLUSTER)


def dropped_ready(
    node: str, name: str | None, own: BrokerStatus, standings: Mapping[str, Standing] | None
) -> ReadyView | None:
    """The newer member list without ``node``'s ready backup (broker ``name``) that another node's published
    standing holds, or None (``dropped_by``; None too when the name or the standings are not known)."""
    if not own.is_ready_backup or name is None or not standings:
        return None
    return dropped_by(name, (own.epoch, own.view), (s.view for n, s in standings.items() if n != node and s.view))


def _no_store(restart: Restart | None) -> bool:
    """No published journal holds a store (or none was published: an agent of an older release)."""
    return restart is None or restart.decision.action is RestartAction.NEW_CLUSTER


def _brand_new(status: BrokerStatus) -> bool:
    """Never followed a primary (epoch 0): holds nothing a client was promised."""
    return status.role == "backup" and status.state == "joining" and status.epoch == 0


def _anyone_serving(
    node: str, published: Mapping[str, BrokerStatus], standings: Mapping[str, Standing] | None = None
) -> bool:
    """Another instance is primary, or a ready backup that was not dropped (``dropped_ready``: by the name its own
    published standing gives)."""
    standings = standings or {}
    return any(
        s.is_primary
        or (s.is_ready_backup and dropped_ready(n, standings[n].name if n in standings else None, s, standings) is None)
        for n, s in published.items()
        if n != node
    )


# ---- promote -------------------------------------------------------------------------------------------------


class PromoteAction(Enum):
    ALREADY_PRIMARY = "already-primary"
    PROMOTE = "promote"
    ABORT_FOR_BETTER = "abort-for-better"
    REFUSE = "refuse"


@dataclass(frozen=True)
class PromoteDecision:
    action: PromoteAction
    reason: str
    epoch: int = 0  # the epoch to promote with (PROMOTE)
    force: bool = False  # promote from joining (bootstrap only)
    better_node: str | None = None  # ABORT_FOR_BETTER: the node that should be promoted instead
    newest_store: bool = False  # PROMOTE of the newest store after a whole-cluster outage (never with force)


def decide_promote(
    node: str,
    own: BrokerStatus,
    published: Mapping[str, BrokerStatus],
    restart: Restart | None = None,
    standings: Mapping[str, Standing] | None = None,
    name: str | None = None,
) -> PromoteDecision:
    """Decide a promote on ``node``, given what every instance published in the pre-promote notification (and,
    after a whole-cluster outage, what their journals say: ``restart``).

    The new epoch is one above the highest epoch any instance reported, so it outranks every older primary.
    """
    others = {n: s for n, s in published.items() if n != node}
    new_epoch = max([own.epoch, *(s.epoch for s in others.values())]) + 1
    if own.is_primary:
        return PromoteDecision(PromoteAction.ALREADY_PRIMARY, "already primary", epoch=own.epoch)
    other_primary = sorted(n for n, s in others.items() if s.is_primary)
    if other_primary:
        return PromoteDecision(PromoteAction.REFUSE, f"{other_primary[0]} reports itself primary")
    if own.is_ready_backup:
        newer = dropped_ready(node, name, own, standings)
        if newer is not None:
            return PromoteDecision(
                PromoteAction.REFUSE,
                f"its primary dropped it: member list {newer.seq} of epoch {newer.epoch} (primary {newer.primary}), "
                "journaled by a broker that is down, does not name it; the brokers that list names must come back",
            )
        ahead = _most_current(
            {n: s for n, s in others.items() if s.is_ready_backup and s.currency > own.currency}
        )
        if ahead is not None:
            return _abort_for(ahead, own, others[ahead])
        reason = "most current ready backup" + (" (it lost its primary)" if own.lost_primary else "")
        return PromoteDecision(PromoteAction.PROMOTE, reason, epoch=new_epoch, force=own.lost_primary)
    if restart is not None and restart.decision.action is not RestartAction.NEW_CLUSTER:
        d = restart.decision
        if d.action is RestartAction.PROMOTE and restart.winner_node == node:
            return PromoteDecision(
                PromoteAction.PROMOTE,
                f"whole-cluster restart: {d.describe()}",
                epoch=max(new_epoch, d.epoch),
                newest_store=True,
            )
        if d.action is RestartAction.PROMOTE and restart.winner_node is not None:
            return PromoteDecision(
                PromoteAction.ABORT_FOR_BETTER,
                f"{restart.winner_node} holds the newest store: {d.describe()}",
                better_node=restart.winner_node,
            )
        return PromoteDecision(PromoteAction.REFUSE, f"whole-cluster restart: {d.describe()}")
    if _bootstrap(own, restart) and not _anyone_serving(node, published, standings):
        ahead = _most_current(
            {n: s for n, s in others.items() if _bootstrap(s, restart) and s.currency > own.currency}
        )
        if ahead is not None:
            return _abort_for(ahead, own, others[ahead])
        return PromoteDecision(  # an adopted epoch: only force promotes from joining (nothing was confirmed)
            PromoteAction.PROMOTE, "bootstrap: brand-new cluster, nobody serving", epoch=new_epoch, force=own.epoch > 0
        )
    return PromoteDecision(
        PromoteAction.REFUSE,
        f"broker is {own.role}/{own.state}, not a ready backup: it may lack acknowledged messages",
    )


def _most_current(candidates: Mapping[str, BrokerStatus]) -> str | None:
    """The most current node (ties: the lowest node name, so every node picks the same one)."""
    if not candidates:
        return None
    return min(candidates, key=lambda n: (tuple(-c for c in candidates[n].currency), n))


def _abort_for(better: str, own: BrokerStatus, theirs: BrokerStatus) -> PromoteDecision:
    return PromoteDecision(
        PromoteAction.ABORT_FOR_BETTER,
        f"{better} is more current (epoch {theirs.epoch}, member list {theirs.view}, position {theirs.position}) "
        f"than this node (epoch {own.epoch}, member list {own.view}, position {own.position})",
        better_node=better,
    )


# ---- whole-cluster restart: the newest store ---------------------------------------------------------------
#
# A copy of ha/core/restart.py (the agent runs outside the project's virtualenv and cannot import it); the module
# docstring there explains the rule. tests/unit/test_restart_agent_copy.py checks that both copies decide alike.


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
        return self.ready | {self.primary}

    @classmethod
    def from_json(cls, data: object) -> ReadyView | None:
        if not isinstance(data, Mapping):
            return None
        try:
            epoch, seq, primary, ready = data["epoch"], data["seq"], data["primary"], data.get("ready") or []
        except KeyError:
            return None
        if not (
            _count(epoch)
            and _count(seq)
            and isinstance(primary, str)
            and primary
            and isinstance(ready, (list, tuple))
            and all(isinstance(n, str) for n in ready)
        ):
            return None
        return cls(epoch, seq, primary, frozenset(ready))


def _count(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


@dataclass(frozen=True)
class Standing:
    """What one broker's journal says (``read_standing``), published as a private node attribute."""

    name: str  # the broker's name (--name), as member lists know it
    epoch: int
    position: int
    ready_epoch: int = 0
    view: ReadyView | None = None

    @property
    def fresh(self) -> bool:
        return self.ready_epoch == 0 and self.view is None

    def encode(self) -> str:
        """``name:epoch:position:ready_epoch[:view_epoch:view_seq:primary:ready,ready]``, names %-quoted."""
        text = f"{quote(self.name, safe='')}:{self.epoch}:{self.position}:{self.ready_epoch}"
        v = self.view
        if v is not None:
            ready = ",".join(quote(n, safe="") for n in sorted(v.ready))
            text += f":{v.epoch}:{v.seq}:{quote(v.primary, safe='')}:{ready}"
        return text

    @classmethod
    def decode(cls, text: str) -> Standing:
        parts = text.strip().split(":")
        if len(parts) not in (4, 8):
            raise ValueError(f"bad published standing {text!r}")
        view = None
        if len(parts) == 8:
            ready = frozenset(unquote(n) for n in parts[7].split(",") if n)
            view = ReadyView(int(parts[4]), int(parts[5]), unquote(parts[6]), ready)
        return cls(unquote(parts[0]), int(parts[1]), int(parts[2]), int(parts[3]), view)


def standing_from(data: object, name: str) -> Standing:
    """A ``joining`` broker's STATUS answer (epoch, position, ready_epoch, ready_view) as its standing."""
    if not isinstance(data, dict):
        raise ValueError(f"unexpected status answer: not an object: {str(data)[:200]!r}")
    try:
        return Standing(
            str(data.get("name") or name),
            int(data["epoch"]),
            int(data["position"]),
            int(data.get("ready_epoch") or 0),
            ReadyView.from_json(data.get("ready_view")),
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"unexpected status answer: {exc!r}: {str(data)[:200]!r}") from exc


def decode_standings(raw: Mapping[str, str]) -> dict[str, Standing]:
    """Published standings by node, dropping unreadable ones."""
    out: dict[str, Standing] = {}
    for node, text in raw.items():
        try:
            out[node] = Standing.decode(text)
        except ValueError:
            continue
    return out


class RestartAction(Enum):
    NEW_CLUSTER = "new_cluster"
    WAIT = "wait"
    PROMOTE = "promote"
    OPERATOR = "operator"


class RestartReason(Enum):
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
    epoch: int = 0
    newest: ReadyView | None = None
    eligible: tuple[str, ...] = ()
    missing: tuple[str, ...] = ()

    def describe(self) -> str:
        view = ""
        if self.newest is not None:
            view = (
                f" (newest ready set: epoch {self.newest.epoch} list {self.newest.seq}, primary "
                f"{self.newest.primary}, ready {', '.join(sorted(self.newest.ready)) or 'none'})"
            )
        text = {
            RestartReason.NEW_CLUSTER: "brand-new cluster: nobody holds a store",
            RestartReason.NEWEST_STORE: f"{self.winner} holds the newest store: promote it with epoch {self.epoch}",
            RestartReason.WAITING_FOR_MEMBERS: "waiting for every broker to report its journal",
            RestartReason.WAITING_FOR_ELIGIBLE: (
                f"waiting for {', '.join(self.missing)}: only {', '.join(self.eligible)} may hold every confirmed "
                "message"
            ),
            RestartReason.NO_READY_VIEW: (
                "no journal names a primary and its ready backups (written by an older release?): choose with "
                "ha-admin promote --force"
            ),
            RestartReason.NO_ELIGIBLE_UP: (
                f"none of {', '.join(self.eligible)} is up with its store: nothing is promoted automatically; "
                "choose with ha-admin promote --force (acknowledged messages may be lost)"
            ),
        }[self.reason]
        return text + view


def disowned(v: ReadyView, reported: Mapping[str, Standing]) -> bool:
    """A list its own primary's journal does not reach (ha/core/restart.py)."""
    p = reported.get(v.primary)
    if p is None:
        return False
    if p.fresh:
        return not v.ready
    return p.view is None or p.view.key < v.key


def newest_view(standings: Iterable[Standing]) -> tuple[ReadyView | None, frozenset[str]]:
    reported = {s.name: s for s in standings}
    views = [s.view for s in reported.values() if s.view is not None and not disowned(s.view, reported)]
    if not views:
        return None, frozenset()
    key = max(v.key for v in views)
    same = sorted((v for v in views if v.key == key), key=lambda v: (v.primary, sorted(v.ready)))
    eligible = frozenset.intersection(*(v.eligible for v in same))
    return same[0], eligible


def decide_restart(standings: Iterable[Standing], expected: int, waited_out: bool = False) -> RestartDecision:
    """Whom to promote when every reporting broker is ``joining`` and none is primary (ha/core/restart.py)."""
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
        return RestartDecision(
            RestartAction.WAIT, reason, epoch=epoch, newest=newest, eligible=eligible, missing=missing
        )
    candidates = [
        (n, (s.epoch, s.position))
        for n, s in reported.items()
        if n in allowed and s.ready_epoch >= newest.epoch and may_restart_as_newest(n, s.ready_epoch, s.view)
    ]
    if not candidates:
        return RestartDecision(
            RestartAction.OPERATOR,
            RestartReason.NO_ELIGIBLE_UP,
            epoch=epoch,
            newest=newest,
            eligible=eligible,
            missing=missing,
        )
    winner = min(candidates, key=lambda c: (-c[1][0], -c[1][1], c[0]))[0]  # ha.core.epoch.best_candidate
    return RestartDecision(
        RestartAction.PROMOTE,
        RestartReason.NEWEST_STORE,
        winner=winner,
        epoch=epoch,
        newest=newest,
        eligible=eligible,
        missing=missing,
    )


def dropped_by(name: str, held: tuple[int, int], views: Iterable[ReadyView]) -> ReadyView | None:
    """A member list newer than the one a ready backup holds (`held`: epoch, list number) that does not name it:
    the newest such, or None (ha/core/restart.py `dropped_by`)."""
    newer = [v for v in views if v.key > held and name not in v.eligible]
    return max(newer, key=lambda v: v.key, default=None)


def may_restart_as_newest(name: str, ready_epoch: int, view: ReadyView | None) -> bool:
    """The broker's own check before it accepts a promotion with the newest store (ha/core/restart.py)."""
    if ready_epoch <= 0:
        return False
    return view is None or (name in view.eligible and view.epoch <= ready_epoch)


@dataclass(frozen=True)
class Restart:
    """The restart rule's decision, and the node whose broker it picked."""

    decision: RestartDecision
    winner_node: str | None = None


def whole_cluster_restart(
    node: str,
    own: BrokerStatus | None,
    published: Mapping[str, BrokerStatus],
    standings: Mapping[str, Standing],
    expected: int,
    waited_out: bool = False,
) -> Restart | None:
    """After a whole-cluster outage (this broker ``joining`` or not started yet, no instance primary or ready):
    the restart rule over every published standing (by node). None when it is not such a restart."""
    if own is not None and (own.role != "backup" or own.state != "joining"):
        return None
    if _anyone_serving(node, published, standings):
        return None
    d = decide_restart(standings.values(), expected, waited_out)
    winner = next((n for n, s in sorted(standings.items()) if s.name == d.winner), None)
    return Restart(d, winner)


# ---- the journal, read without the broker ------------------------------------------------------------------
#
# The format is broker/store/records.py's: segment files NNNNNNNN.jnl under DATA_DIR/journal, each a header
# "UJNL" format:u16 segment:u32, then records length:u32 crc32:u32 kind:u8 payload (crc32 over kind and payload).
# Every segment starts with a checkpoint (each durable queue with its next position, the HA standing), so the segments
# from the newest whole checkpoint on say everything needed here. Only the record kinds below are read; the rest are skipped.

JOURNAL_MAGIC = b"UJNL"
JOURNAL_FORMAT = 3  # 3: MARK records (skipped) and zero-filled segments (their zeros end a scan)
_JHEADER = struct.Struct(">4sHI")
_JFRAME = struct.Struct(">II")
_JQPOS = struct.Struct(">IQ")  # the head of an ENQUEUE payload: queue, position
_JQID = struct.Struct(">I")
_ENQUEUE, _QUEUE, _UNQUEUE, _STATE, _UNIT, _MARK = 1, 3, 4, 9, 11, 12
_JMARK_MAGIC = b"\x8eUJmark\x1d"  # a MARK record: magic, its own offset, the segment's bytes on disk then
_JMARK = struct.Struct(">8sQQ")
_JMARK_SIZE = _JFRAME.size + 1 + _JMARK.size
_REPLICATE_KEY = "qpid.replicate"


class JournalUnreadable(Exception):
    """The journal is of a newer format or not a journal at all."""


def read_standing(data_dir: str, name: str) -> Standing:
    """This broker's standing from DATA_DIR/journal and DATA_DIR/epoch, without the broker (it may be down).

    The position is the sum, over durable queues that replicate their messages, of the highest position journaled
    (the broker's own measure after recovery). A torn tail ends the reading quietly, as the broker cuts it."""
    epoch = _read_epoch(os.path.join(data_dir, "epoch"))
    directory = os.path.join(data_dir, "journal")
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        names = []  # no journal yet: a fresh broker
    except OSError as exc:  # not an empty journal: one nothing can be said of (the broker would not start)
        raise JournalUnreadable(f"{directory}: {exc.strerror or exc}") from None
    numbers = sorted(int(n[:-4]) for n in names if n.endswith(".jnl") and n[:-4].isdigit())
    queues: dict[int, tuple[dict[str, object], int]] = {}  # qid -> (QUEUE document, highest position)
    state: dict[str, object] = {}
    # From the newest segment whose checkpoint is whole (it holds the HA standing) to the last: a crash between a
    # new segment's header and its checkpoint, at two starts in a row, leaves more than one without.
    chosen: list[tuple[int, str, bytes]] = []
    for number in reversed(numbers):
        path = os.path.join(directory, f"{number:08d}.jnl")
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError as exc:
            raise JournalUnreadable(f"{path}: {exc.strerror or exc}") from None
        chosen.append((number, path, data))
        if _replay_segment(data, path, {}, {}, last=number == numbers[-1]):
            break
    for number, path, data in reversed(chosen):
        state = _replay_segment(data, path, queues, state, last=number == numbers[-1])
    position = 0
    for doc, highest in queues.values():
        args = doc.get("arguments")
        level = args.get(_REPLICATE_KEY, "all") if isinstance(args, dict) else "all"
        if level == "all":
            position += highest
    return Standing(
        name,
        max(epoch, _int(state.get("epoch"))),
        position,
        _int(state.get("ready_epoch")),
        ReadyView.from_json(state.get("view")),
    )


def _int(v: object) -> int:
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else 0


def _read_epoch(path: str) -> int:
    try:
        with open(path) as f:
            value = int(f.read().strip())
    except (OSError, ValueError):
        return 0
    return max(value, 0)


def _replay_segment(
    data: bytes,
    path: str,
    queues: dict[int, tuple[dict[str, object], int]],
    state: dict[str, object],
    last: bool = True,
) -> dict[str, object]:
    if len(data) < _JHEADER.size or not any(data[: _JHEADER.size]):
        return state  # a segment whose header a crash cut short or never synced: the broker drops it
    magic, fmt, _ = _JHEADER.unpack_from(data)
    if magic != JOURNAL_MAGIC:
        raise JournalUnreadable(f"{path}: not a journal segment")
    if fmt > JOURNAL_FORMAT:
        raise JournalUnreadable(f"{path}: journal format {fmt} is newer than this agent's ({JOURNAL_FORMAT})")
    view = memoryview(data)
    off, end = _JHEADER.size, len(data)
    # From format 3 a write counts only once its MARK is read: the last segment's records after its last MARK are
    # a write a crash cut short, which the broker cuts whole (broker/store/records.py ``last_end``).
    held: list[memoryview] = []
    while off + _JFRAME.size <= end:
        length, crc = _JFRAME.unpack_from(view, off)
        stop = off + _JFRAME.size + length
        if length == 0 or stop > end:
            break
        body = view[off + _JFRAME.size : stop]
        if zlib.crc32(body) != crc:
            break  # a torn tail (or damage: below)
        kind = body[0]
        if kind == _UNIT and not _unit_whole(view, stop, stop + _JQID.unpack_from(body, 1)[0]):
            break  # a transaction's write a crash cut short: the broker cuts it at start, all of it
        if kind == _MARK:
            for b in held:
                state = _replay_record(b, queues, state)
            held.clear()
        elif fmt >= 3:
            held.append(body)
        else:
            state = _replay_record(body, queues, state)
        off = stop
    if off < end and _damaged(view, off, fmt, last):
        # Not a torn tail the broker cuts by itself: it will not start, and what this journal held after the bad
        # record is unknown (a standing from before it could let an older store win). Nothing is published.
        raise JournalUnreadable(f"{path}: damaged at byte {off} (ha-admin journal check)")
    if not last:  # an earlier segment keeps them (an older release's recovery may have kept such a write)
        for b in held:
            state = _replay_record(b, queues, state)
    return state


def _replay_record(
    body: memoryview, queues: dict[int, tuple[dict[str, object], int]], state: dict[str, object]
) -> dict[str, object]:
    """One intact record (kind and payload) of a whole write: the queues' highest positions, the standing."""
    kind = body[0]
    try:
        if kind == _ENQUEUE:
            qid, pos = _JQPOS.unpack_from(body, 1)
            known = queues.get(qid)
            if known is not None and pos > known[1]:
                queues[qid] = (known[0], pos)
        elif kind == _QUEUE:
            (qid,) = _JQID.unpack_from(body, 1)
            doc = json.loads(bytes(body[1 + _JQID.size :]))
            known = queues.get(qid)
            highest = int(doc.get("next", 1)) - 1
            if known is not None and known[0].get("uuid") == doc.get("uuid"):
                highest = max(highest, known[1])
            queues[qid] = (doc, highest)
        elif kind == _UNQUEUE:
            (qid,) = _JQID.unpack_from(body, 1)
            queues.pop(qid, None)
        elif kind == _STATE:
            doc = json.loads(bytes(body[1:]))
            if isinstance(doc, dict) and "epoch" in doc:
                state = doc
    except (ValueError, struct.error, AttributeError, TypeError):
        pass  # a record we cannot use: the broker decides about damage when it starts
    return state


def _damaged(view: memoryview, off: int, fmt: int, last: bool) -> bool:
    """A scan stopped at byte ``off``: damage rather than a torn tail (broker/store/records.py ``_bad``)? Zeros to
    the end are the unwritten rest of a zero-filled segment; only the last segment may be torn; in a zero-filled
    segment (format 3) a bad record is damage when an intact MARK after it says it was already on disk; in an older
    one, when anything follows it."""
    if fmt < 3:  # a segment that only grows: torn only at its very end, and only the last
        length = _JFRAME.unpack_from(view, off)[0] if off + _JFRAME.size <= len(view) else 0
        return not last or off + _JFRAME.size + length < len(view)
    stop = len(view)
    while stop > off and view[stop - 1] == 0:
        stop -= 1
    if stop == off:
        return False
    if not last:
        return True
    data = bytes(view[off:stop])
    i = data.find(_JMARK_MAGIC)
    while i >= 0:
        at = off + i - _JFRAME.size - 1
        if at >= off and at + _JMARK_SIZE <= stop:
            length, crc = _JFRAME.unpack_from(view, at)
            body = view[at + _JFRAME.size : at + _JMARK_SIZE]
            if length == _JMARK_SIZE - _JFRAME.size and body[0] == _MARK and zlib.crc32(body) == crc:
                _, where, durable = _JMARK.unpack_from(body, 1)
                if where == at and durable > off:
                    return True
        i = data.find(_JMARK_MAGIC, i + 1)
    return False


def _unit_whole(view: memoryview, off: int, end: int) -> bool:
    """The records from `off` to `end` are all there and intact (a UNIT record's span)."""
    if end > len(view):
        return False
    while off < end:
        if off + _JFRAME.size > end:
            return False
        length, crc = _JFRAME.unpack_from(view, off)
        stop = off + _JFRAME.size + length
        if length == 0 or stop > end or zlib.crc32(view[off + _JFRAME.size : stop]) != crc:
            return False
        off = stop
    return True


# ---- validate-all --------------------------------------------------------------------------------------------

_HOSTPORT = re.compile(r"^(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):(?P<port>[0-9]{1,5})$")


@dataclass(frozen=True)
class Problem:
    code: int  # OCF_ERR_CONFIGURED or OCF_ERR_INSTALLED
    message: str


def check_host_port(value: str) -> bool:
    m = _HOSTPORT.match(value)
    return m is not None and 1 <= int(m.group("port")) <= 65535


def check_values(params: Mapping[str, str]) -> list[Problem]:
    """Checks that need no I/O: formats and ranges of the instance parameters."""
    problems: list[Problem] = []

    def bad(message: str) -> None:
        problems.append(Problem(OCF_ERR_CONFIGURED, message))

    port = params.get("port", "")
    if not (port.isdigit() and 1 <= int(port) <= 65535):
        bad(f"port: expected 1..65535, got {port!r}")
    urls = [u.strip() for u in params.get("brokers_url", "").split(",") if u.strip()]
    if not urls:
        bad("brokers_url: required, a comma-separated list of host:port (one per broker, not the VIP)")
    for url in urls:
        if not check_host_port(url):
            bad(f"brokers_url: {url!r} is not host:port")
    public = params.get("public_url", "")
    if public and not check_host_port(public):
        bad(f"public_url: {public!r} is not host:port")
    try:
        if float(params.get("monitor_timeout", "")) <= 0:
            bad("monitor_timeout: must be > 0 seconds")
    except ValueError:
        bad(f"monitor_timeout: expected seconds, got {params.get('monitor_timeout')!r}")
    for key in ("data_dir", "config", "bindir", "log_file", "pid_file", "admin_socket", *TLS_FILES):
        value = params.get(key, "")
        if value and not value.startswith("/"):
            bad(f"{key}: must be an absolute path, got {value!r}")
    if not params.get("data_dir"):
        bad("data_dir: required")
    elif len(admin_socket(params).encode()) > UNIX_SOCKET_PATH_MAX:
        bad(f"admin_socket: {admin_socket(params)!r} is longer than {UNIX_SOCKET_PATH_MAX} bytes")
    tls = {key: params.get(key, "") for key in TLS_FILES}
    if bool(tls["ssl_cert"]) != bool(tls["ssl_key"]):
        bad("ssl_cert: ssl_cert and ssl_key go together (the broker's certificate and its key)")
    if tls["ssl_cert"] and not tls["ssl_ca"]:
        bad("ssl_ca: required with ssl_cert (a backup verifies its primary's certificate against it)")
    if not tls["ssl_cert"] and tls["ssl_ca"]:
        bad("ssl_ca: needs ssl_cert and ssl_key")
    if tls["ssl_key_password_file"] and not tls["ssl_key"]:
        bad("ssl_key_password_file: needs ssl_cert and ssl_key")
    require = params.get("ssl_require_client_cert", "")
    if require and require.lower() not in BOOLEANS:
        bad(f"ssl_require_client_cert: expected true or false, got {require!r}")
    elif require.lower() in TRUE and not tls["ssl_cert"]:
        bad("ssl_require_client_cert: needs ssl_cert, ssl_key and ssl_ca")
    try:
        shlex.split(params.get("options", ""))
    except ValueError as exc:
        bad(f"options: {exc}")
    return problems


def broker_command(params: Mapping[str, str], ha_broker: str, node_name: str) -> list[str]:
    """The ``ha-broker`` command line that starts this instance as a backup."""
    data_dir = params["data_dir"]
    cmd = [
        ha_broker,
        "--ha-cluster",
        "--name", params.get("name") or node_name,
        "--host", params.get("host") or "0.0.0.0",
        "--port", params["port"],
        "--data-dir", data_dir,
        "--log-file", params.get("log_file") or f"{data_dir}/broker.log",
        "--pid-file", params.get("pid_file") or f"{data_dir}/broker.pid",
        "--admin-socket", admin_socket(params),
        "--ha-brokers-url", params["brokers_url"],
    ]  # fmt: skip
    if params.get("public_url"):
        cmd += ["--ha-public-url", params["public_url"]]
    if params.get("config"):
        cmd += ["--config", params["config"]]
    for key in TLS_FILES:  # TLS on the listener and towards the primary (docs/tls.md)
        if params.get(key):
            cmd += ["--" + key.replace("_", "-"), params[key]]
    if params.get("ssl_require_client_cert", "").lower() in TRUE:
        cmd += ["--ssl-require-client-cert"]
    return cmd + shlex.split(params.get("options", ""))


TLS_FILES = ("ssl_cert", "ssl_key", "ssl_key_password_file", "ssl_ca")
TRUE = ("true", "yes", "1", "on")
BOOLEANS = (*TRUE, "false", "no", "0", "off")


UNIX_SOCKET_PATH_MAX = 107  # bytes (sockaddr_un), as broker.config checks it


def admin_socket(params: Mapping[str, str]) -> str:
    """The broker's admin socket: the ``admin_socket`` parameter, else DATA_DIR/admin.sock."""
    return params.get("admin_socket") or os.path.join(params["data_dir"], "admin.sock")
