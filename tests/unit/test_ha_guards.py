"""GuardBook: a client's place is released only when every guarding backup released it; each token comes back once."""

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


def one(g: GuardBook[str], token: str, queue: str, position: int, now: float = 1.0, nbytes: int = 0) -> bool:
    return g.hold(queue, [position], [token], now, nbytes)


def test_without_backups_settle_at_once() -> None:
    g = book()
    assert one(g, "d1", "q", 1) is False
    assert not g.is_held("d1")
    g.add_backup("b1")
    assert g.hold("q", [], [], now=1.0) is False  # nothing replicated


def test_released_only_when_every_backup_acknowledged() -> None:
    g = book("b1", "b2")
    assert one(g, "d1", "q", 1, now=10.0, nbytes=100)
    r = g.acked("b1", "q", [1])
    assert r.released == () and r.count == 1 and r.sample(0) == (1, 10.0) and r.ignored == 0
    assert g.is_held("d1")
    assert g.acked("b2", "q", [1]).released == ("d1",)
    assert not g.is_held("d1") and g.stats().places_held == 0


def test_a_pass_is_one_group_and_comes_back_token_by_token() -> None:
    g = book("b1")
    assert g.hold("q", [1, 2, 3], ["a", "b", "c"], now=5.0, nbytes=30)
    assert g.backlog("b1") == 3 and g.in_flight("b1") == InFlight(3, 30)
    r = g.acked("b1", "q", [1, 2, 3])
    assert r.released == ("a", "b", "c") and r.count == 3 and [r.sample(i)[0] for i in range(3)] == [1, 2, 3]
    assert g.backlog("b1") == 0


def test_a_delivery_on_two_queues_is_released_once_per_place() -> None:
    g = book("b1", "b2")
    one(g, "fanout", "q1", 5)
    one(g, "fanout", "q2", 7)
    for backup, queue, pos in [("b1", "q1", 5), ("b2", "q2", 7)]:
        assert g.acked(backup, queue, [pos]).released == ()
    assert g.acked("b2", "q1", [5]).released == ("fanout",)
    assert g.acked("b1", "q2", [7]).released == ("fanout",)  # the caller settles when both came back


def test_range_acknowledgement_releases_many_in_order() -> None:
    g = book("b1")
    for p in range(1, 6):
        one(g, f"d{p}", "q", p, now=float(p))
    r = g.acked("b1", "q", PositionSet.from_ranges([(2, 4)]))
    assert r.released == ("d2", "d3", "d4")
    assert [r.sample(i)[1] for i in range(r.count)] == [2.0, 3.0, 4.0]


def test_part_of_a_group_acknowledged_exactly_leaves_the_rest_waiting() -> None:
    g = book("b1")
    g.hold("q", [1, 2, 3, 4, 5], list("abcde"), now=1.0)
    assert g.acked("b1", "q", [2, 4]).released == ("b", "d")
    assert g.outstanding("b1", "q") == PositionSet([1, 3, 5])
    assert g.acked("b1", "q", PositionSet.from_ranges([(1, 5)])).released == ("a", "c", "e")


def test_dequeued_on_the_primary_before_the_acknowledgement() -> None:
    g = book("b1", "b2")
    one(g, "d1", "q", 1)
    one(g, "d2", "q", 2)
    one(g, "d2", "r", 1)
    g.acked("b1", "q", [1])
    assert g.dequeued("q", 1) == ["d1"]  # b2 no longer has to acknowledge it
    assert g.dequeued("q", [2, 3]) == ["d2"]
    late = g.acked("b2", "q", [1, 2])  # late acknowledgements of dequeued positions
    assert late.released == () and late.ignored == 2
    assert g.acked("b1", "r", [1]).released == ()
    assert g.acked("b2", "r", [1]).released == ("d2",)


def test_a_dequeue_in_the_middle_of_a_group_releases_only_that_place() -> None:
    g = book("b1")
    g.hold("q", [10, 11, 12], ["a", "b", "c"], now=1.0)
    assert g.dequeued("q", 11) == ["b"]
    assert g.outstanding("b1", "q") == PositionSet([10, 12])


