"""GuardBook: a client delivery is settled only when every guarding backup released every place it was put."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ha.core.guards import GuardBook, InFlight
from ha.core.idset import PositionSet


def book(*backups: str) -> GuardBook[str]:
    g: GuardBook[str] = GuardBook()
    for b in backups:
        g.add_backup(b)
    return g


def test_without_backups_settle_at_once() -> None:
    g = book()
    assert g.hold("d1", [("q", 1)], now=1.0) is False
    assert not g.is_held("d1")
    g.add_backup("b1")
    assert g.hold("d2", [], now=1.0) is False  # no replicated queue


def test_released_only_when_every_backup_acknowledged() -> None:
    g = book("b1", "b2")
    assert g.hold("d1", [("q", 1)], now=10.0, nbytes=100)
    r = g.acked("b1", "q", [1])
    assert r.released == () and r.acked == ((1, 10.0),) and r.ignored == 0
    assert g.is_held("d1")
    assert g.acked("b2", "q", [1]).released == ("d1",)
    assert not g.is_held("d1") and g.stats().places_held == 0


def test_a_token_on_several_queues_waits_for_all_of_them() -> None:
    g = book("b1", "b2")
    g.hold("fanout", [("q1", 5), ("q2", 7)], now=1.0)
    for backup, queue, pos in [("b1", "q1", 5), ("b2", "q2", 7), ("b2", "q1", 5)]:
        assert g.acked(backup, queue, [pos]).released == ()
    assert g.acked("b1", "q2", [7]).released == ("fanout",)


def test_range_acknowledgement_releases_many_in_order() -> None:
    g = book("b1")
    for p in range(1, 6):
        g.hold(f"d{p}", [("q", p)], now=float(p))
    r = g.acked("b1", "q", PositionSet.from_ranges([(2, 4)]))
    assert r.released == ("d2", "d3", "d4")
    assert [ts for _, ts in r.acked] == [2.0, 3.0, 4.0]


def test_dequeued_on_the_primary_before_the_acknowledgement() -> None:
    g = book("b1", "b2")
    g.hold("d1", [("q", 1)], now=1.0)
    g.hold("d2", [("q", 2), ("r", 1)], now=2.0)
    g.acked("b1", "q", [1])
    assert g.dequeued("q", 1) == ["d1"]  # b2 no longer has to acknowledge it
    assert g.dequeued("q", [2]) == []  # d2 still waits for r:1
    assert g.backlog("b1") == 1 and g.backlog("b2") == 1
    late = g.acked("b2", "q", [1, 2])  # late acknowledgements of dequeued positions
    assert late.released == () and late.ignored == 2
    assert g.acked("b1", "r", [1]).released == ()
    assert g.acked("b2", "r", [1]).released == ("d2",)
    assert (
        g.dequeued("q", PositionSet.from_ranges([(1, 1000)])) == []
    )  # unguarded dequeues are the usual case


def test_dropping_a_backup_releases_what_it_alone_held_up() -> None:
    g = book("b1", "b2")
    g.hold("d1", [("q", 1)], now=1.0)
    g.hold("d2", [("q", 2)], now=2.0)
    g.acked("b1", "q", [1])
    assert g.drop_backup("b2") == ["d1"]  # d2 still waits for b1
    assert g.backups == frozenset({"b1"})
    assert g.acked("b2", "q", [2]).ignored == 1  # a dropped backup's late acknowledgement
    assert g.is_held("d2")
    assert g.drop_backup("b1") == ["d2"]
    assert g.drop_backup("b1") == []


def test_a_backup_guards_only_holds_made_after_it_was_added() -> None:
    g = book("b1")
    g.hold("d1", [("q", 1)], now=1.0)
    g.add_backup("b2")
    g.hold("d2", [("q", 2)], now=2.0)
    assert g.backlog("b2") == 1 and g.outstanding("b2", "q") == PositionSet([2])
    assert g.acked("b1", "q", [1]).released == ("d1",)


def test_hold_restricted_to_some_backups() -> None:
    g = book("b1", "b2")
    g.hold("d1", [("q", 1)], now=1.0, backups=["b1"])
    assert g.acked("b2", "q", [1]).ignored == 1
    assert g.acked("b1", "q", [1]).released == ("d1",)
    assert g.hold("d2", [("q", 2)], now=1.0, backups=[]) is False


def test_unknown_acknowledgements_are_ignored_counted_and_release_nothing() -> None:
    g = book("b1")
    g.hold("d1", [("q", 3)], now=1.0)
    assert g.acked("b1", "q", [1, 2, 4]).ignored == 3
    assert g.acked("b1", "other", [3]).ignored == 1
    assert g.acked("nobody", "q", [3]).ignored == 1
    assert g.is_held("d1")
    assert g.stats().ignored_acks == 5
    r = g.acked("b1", "q", [2, 3, 4])
    assert r.released == ("d1",) and r.ignored == 2


def test_backlog_in_flight_and_oldest_unacknowledged() -> None:
    g = book("b1", "b2")
    assert g.oldest_unacked_ts("b1") is None and g.in_flight("zz") == InFlight(0, 0)
    g.hold("d1", [("q", 1)], now=100.0, nbytes=10)
    g.hold("d2", [("q", 2), ("r", 1)], now=101.0, nbytes=20)
    assert g.backlog("b1") == 3 and g.in_flight("b1") == InFlight(3, 50)
    assert g.oldest_unacked_ts("b1") == 100.0
    g.acked("b1", "q", [1])
    assert g.oldest_unacked_ts("b1") == 101.0 and g.oldest_unacked_ts("b2") == 100.0
    g.acked("b1", "q", [2])
    g.acked("b1", "r", [1])
    assert g.oldest_unacked_ts("b1") is None and g.in_flight("b1") == InFlight(0, 0)
    assert g.backlog("b2") == 3


def test_forget_queue_releases_its_guards() -> None:
    g = book("b1")
    g.hold("d1", [("q", 1)], now=1.0)
    g.hold("d2", [("q", 2), ("r", 1)], now=1.0)
    assert g.forget_queue("q") == ["d1"]
    assert g.backlog("b1") == 1
    g.hold("d3", [("q", 1)], now=2.0)  # the recreated queue numbers from 1 again
    assert g.oldest_unacked_ts("b1") == 1.0


@pytest.mark.parametrize(
    ("token", "places", "kwargs", "words"),
    [
        ("held", [("q", 9)], {}, "already held"),
        ("new", [("q", 1)], {}, "already held"),
        ("new", [("q", 2), ("q", 2)], {}, "duplicate"),
        ("new", [("q", 0)], {}, ">= 1"),
        ("new", [("q", 3)], {"backups": ["b9"]}, "unknown backups"),
    ],
)
def test_misuse_raises_and_changes_nothing(
    token: str, places: list[tuple[str, int]], kwargs: dict[str, list[str]], words: str
) -> None:
    g = book("b1")
    g.hold("held", [("q", 1)], now=1.0)
    with pytest.raises(ValueError, match=words):
        g.hold(token, places, now=2.0, **kwargs)  # type: ignore[arg-type]
    assert g.backlog("b1") == 1 and not g.is_held("new")
    with pytest.raises(ValueError, match="already guarding"):
        g.add_backup("b1")


@settings(max_examples=100, deadline=None)
@given(st.data())
def test_against_a_model_in_any_order(data: st.DataObject) -> None:
    """Random holds, acknowledgements (incl. unknown), dequeues, drops and adds, checked against a plain model."""
    g: GuardBook[int] = GuardBook()
    backups: set[str] = set()
    waiting: dict[int, set[tuple[str, str, int]]] = {}  # token -> (backup, queue, position) still outstanding
    hold_ts: dict[tuple[str, int], float] = {}
    next_pos = {"q1": 1, "q2": 1}
    released_ever: list[int] = []
    for step in range(data.draw(st.integers(1, 50))):
        kind = data.draw(st.sampled_from(["add", "drop", "hold", "hold", "ack", "ack", "deq"]))
        released: list[int] = []
        if kind == "add":
            name = data.draw(st.sampled_from(["b1", "b2", "b3"]))
            if name not in backups:
                g.add_backup(name)
                backups.add(name)
        elif kind == "drop":
            name = data.draw(st.sampled_from(["b1", "b2", "b3"]))
            backups.discard(name)
            released = g.drop_backup(name)
            for w in waiting.values():
                w -= {x for x in w if x[0] == name}
        elif kind == "hold":
            queues = data.draw(st.sets(st.sampled_from(["q1", "q2"]), min_size=1))
            places = [(q, next_pos[q]) for q in sorted(queues)]
            for q in queues:
                next_pos[q] += 1
            assert g.hold(step, places, now=float(step)) is bool(backups)
            if backups:
                waiting[step] = {(b, q, p) for b in backups for q, p in places}
                hold_ts.update({pl: float(step) for pl in places})
        elif kind == "ack":
            name = data.draw(st.sampled_from(["b1", "b2", "b3"]))
            q = data.draw(st.sampled_from(["q1", "q2"]))
            positions = data.draw(st.sets(st.integers(1, next_pos[q] + 2)))
            as_ranges = data.draw(st.booleans())  # both argument forms: ranges and a plain list
            r = g.acked(name, q, PositionSet(positions) if as_ranges else sorted(positions))
            released = list(r.released)
            expected_known = {p for p in positions if any((name, q, p) in w for w in waiting.values())}
            assert {p for p, _ in r.acked} == expected_known
            assert r.ignored == len(positions) - len(expected_known)
            for w in waiting.values():
                w -= {(name, q, p) for p in positions}
        else:
            q = data.draw(st.sampled_from(["q1", "q2"]))
            positions = data.draw(st.sets(st.integers(1, next_pos[q] + 2)))
            released = g.dequeued(q, PositionSet(positions) if data.draw(st.booleans()) else positions)
            for w in waiting.values():
                w -= {x for x in w if x[1] == q and x[2] in positions}
        # A token is released exactly when its last outstanding guard went, exactly once.
        done = {t for t, w in waiting.items() if not w}
        assert sorted(released) == sorted(done)
        for t in done:
            del waiting[t]
        released_ever += released
        for name in backups:
            mine = [(q, p) for w in waiting.values() for (b, q, p) in w if b == name]
            assert g.backlog(name) == len(mine)
            assert g.oldest_unacked_ts(name) == (min(hold_ts[x] for x in mine) if mine else None)
    assert len(released_ever) == len(set(released_ever))
    assert all(g.is_held(t) for t in waiting)


def test_junk_in_an_acknowledgement_is_ignored_not_raised() -> None:
    g = book("b1")
    g.hold("d1", [("q", 1)], now=1.0)
    r = g.acked("b1", "q", [0, -3, "1", True, None, 1.0, 1])
    assert r.released == ("d1",) and r.ignored == 6


# -- in-order acknowledgement after start() (live replication) --------------------------------------------------------


def test_after_start_an_acknowledgement_covers_every_earlier_live_place() -> None:
    g = book("b1")
    g.start("b1", "q", floor=0)
    for p in range(1, 6):
        g.hold(f"d{p}", [("q", p)], now=float(p), nbytes=10)
    r = g.acked("b1", "q", [4])  # the backup applied 1..4 in order; one ack says so
    assert r.released == ("d1", "d2", "d3", "d4") and [p for p, _ in r.acked] == [1, 2, 3, 4]
    assert g.backlog("b1") == 1 and g.in_flight("b1") == InFlight(1, 10)


def test_catch_up_places_below_the_floor_are_released_only_exactly() -> None:
    """Places held between the backup's connect and its browser's attach are sent by catch-up, newest first:
    acknowledging the newest must not release the older ones."""
    g = book("b1")
    for p in range(1, 6):
        g.hold(f"d{p}", [("q", p)], now=float(p))
    g.start("b1", "q", floor=5)
    assert g.acked("b1", "q", [5]).released == ("d5",)
    assert g.acked("b1", "q", [3, 4]).released == ("d3", "d4")
    g.hold("d6", [("q", 6)], now=6.0)
    assert g.acked("b1", "q", [6]).released == ("d6",)  # live: in order
    assert g.is_held("d1") and g.is_held("d2")
    assert g.acked("b1", "q", [1, 2]).released == ("d1", "d2")


def test_what_the_backup_says_it_holds_at_attach_is_released() -> None:
    g = book("b1", "b2")
    for p in range(1, 4):
        g.hold(f"d{p}", [("q", p)], now=float(p))
    assert g.start("b1", "q", floor=3, held=[2, 3, 9]) == []  # b2 still waits
    assert g.start("b2", "q", floor=3, held=[2]) == ["d2"]
    assert g.outstanding("b1", "q") == PositionSet([1]) and g.outstanding("b2", "q") == PositionSet([1, 3])


def test_positions_on_a_queue_must_grow() -> None:
    g = book("b1")
    g.hold("d5", [("q", 5)], now=1.0)
    with pytest.raises(ValueError, match="does not grow"):
        g.hold("d4", [("q", 4)], now=1.0)


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_in_order_replication_never_releases_what_was_not_applied(data: st.DataObject) -> None:
    """A primary holds, sends in order, dequeues; each backup applies a prefix of what was sent and acknowledges
    some subset of it that always contains its newest applied position (as the real one does, once per pass).
    A token is released only when every backup applied (or the primary dequeued) its place, and once all is
    applied and acknowledged nothing stays held."""
    g: GuardBook[int] = GuardBook()
    names = ["b1", "b2"]
    for n in names:
        g.add_backup(n)
        g.start(n, "q", floor=0)
    sent: list[int] = []
    applied = {n: 0 for n in names}  # index into sent
    dequeued: set[int] = set()
    held: set[int] = set()
    released: set[int] = set()
    pos = 0
    for _ in range(data.draw(st.integers(1, 60))):
        kind = data.draw(st.sampled_from(["hold", "hold", "apply", "deq"]))
        if kind == "hold":
            pos += 1
            assert g.hold(pos, [("q", pos)], now=float(pos))
            held.add(pos)
            sent.append(pos)
        elif kind == "apply" and sent:
            n = data.draw(st.sampled_from(names))
            upto = data.draw(st.integers(applied[n], len(sent)))
            applied[n] = upto
            if upto:
                window = sent[:upto]
                acks = set(data.draw(st.lists(st.sampled_from(window), max_size=5))) | {window[-1]}
                released |= set(g.acked(n, "q", sorted(acks)).released)
        elif kind == "deq" and held - released:
            p = data.draw(st.sampled_from(sorted(held - released)))
            dequeued.add(p)
            released |= set(g.dequeued("q", p))
        for t in released:
            assert t in dequeued or all(t in sent[: applied[n]] for n in names)
    for n in names:
        if sent:
            released |= set(g.acked(n, "q", [sent[-1]]).released)
    assert released == held and g.stats().places_held == 0
