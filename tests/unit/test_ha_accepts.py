"""ha.core.accepts: consumer accepts answered once every browser's backup acknowledged the pass's dequeues."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ha.core.accepts import AcceptGroup, DequeueWaits
from ha.core.idset import PositionSet


def ps(*positions: int) -> PositionSet:
    return PositionSet(positions)


def test_a_group_is_answered_when_every_browser_acknowledged_all_its_positions() -> None:
    g: AcceptGroup[str] = AcceptGroup(["t1", "t2"])
    b1: DequeueWaits[str] = DequeueWaits()
    b2: DequeueWaits[str] = DequeueWaits()
    b1.add(ps(3, 4, 9), g)
    b2.add(ps(3, 4, 9), g)
    assert b1.acked(ps(3, 4)) == []  # 9 still missing
    assert b1.acked(ps(9, 10)) == []  # b1 done, b2 not yet
    assert b2.acked(ps(1, 2, 3, 4, 5, 6, 7, 8, 9)) == ["t1", "t2"]
    assert not b1 and not b2


def test_groups_complete_independently_and_unrelated_acknowledgements_do_nothing() -> None:
    w: DequeueWaits[int] = DequeueWaits()
    g1, g2 = AcceptGroup([1]), AcceptGroup([2])
    w.add(ps(1, 2), g1)
    w.add(ps(5), g2)
    assert w.acked(ps(7, 8)) == []
    assert w.acked(ps(5)) == [2]
    assert w.acked(ps(1, 2)) == [1]


def test_a_browser_that_goes_away_stops_holding_its_groups() -> None:
    g: AcceptGroup[str] = AcceptGroup(["t"])
    gone: DequeueWaits[str] = DequeueWaits()
    stays: DequeueWaits[str] = DequeueWaits()
    gone.add(ps(1), g)
    stays.add(ps(1), g)
    assert gone.drop() == []
    assert stays.acked(ps(1)) == ["t"]


def test_nothing_to_wait_for_and_over_release_are_told_apart() -> None:
    g: AcceptGroup[str] = AcceptGroup(["t"])
    assert DequeueWaits[str]().add(PositionSet(), g) == [] and g.waiting == 0  # the caller answers at once
    with pytest.raises(ValueError):
        g.release_one()


@given(st.lists(st.sets(st.integers(1, 60), min_size=1), min_size=1, max_size=8),
       st.lists(st.sets(st.integers(1, 60)), max_size=12))
def test_a_group_completes_exactly_when_its_positions_are_covered(groups: list[set[int]], acks: list[set[int]]) -> None:
    w: DequeueWaits[int] = DequeueWaits()
    for i, positions in enumerate(groups):
        w.add(PositionSet(positions), AcceptGroup([i]))
    covered: set[int] = set()
    answered: list[int] = []
    for a in acks:
        covered |= a
        answered += w.acked(PositionSet(a))
        assert sorted(answered) == [i for i, g in enumerate(groups) if g <= covered]