def test_dropping_a_backup_releases_what_it_alone_held_up() -> None:
    g = book("b1", "b2")
    one(g, "d1", "q", 1)
    one(g, "d2", "q", 2)
    g.acked("b1", "q", [1])
    assert sorted(g.drop_backup("b2")) == ["d1"]
    assert g.drop_backup("b2") == []
    assert g.acked("b2", "q", [2]).ignored == 1  # a dropped backup's late acknowledgement
    assert g.acked("b1", "q", [2]).released == ("d2",)


def test_a_backup_guards_only_holds_made_after_it_was_added() -> None:
    g = book("b1")
    one(g, "d1", "q", 1)
    g.add_backup("b2")
    one(g, "d2", "q", 2)
    assert g.acked("b1", "q", [1]).released == ("d1",)
    assert g.acked("b1", "q", [2]).released == ()
    assert g.acked("b2", "q", [2]).released == ("d2",)


def test_hold_restricted_to_some_backups() -> None:
    g = book("b1", "b2")
    g.hold("q", [1], ["d1"], now=1.0, backups=["b1"])
    assert g.acked("b2", "q", [1]).ignored == 1
    assert g.acked("b1", "q", [1]).released == ("d1",)
    assert g.hold("q", [2], ["d2"], now=1.0, backups=[]) is False


def test_unknown_acknowledgements_are_ignored_counted_and_release_nothing() -> None:
    g = book("b1")
    one(g, "d1", "q", 3)
    assert g.acked("b1", "q", [1, 2, 4]).ignored == 3
    assert g.acked("b1", "other", [3]).ignored == 1
    assert g.acked("nobody", "q", [3]).ignored == 1
    assert g.stats().ignored_acks == 5
    r = g.acked("b1", "q", [2, 3, 4])
    assert r.released == ("d1",) and r.ignored == 2


def test_backlog_in_flight_and_oldest_unacknowledged() -> None:
    g = book("b1", "b2")
    assert g.backlog("b1") == 0 and g.oldest_unacked_ts("b1") is None
    one(g, "d1", "q", 1, now=100.0, nbytes=10)
    one(g, "d2", "q", 2, now=101.0, nbytes=20)
    one(g, "d2", "r", 1, now=101.0, nbytes=20)
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
    one(g, "d1", "q", 1)
    one(g, "d2", "q", 2)
    one(g, "d2", "r", 1)
    assert g.forget_queue("q") == ["d1", "d2"]
    assert g.backlog("b1") == 1
    one(g, "d3", "q", 1, now=2.0)  # the recreated queue numbers from 1 again
    assert g.oldest_unacked_ts("b1") == 1.0


@pytest.mark.parametrize(
    ("positions", "tokens", "kwargs", "words"),
    [
        ([1], ["new"], {}, "does not grow"),
        ([2, 2], ["a", "b"], {}, "ascending"),
        ([0], ["a"], {}, ">= 1"),
        ([3, 4], ["a"], {}, "2 positions but 1 tokens"),
        ([3], ["a"], {"backups": ["b9"]}, "unknown backups"),
    ],
)
def test_misuse_raises_and_changes_nothing(positions: list[int], tokens: list[str], kwargs: dict[str, list[str]],
                                           words: str) -> None:
    g = book("b1")
    one(g, "held", "q", 1)
    with pytest.raises(ValueError, match=words):
        g.hold("q", positions, tokens, now=2.0, **kwargs)  # type: ignore[arg-type]
    assert g.backlog("b1") == 1 and not g.is_held("new")
    with pytest.raises(ValueError, match="already guarding"):
        g.add_backup("b1")


