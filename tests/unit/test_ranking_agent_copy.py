"""One ranking rule: the OCF agent's standard-library promotion scores (resource_agents/agent_core.py) pick the
ready backup that `ha.core.epoch.best_candidate` picks (ZooKeeper's election and understudy-cluster use it), for any
set of ready backups; equal (epoch, position) get equal scores, so Pacemaker's own tie-break is among equals only."""

from __future__ import annotations

import sys
from itertools import pairwise
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from ha.core.epoch import Rank, best_candidate, rank_candidates

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "resource_agents"))
import agent_core as core

RANKS = st.lists(st.tuples(st.integers(1, 4), st.integers(0, 6)), min_size=1, max_size=6)


@given(RANKS)
def test_the_agent_scores_rank_ready_backups_as_ha_core_does(ranks: list[tuple[int, int]]) -> None:
    names = [f"n{i}" for i in range(len(ranks))]
    statuses = {n: core.BrokerStatus("backup", "ready", e, p) for n, (e, p) in zip(names, ranks, strict=True)}
    scores = {n: core.promotion_score(n, s, statuses) for n, s in statuses.items()}
    best = best_candidate((n, Rank(e, p)) for n, (e, p) in zip(names, ranks, strict=True))
    top = max(v for v in scores.values() if v is not None)
    assert scores[best] == top
    winners = {n for n, v in scores.items() if v == top}
    assert winners == {n for n in names if ranks[names.index(n)] == ranks[names.index(best)]}
    # and the whole order: a better rank never scores lower
    order = rank_candidates((n, Rank(e, p)) for n, (e, p) in zip(names, ranks, strict=True))
    got = [scores[n] for n in order]
    assert all(a is not None and b is not None and a >= b for a, b in pairwise(got))
