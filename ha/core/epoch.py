"""Epochs: ranking brokers by how current their data is, and checking a peer's epoch on a replication link.

Each promotion raises the cluster epoch. A broker's *rank* is (epoch, position): a higher epoch wins; within an
epoch, the higher position (newest replicated data) wins. Ties are broken by name so every judge picks the same one.

On a replication link the two ends are a primary and a backup, and they judge differently:

============  =========================  ==============================================================
I am          peer's epoch vs mine        decision
============  =========================  ==============================================================
backup        lower (stale primary)       ``REFUSE_STALE``: close the link, log ``ha.epoch.refused``
backup        higher                      ``ADOPT_NEWER``: persist the peer's epoch, then carry on
primary       lower (backup from before)  ``ACCEPT``: normal after a failover; the backup adopts mine
primary       higher                      ``DEMOTE``: someone was promoted after me; step down
either        equal                       ``ACCEPT``
============  =========================  ==============================================================
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum

from ha.core.states import Role


@functools.total_ordering
@dataclass(frozen=True)
class Rank:
    """How current a broker's replicated data is; compare with <, >, max(): the epoch first, then the number of the
    newest member list of that epoch it holds (`view`, 0 where unknown), then its position. A ready backup its
    primary dropped stays a candidate (it holds every message confirmed while it was ready); the list that drops
    it ranks every backup that holds it higher, and the primary settles nothing without the dropped one before
    each ready backup holds that list (ha.primary.Primary.view_fence_open)."""

    epoch: int
    position: int
    view: int = 0

    @property
    def key(self) -> tuple[int, int, int]:
        return (self.epoch, self.view, self.position)

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, Rank):
            return NotImplemented
        return self.key < other.key


def best_candidate(candidates: Iterable[tuple[str, Rank]]) -> str | None:
    """The name with the highest rank (ties: the smallest name); None if there are none."""
    ordered = rank_candidates(candidates)
    return ordered[0] if ordered else None


def rank_candidates(candidates: Iterable[tuple[str, Rank]]) -> list[str]:
    """Names ordered best first: higher rank (epoch, member list, position), then name ascending."""
    return [name for name, _ in sorted(candidates, key=lambda c: (*(-k for k in c[1].key), c[0]))]


class Decision(Enum):
    ACCEPT = "accept"
    REFUSE_STALE = "refuse-stale"
    ADOPT_NEWER = "adopt-newer"
    DEMOTE = "demote"


@dataclass(frozen=True)
class EpochCheck:
    decision: Decision
    reason: str
    mine: int
    theirs: int


def check_peer_epoch(mine: int, theirs: int, *, my_role: Role) -> EpochCheck:
    """Judge the epoch ``theirs`` announced by the other end of a replication link (see the module table)."""
    if my_role is Role.STANDALONE:
        raise ValueError("a standalone broker has no replication peers")
    for label, value in (("mine", mine), ("theirs", theirs)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"epoch ({label}) must be an int >= 0, got {value!r}")
    if theirs == mine:
        return EpochCheck(Decision.ACCEPT, f"same epoch {mine}", mine, theirs)
    if my_role is Role.BACKUP:
        if theirs < mine:
            return EpochCheck(
                Decision.REFUSE_STALE,
                f"primary epoch {theirs} is older than ours ({mine}): stale primary",
                mine,
                theirs,
            )
        return EpochCheck(
            Decision.ADOPT_NEWER, f"primary epoch {theirs} is newer than ours ({mine})", mine, theirs
        )
    if theirs < mine:
        return EpochCheck(
            Decision.ACCEPT,
            f"backup epoch {theirs} is older than ours ({mine}): it will adopt ours",
            mine,
            theirs,
        )
    return EpochCheck(
        Decision.DEMOTE,
        f"backup has seen epoch {theirs}, newer than ours ({mine}): this primary is stale",
        mine,
        theirs,
    )