@settings(max_examples=100, deadline=None)
@given(st.data())
def test_against_a_model_in_any_order(data: st.DataObject) -> None:
    """Random holds (groups), exact acknowledgements (incl. unknown), dequeues, drops and adds, checked against a
    plain model of (backup, queue, position) still owed per place."""
    g: GuardBook[int] = GuardBook()
    backups: set[str] = set()
    waiting: dict[tuple[str, int], set[str]] = {}  # place -> backups that still have to release it
    token_of: dict[tuple[str, int], int] = {}
    hold_ts: dict[tuple[str, int], float] = {}
    next_pos = {"q1": 1, "q2": 1}
    released_ever: list[tuple[str, int]] = []
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
                w.discard(name)
        elif kind == "hold":
            q = data.draw(st.sampled_from(["q1", "q2"]))
            n = data.draw(st.integers(1, 4))
            positions = list(range(next_pos[q], next_pos[q] + n))
            next_pos[q] += n + data.draw(st.integers(0, 2))  # gaps: unrouted or not replicated positions
            tokens = [step * 10 + i for i in range(n)]
            assert g.hold(q, positions, tokens, now=float(step)) is bool(backups)
            if backups:
                for p, t in zip(positions, tokens, strict=True):
                    waiting[(q, p)] = set(backups)
                    token_of[(q, p)] = t
                    hold_ts[(q, p)] = float(step)
        elif kind == "ack":
            name = data.draw(st.sampled_from(["b1", "b2", "b3"]))
            q = data.draw(st.sampled_from(["q1", "q2"]))
            positions = data.draw(st.sets(st.integers(1, next_pos[q] + 2)))
            as_ranges = data.draw(st.booleans())  # both argument forms: ranges and a plain list
            r = g.acked(name, q, PositionSet(positions) if as_ranges else sorted(positions))
            released = list(r.released)
            known = {p for p in positions if name in waiting.get((q, p), set())}
            assert {r.sample(i)[0] for i in range(r.count)} == known and r.count == len(known)
            assert r.ignored == len(positions) - len(known)
            for p in positions:
                waiting.get((q, p), set()).discard(name)
        else:
            q = data.draw(st.sampled_from(["q1", "q2"]))
            positions = data.draw(st.sets(st.integers(1, next_pos[q] + 2)))
            released = g.dequeued(q, PositionSet(positions) if data.draw(st.booleans()) else positions)
            for p in positions:
                if (q, p) in waiting:
                    waiting[(q, p)].clear()
        done = [place for place, w in waiting.items() if not w]
        assert sorted(released) == sorted(token_of[place] for place in done)  # each place once, when done
        for place in done:
            del waiting[place]
        released_ever += done
        for name in backups:
            mine = [place for place, w in waiting.items() if name in w]
            assert g.backlog(name) == len(mine)
            assert g.oldest_unacked_ts(name) == (min(hold_ts[x] for x in mine) if mine else None)
    assert len(released_ever) == len(set(released_ever))
    assert all(g.is_held(token_of[place]) for place in waiting)


def test_junk_in_an_acknowledgement_is_ignored_not_raised() -> None:
    g = book("b1")
    one(g, "d1", "q", 1)
    r = g.acked("b1", "q", [0, -3, "1", True, None, 1.0, 1])
    assert r.released == ("d1",) and r.ignored == 6


# -- in-order acknowledgement after start() (live replication) --------------------------------------------------------


def test_after_start_an_acknowledgement_covers_every_earlier_live_place() -> None:
    g = book("b1")
    g.start("b1", "q", floor=0)
    g.hold("q", [1, 2], ["d1", "d2"], now=1.0, nbytes=20)  # one pass
    g.hold("q", [3, 4, 5], ["d3", "d4", "d5"], now=2.0, nbytes=30)  # the next
    r = g.acked("b1", "q", [4])  # the backup applied 1..4 in order; one ack says so
    assert r.released == ("d1", "d2", "d3", "d4") and [r.sample(i)[0] for i in range(r.count)] == [1, 2, 3, 4]
    assert g.backlog("b1") == 1 and g.outstanding("b1", "q") == PositionSet([5])


def test_catch_up_places_below_the_floor_are_released_only_exactly() -> None:
    """Places held between the backup's connect and its browser's attach are sent by catch-up, newest first:
    acknowledging the newest must not release the older ones."""
    g = book("b1")
    g.hold("q", [1, 2, 3, 4, 5], ["d1", "d2", "d3", "d4", "d5"], now=1.0)
    g.start("b1", "q", floor=5)
    assert g.acked("b1", "q", [5]).released == ("d5",)
    assert g.acked("b1", "q", [3, 4]).released == ("d3", "d4")
    one(g, "d6", "q", 6)
    assert g.acked("b1", "q", [6]).released == ("d6",)  # live: in order
    assert g.is_held("d1") and g.is_held("d2")
    assert g.acked("b1", "q", [1, 2]).released == ("d1", "d2")


