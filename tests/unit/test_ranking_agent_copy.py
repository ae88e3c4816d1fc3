"""One ranking rule: the OCF agent's standard-library promotion scores (resource_agents/agent_core.py) pick the
ready backup that `ha.core.epoch.best_candidate` picks (ZooKeeper's election and understudy-cluster use it), for any
set of ready backups; equal (epoch, member list, position) get equal scores, so Pacemaker's own tie-break is among
equals only. And its brand-new rule is ha.core.promotion's."""

from __future__ import annotations

import sys
from itertools import pairwise
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from ha.core.epoch import Rank, best_candidate, rank_candidates
from ha.core.promotion import brand_new
from ha.core.states import HaState

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "resource_agents"))
import agent_core as core

RANKS = st.lists(st.tuples(st.integers(1, 4), st.integers(0, 6), st.integers(0, 3)), min_size=1, max_size=6)


@given(RANKS)
def test_the_agent_scores_rank_ready_backups_as_ha_core_does(ranks: list[tuple[int, int, int]]) -> None:
    """(epoch, position, member list) triples."""
    names = [f"n{i}" for i in range(len(ranks))]
    statuses = {n: core.BrokerStatus("backup", "ready", e, p, view=v) for n, (e, p, v) in zip(names, ranks,
                                                                                            strict=True)}
    scores = {n: core.promotion_score(n, s, statuses) for n, s in statuses.items()}
    best = best_candidate((n, Rank(e, p, v)) for n, (e, p, v) in zip(names, ranks, strict=True))
    top = max(v for v in scores.values() if v is not None)
    assert scores[best] == top
    winners = {n for n, v in scores.items() if v == top}
    assert winners == {n for n in names if ranks[names.index(n)] == ranks[names.index(best)]}
    # and the whole order: a better rank never scores lower
    order = rank_candidates((n, Rank(e, p, v)) for n, (e, p, v) in zip(names, ranks, strict=True))
    got = [scores[n] for n in order]
    assert all(a is not None and b is not None and a >= b for a, b in pairwise(got))


@given(st.sampled_from(list(HaState)), st.integers(0, 3))
def test_the_agents_brand_new_rule_is_ha_cores(state: HaState, epoch: int) -> None:
    """A broker that never followed a primary may become a new cluster's first primary: the agent's copy
    (`_brand_new`) says so of exactly the brokers `ha.core.promotion.brand_new` does."""
    status = core.BrokerStatus(state.role.value, state.value, epoch, 0)
    assert core._brand_new(status) == brand_new(state, epoch)
