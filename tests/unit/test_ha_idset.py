"""PositionSet: set arithmetic checked against Python sets, the wire form, and range (not element) costs."""

from __future__ import annotations

import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ha.core.idset import PositionSet

small = st.integers(min_value=1, max_value=200)
ranges = st.tuples(small, small).map(lambda t: (min(t), max(t)))
op = st.tuples(st.sampled_from(["add", "discard"]), ranges)


def as_set(s: PositionSet) -> set[int]:
    return set(s)


def is_normal(s: PositionSet) -> bool:
    """Ranges ascending, disjoint and not adjacent; len matches."""
    rs = s.ranges()
    ok = all(lo <= hi for lo, hi in rs) and all(rs[i][1] + 1 < rs[i + 1][0] for i in range(len(rs) - 1))
    return ok and len(s) == sum(hi - lo + 1 for lo, hi in rs)


@given(st.lists(op, max_size=40))
def test_add_and_discard_ranges_behave_like_a_python_set(ops: list[tuple[str, tuple[int, int]]]) -> None:
    s, model = PositionSet(), set[int]()
    for name, (lo, hi) in ops:
        if name == "add":
            s.add_range(lo, hi)
            model |= set(range(lo, hi + 1))
        else:
            s.discard_range(lo, hi)
            model -= set(range(lo, hi + 1))
        assert is_normal(s)
    assert as_set(s) == model
    assert len(s) == len(model)
    assert list(s) == sorted(model)
    assert list(reversed(s)) == sorted(model, reverse=True)
    for p in range(1, 202):
        assert (p in s) is (p in model)
    if model:
        assert (s.min(), s.max()) == (min(model), max(model))


@given(st.sets(small), st.sets(small))
def test_union_intersection_difference_match_python_sets(a: set[int], b: set[int]) -> None:
    pa, pb = PositionSet(a), PositionSet(b)
    for result, expected in [(pa | pb, a | b), (pa & pb, a & b), (pa - pb, a - b), (pb - pa, b - a)]:
        assert is_normal(result)
        assert as_set(result) == expected
    assert pa.issubset(pb) is a.issubset(b)
    assert (pa, pb) == (PositionSet(a), PositionSet(b)), "operands must not change"


@given(st.sets(small))
def test_wire_round_trip(a: set[int]) -> None:
    s = PositionSet(a)
    assert PositionSet.from_wire(s.to_wire()) == s


@given(st.sets(small), st.sets(small))
def test_update_and_difference_update(a: set[int], b: set[int]) -> None:
    s = PositionSet(a)
    s.update(PositionSet(b))
    assert as_set(s) == a | b
    s.difference_update(b)
    assert as_set(s) == a - b


def test_adjacent_ranges_merge_and_split() -> None:
    s = PositionSet.from_ranges([(1, 3), (7, 9), (4, 6)])
    assert s.ranges() == [(1, 9)]
    s.discard(5)
    assert s.ranges() == [(1, 4), (6, 9)]
    assert repr(s) == "PositionSet({1-4, 6-9})"
    assert s.pop_max() == 9 and s.ranges() == [(1, 4), (6, 8)]


@pytest.mark.parametrize(
    ("wire", "words"),
    [
        ("1-3", "list"),
        ([[1, 2, 3]], "pair"),
        ([[1, "2"]], "int"),
        ([[1.0, 2]], "int"),
        ([[True, 2]], "int"),
        ([[0, 2]], "start at 1"),
        ([[-5, 2]], "start at 1"),
        ([[3, 2]], "lo > hi"),
        ([[1, 5], [5, 8]], "overlaps"),
        ([[6, 8], [1, 2]], "ascending"),
    ],
)
def test_from_wire_rejects_malformed_input_with_a_clear_message(wire: object, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        PositionSet.from_wire(wire)


def test_from_wire_accepts_adjacent_ranges_and_normalises() -> None:
    assert PositionSet.from_wire([[1, 2], [3, 4], [9, 9]]).to_wire() == [[1, 4], [9, 9]]
    assert PositionSet.from_wire([]) == PositionSet()


def test_bad_local_arguments_raise() -> None:
    s = PositionSet()
    with pytest.raises(ValueError):
        s.add(0)
    with pytest.raises(ValueError):
        s.add_range(5, 4)
    with pytest.raises(TypeError):
        s.add(True)
    with pytest.raises(ValueError):
        s.max()
    with pytest.raises(KeyError):
        s.pop_max()
    assert "3" not in s


def test_a_million_contiguous_positions_cost_one_range() -> None:
    """Operations on 1M positions must not walk the positions: compared with a 100-position set, not a wall clock."""

    def work(n: int) -> float:
        start = time.perf_counter()
        for _ in range(200):
            s = PositionSet.from_ranges([(1, n)])
            s.discard_range(n // 2, n // 2)
            t = s.difference(PositionSet.from_ranges([(10, n - 10)])).union(s)
            assert len(t.intersection(s)) == n - 1 and (n // 2 + 1) in t
            PositionSet.from_wire(t.to_wire())
        return time.perf_counter() - start

    small_cost, big_cost = work(100), work(1_000_000)
    assert len(PositionSet.from_ranges([(1, 1_000_000)]).ranges()) == 1
    # O(n) would be ~10000x slower; allow generous noise on a loaded machine.
    assert big_cost < small_cost * 20 + 0.5