def test_a_pass_across_the_floor_is_split_there() -> None:
    """The browser attached in the middle of a pass: the places routed before are catch-up, the rest live."""
    g = book("b1")
    g.start("b1", "q", floor=3)
    g.hold("q", [2, 3, 4, 5], ["d2", "d3", "d4", "d5"], now=1.0)
    assert g.acked("b1", "q", [5]).released == ("d4", "d5")
    assert g.outstanding("b1", "q") == PositionSet([2, 3])


def test_what_the_backup_says_it_holds_at_attach_is_released() -> None:
    g = book("b1", "b2")
    g.hold("q", [1, 2, 3], ["d1", "d2", "d3"], now=1.0)
    assert g.start("b1", "q", floor=3, held=[2, 3, 9]) == []  # b2 still waits
    assert g.start("b2", "q", floor=3, held=[2]) == ["d2"]
    assert g.outstanding("b1", "q") == PositionSet([1]) and g.outstanding("b2", "q") == PositionSet([1, 3])


def test_a_dequeue_can_release_a_place_for_some_backups_only() -> None:
    """A windowed message consumed before every backup had its id: the dequeue releases it for the backups named
    (those of an older batch format); the others still have to acknowledge it, each for itself."""
    g = book("b1", "b2", "b3")
    for n in ("b1", "b2", "b3"):
        g.start(n, "q", floor=0)
    g.hold("q", [1, 2, 3], ["d1", "d2", "d3"], now=1.0)
    assert g.dequeued("q", [2], ["b3"]) == []  # b1 and b2 still wait for position 2
    assert g.outstanding("b3", "q") == PositionSet([1, 3]) and g.backlog("b3") == 2
    assert g.acked("b1", "q", [2]).released == ()
    assert g.acked("b2", "q", [2]).released == ("d2",)  # (1 waits for b3, which has not acknowledged anything)
    assert g.outstanding("b1", "q") == PositionSet([3]) and g.is_held("d1") and g.is_held("d3")
    assert g.dequeued("q", [3], ["nobody"]) == [] and g.dequeued("q", [1, 3]) == ["d1", "d3"]
    assert g.stats().places_held == 0


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_in_order_replication_never_releases_what_was_not_applied(data: st.DataObject) -> None:
    """A primary holds a pass's places as a group, sends in order, dequeues; each backup applies a prefix of what
    was sent and acknowledges some subset of it that always contains its newest applied position (as the real one
    does, once per pass). A place is released only when every backup applied it (or the primary dequeued it), and
    once all is applied and acknowledged nothing stays held."""
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
            n = data.draw(st.integers(1, 4))
            group = list(range(pos + 1, pos + n + 1))
            pos += n
            assert g.hold("q", group, group, now=float(pos))
            held.update(group)
            sent.extend(group)
        elif kind == "apply" and sent:
            n = data.draw(st.sampled_from(names))
            upto = data.draw(st.integers(applied[n], len(sent)))
            applied[n] = upto
            if upto:
                window = sent[:upto]
                acks = set(data.draw(st.lists(st.sampled_from(window), max_size=5))) | {window[-1]}
                got = g.acked(n, "q", sorted(acks)).released
                assert not set(got) & released
                released |= set(got)
        elif kind == "deq" and held - released:
            p = data.draw(st.sampled_from(sorted(held - released)))
            dequeued.add(p)
            got = g.dequeued("q", p)
            assert not set(got) & released
            released |= set(got)
        for t in released:
            assert t in dequeued or all(t in sent[: applied[n]] for n in names)
    for n in names:
        if sent:
            released |= set(g.acked(n, "q", [sent[-1]]).released)
    assert released == held and g.stats().places_held == 0
