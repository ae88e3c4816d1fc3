"""A backup applies a replicated transaction all or none (ha.core.txnparts): parts are held until their unit is
whole, per queue nothing overtakes a held part, and what is held when the connection ends is discarded."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ha.core.txnparts import TxnParts, TxnPartsError


def test_a_batch_outside_any_transaction_is_applied_at_once() -> None:
    t: TxnParts[str] = TxnParts()
    assert t.arrive("a", "a1", []) == [("a", "a1")]
    assert not t.holding


def test_the_parts_of_a_unit_are_released_together_when_the_last_comes() -> None:
    t: TxnParts[str] = TxnParts()
    assert t.arrive("a", "a-part", [(7, 2)]) == []
    assert t.arrive("c", "c1", []) == [("c", "c1")]  # another queue is not held up
    assert t.arrive("a", "a-later", []) == []  # behind the held part, in order
    assert t.holding
    assert t.arrive("b", "b-part", [(7, 2)]) == [("a", "a-part"), ("a", "a-later"), ("b", "b-part")]
    assert not t.holding and t.clear() == (0, 0)


def test_a_single_part_unit_is_applied_at_once() -> None:
    t: TxnParts[str] = TxnParts()
    assert t.arrive("a", "a", [(1, 1)]) == [("a", "a")]


def test_a_connection_lost_with_a_unit_incomplete_discards_it_whole() -> None:
    t: TxnParts[str] = TxnParts()
    t.arrive("a", "a-part", [(3, 3)])
    t.arrive("b", "b-part", [(3, 3)])
    t.arrive("b", "b-later", [])
    assert t.clear() == (1, 3)
    assert not t.holding
    assert t.arrive("c", "c-part", [(3, 2)]) == []  # a new connection: the old unit is forgotten


def test_a_later_unit_waits_behind_an_earlier_part_of_the_same_queue() -> None:
    t: TxnParts[str] = TxnParts()
    assert t.arrive("a", "u1-a", [(1, 2)]) == []
    assert t.arrive("a", "u2-a", [(2, 2)]) == []  # queued behind u1's part, not yet counted
    assert t.arrive("b", "u2-b", [(2, 2)]) == []  # u2 lacks its part on a: held
    got = t.arrive("c", "u1-c", [(1, 2)])
    assert got == [("a", "u1-a"), ("c", "u1-c"), ("b", "u2-b"), ("a", "u2-a")]
    assert not t.holding


def test_a_batch_of_several_units_waits_for_all_of_them() -> None:
    t: TxnParts[str] = TxnParts()
    assert t.arrive("a", "a-u1-u2", [(1, 2), (2, 2)]) == []
    assert t.arrive("b", "b-u1", [(1, 2)]) == []  # u1 is complete, but joined to u2 through a's batch
    got = t.arrive("c", "c-u2", [(2, 2)])
    assert sorted(got) == [("a", "a-u1-u2"), ("b", "b-u1"), ("c", "c-u2")]
    assert not t.holding


def test_parts_that_disagree_on_their_number_are_refused() -> None:
    t: TxnParts[str] = TxnParts()
    t.arrive("a", "x", [(1, 2)])
    with pytest.raises(TxnPartsError, match="a part says 3 parts, another 2"):
        t.arrive("b", "y", [(1, 3)])


def test_two_parts_of_a_unit_on_one_queue_are_refused() -> None:
    t: TxnParts[str] = TxnParts()
    with pytest.raises(TxnPartsError, match="two parts on queue 'a'"):
        t.arrive("a", "x", [(1, 3), (1, 3)])


def test_more_parts_than_announced_are_refused() -> None:
    t: TxnParts[str] = TxnParts()
    t.arrive("a", "x", [(1, 2), (2, 1)])  # joined: waits for unit 1's second part
    t.arrive("b", "y", [(1, 2), (3, 5)])  # unit 1 complete, joined to unit 3 (incomplete): held
    with pytest.raises(TxnPartsError, match="more than its 2 parts"):
        t.arrive("c", "z", [(1, 2)])


# ----- any interleaving of what a primary sends -------------------------------------------------------------------
QUEUES = ["a", "b", "c", "d"]


@st.composite
def _sent(draw: st.DrawFn) -> tuple[dict[str, list[tuple[str, list[tuple[int, int]]]]], dict[int, set[str]]]:
    """What a primary sends, per queue in order: plain batches and units (one part on each queue they touch)."""
    streams: dict[str, list[tuple[str, list[tuple[int, int]]]]] = {q: [] for q in QUEUES}
    units: dict[int, set[str]] = {}
    for i in range(draw(st.integers(1, 12))):
        if draw(st.booleans()):
            q = draw(st.sampled_from(QUEUES))
            streams[q].append((f"{q}{i}", []))
        else:
            touched = draw(st.sets(st.sampled_from(QUEUES), min_size=1))
            units[i + 1] = touched
            for q in sorted(touched):
                streams[q].append((f"{q}{i}", [(i + 1, len(touched))]))
    return streams, units


@settings(max_examples=400, deadline=None)
@given(_sent(), st.randoms(use_true_random=False))
def test_any_interleaving_applies_each_unit_in_one_go_and_each_queue_in_order(
        sent: tuple[dict[str, list[tuple[str, list[tuple[int, int]]]]], dict[int, set[str]]], rnd: object) -> None:
    import random

    assert isinstance(rnd, random.Random)
    streams, units = sent
    cursors = dict.fromkeys(QUEUES, 0)
    t: TxnParts[str] = TxnParts()
    applied: dict[str, list[str]] = {q: [] for q in QUEUES}
    part_of = {item: txns[0][0] for q in QUEUES for item, txns in streams[q] if txns}
    while True:
        left = [q for q in QUEUES if cursors[q] < len(streams[q])]
        if not left:
            break
        q = rnd.choice(left)
        item, txns = streams[q][cursors[q]]
        cursors[q] += 1
        out = t.arrive(q, item, txns)
        got_units: dict[int, int] = {}
        for oq, oitem in out:
            applied[oq].append(oitem)
            if oitem in part_of:
                got_units[part_of[oitem]] = got_units.get(part_of[oitem], 0) + 1
        for u, n in got_units.items():
            assert n == len(units[u]), f"unit {u}: {n} of {len(units[u])} parts applied in one go"
    assert applied == {q: [item for item, _ in streams[q]] for q in QUEUES}
    assert not t.holding
