"""Membership values and their wire form; ranking by (epoch, position); the peer-epoch check."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ha.core.epoch import Decision, Rank, best_candidate, check_peer_epoch, rank_candidates
from ha.core.membership import Member, Membership
from ha.core.states import HaState, Role

B1 = Member("b1", "127.0.0.1:5672", Role.PRIMARY, HaState.ACTIVE)
B2 = Member.of("b2", "127.0.0.1:5673", HaState.CATCHUP)
B3 = Member.of("b3", "127.0.0.1:5674", HaState.READY)


def test_members_are_kept_sorted_so_every_broker_holds_the_same_list() -> None:
    a = Membership(3).with_member(B3).with_member(B1).with_member(B2)
    b = Membership(3, (B2, B3, B1))
    assert a == b and a.names == ("b1", "b2", "b3")
    assert a.primary == B1


def test_with_member_replaces_by_name_and_without_removes() -> None:
    m = Membership(1, (B1, B2))
    ready = Member.of("b2", B2.address, HaState.READY)
    assert m.with_member(ready).get("b2") == ready
    assert m.without("b2").names == ("b1",)
    assert m.without("zz") == m
    assert m.with_epoch(2).epoch == 2 and m.epoch == 1


def test_wire_round_trip_and_event_members() -> None:
    m = Membership(4, (B1, B2, B3))
    wire = m.to_wire()
    assert wire["members"][0] == {  # type: ignore[index]
        "name": "b1",
        "address": "127.0.0.1:5672",
        "role": "primary",
        "state": "active",
    }
    assert Membership.from_wire(wire) == m
    assert m.event_members()[1] == {"name": "b2", "address": "127.0.0.1:5673", "state": "catchup"}


@pytest.mark.parametrize(
    ("wire", "words"),
    [
        ([], "map"),
        ({"members": []}, "epoch"),
        ({"epoch": True, "members": []}, "epoch"),
        ({"epoch": 1, "members": "b1"}, "list"),
        ({"epoch": 1, "members": [{"name": "b1"}]}, "lacks address, role, state"),
        (
            {"epoch": 1, "members": [{"name": "b1", "address": 5, "role": "backup", "state": "ready"}]},
            "strings",
        ),
        (
            {"epoch": 1, "members": [{"name": "b1", "address": "h:1", "role": "boss", "state": "ready"}]},
            "boss",
        ),
        (
            {"epoch": 1, "members": [{"name": "b1", "address": "h:1", "role": "primary", "state": "ready"}]},
            "match",
        ),
        ({"epoch": -1, "members": []}, ">= 0"),
        ({"epoch": 1, "members": [B1.to_wire(), B1.to_wire()]}, "duplicate"),
    ],
)
def test_from_wire_rejects_malformed_maps(wire: object, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        Membership.from_wire(wire)


def test_member_role_must_follow_its_state() -> None:
    with pytest.raises(ValueError, match="ready broker is backup"):
        Member("b1", "h:1", Role.PRIMARY, HaState.READY)


def test_rank_orders_by_epoch_then_member_list_then_position() -> None:
    assert Rank(2, 1) > Rank(1, 1000) > Rank(1, 999)
    assert Rank(1, 5, view=3) > Rank(1, 900, view=2) > Rank(1, 899, view=2) > Rank(1, 10**6)
    assert Rank(2, 0, view=1) > Rank(1, 900, view=9)
    assert max([Rank(1, 7, view=2), Rank(1, 7, view=3), Rank(1, 8, view=2)]) == Rank(1, 7, view=3)
    cands = [("b1", Rank(1, 500)), ("b2", Rank(2, 10)), ("b3", Rank(2, 10)), ("b4", Rank(2, 9))]
    assert rank_candidates(cands) == ["b2", "b3", "b4", "b1"]
    assert best_candidate(cands) == "b2" and best_candidate([]) is None


@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 3)), min_size=1, unique=True))
def test_best_candidate_does_not_depend_on_input_order(ranks: list[tuple[int, int]]) -> None:
    cands = [(f"b{i}", Rank(*r)) for i, r in enumerate(ranks)]
    assert best_candidate(cands) == best_candidate(list(reversed(cands)))
    best = best_candidate(cands)
    assert dict(cands)[best] == max(r for _, r in cands)  # type: ignore[index]


@pytest.mark.parametrize(
    ("role", "mine", "theirs", "decision"),
    [
        (Role.BACKUP, 3, 3, Decision.ACCEPT),
        (Role.BACKUP, 3, 2, Decision.REFUSE_STALE),
        (Role.BACKUP, 3, 4, Decision.ADOPT_NEWER),
        (Role.PRIMARY, 3, 3, Decision.ACCEPT),
        (Role.PRIMARY, 3, 2, Decision.ACCEPT),  # a backup of the old primary reconnecting after failover
        (Role.PRIMARY, 3, 4, Decision.DEMOTE),
    ],
)
def test_peer_epoch_check(role: Role, mine: int, theirs: int, decision: Decision) -> None:
    check = check_peer_epoch(mine, theirs, my_role=role)
    assert check.decision is decision
    assert str(mine) in check.reason and str(theirs) in check.reason


def test_peer_epoch_check_rejects_nonsense() -> None:
    with pytest.raises(ValueError):
        check_peer_epoch(1, 1, my_role=Role.STANDALONE)
    with pytest.raises(ValueError):
        check_peer_epoch(1, -1, my_role=Role.BACKUP)
