"""The HA controller (ha.core.controller) driven without sockets: events in, the actions a broker carries out back,
through the life of a broker — start, catch-up, failover, lease loss, a stale epoch, the recovery timeout."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ha.core import controller as C
from ha.core.restart import ReadyView
from ha.core.states import TRANSITIONS, HaState, IllegalTransition

S = HaState


def kinds(actions: list[C.Action]) -> list[str]:
    """Each action's name, and a Log's event name."""
    return [a.event if isinstance(a, C.Log) else type(a).__name__ for a in actions]


def logged(actions: list[C.Action], event: str) -> dict[str, Any]:
    (fields,) = [dict(a.fields) for a in actions if isinstance(a, C.Log) and a.event == event]
    return fields


def ready_backup(name: str = "b2", epoch: int = 3) -> C.Controller:
    c = C.Controller(name)
    c.handle(C.Started())
    c.handle(C.EpochSeen(epoch))
    c.handle(C.Connected("wiring mirrored from b1"))
    c.handle(C.CaughtUp("caught up with b1"))
    return c


def test_a_backup_starts_joining_and_follows_its_primary_to_ready() -> None:
    c = C.Controller("b2", epoch=2)
    assert kinds(c.handle(C.Started(ready_epoch=1))) == ["ha.state", "StartBackup"]
    assert (c.state, c.epoch, c.ready_epoch) == (S.JOINING, 2, 1)
    assert c.handle(C.EpochSeen(3)) == [C.PersistEpoch(3), C.RecordStanding(3, S.JOINING, 1, None)]
    actions = c.handle(C.Connected("wiring mirrored from b1"))
    assert kinds(actions) == ["ha.state", "RecordStanding", "StateChanged"]
    assert c.state is S.CATCHUP and c.ready_epoch == 1  # not ready in epoch 3 yet
    c.handle(C.CaughtUp("caught up with b1"))
    assert c.state is S.READY and c.ready_epoch == 3  # ready in its primary's epoch: journaled
    view = ReadyView(3, 1, "b1", ("b2",))
    assert c.handle(C.ViewSeen(view)) == [C.RecordStanding(3, S.READY, 3, view)]  # the list it is ready in
    assert c.handle(C.ViewSeen(view)) == []


def test_a_stale_epoch_changes_nothing() -> None:
    c = ready_backup(epoch=5)
    assert c.handle(C.EpochSeen(4)) == [] and c.handle(C.EpochSeen(5)) == []
    assert c.epoch == 5


def test_failover_promotes_a_ready_backup_in_a_new_epoch_and_waits_for_the_other_ready_backups() -> None:
    c = ready_backup("b2", epoch=3)
    actions = c.handle(C.Promote(ready=("b1", "b2", "b3")))
    assert kinds(actions) == ["StopBackup", "PersistEpoch", "RecordStanding", "ha.state", "RecordStanding",
                              "StateChanged", "ha.promoted", "StartPrimary", "Answer"]
    assert C.StartPrimary(("b1", "b3"), previous_epoch=3) in actions
    assert C.answer(actions) == (True, "promoted to primary, epoch 4")
    assert (c.state, c.epoch, c.ready_epoch) == (S.RECOVERING, 4, 4)
    # The journal first has the new epoch with the old standing, then "primary of epoch 4, nobody ready yet": a
    # crash between the two never leaves a primary whose journal names no member list of its epoch.
    records = [a for a in actions if isinstance(a, C.RecordStanding)]
    assert records == [C.RecordStanding(4, S.READY, 3, None),
                       C.RecordStanding(4, S.RECOVERING, 4, ReadyView(4, 0, "b2"))]
    assert logged(actions, "ha.state")["reason"] == "promoted"
    assert logged(actions, "ha.promoted")["expected_backups"] == ["b1", "b3"]


def test_a_coordinators_epoch_is_taken_when_it_is_higher() -> None:
    c = ready_backup(epoch=3)
    c.handle(C.Promote(epoch=9))
    assert c.epoch == 9
    d = ready_backup(epoch=3)
    d.handle(C.Promote(epoch=2))  # never below its own: one above what it has seen
    assert d.epoch == 4


def test_recovery_ends_when_the_backups_caught_up_or_at_the_backup_timeout() -> None:
    c = ready_backup()
    c.handle(C.Promote())
    actions = c.handle(C.Recovered(5.02, ("b3",)))
    assert c.state is S.ACTIVE
    assert logged(actions, "ha.state")["reason"] == "backup timeout"
    assert logged(actions, "ha.active") == {"epoch": 4, "waited_seconds": 5.02, "timed_out": ["b3"]}
    d = ready_backup()
    d.handle(C.Promote())
    assert logged(d.handle(C.Recovered(0.4)), "ha.state")["reason"] == "expected backups caught up"


def test_lease_loss_demotes_a_primary_to_a_joining_backup_and_its_clients_go() -> None:
    c = ready_backup()
    c.handle(C.Promote())
    c.handle(C.Recovered(0.1))
    actions = c.handle(C.Demote("coordinator: leadership lost"))
    assert kinds(actions) == ["ha.demoted", "StopPrimary", "ha.state", "RecordStanding", "StateChanged",
                              "StartBackup"]
    assert C.StopPrimary("coordinator: leadership lost") in actions
    assert c.state is S.JOINING and c.epoch == 4 and c.ready_epoch == 4  # it was primary in 4: kept
    assert c.handle(C.Demote("again")) == []  # a backup has nothing to step down from


def test_a_backup_that_is_not_ready_is_not_promoted_without_force() -> None:
    c = C.Controller("b2")
    c.handle(C.Started())
    c.handle(C.EpochSeen(3))
    c.handle(C.Connected("wiring mirrored"))
    actions = c.handle(C.Promote())
    ok, text = C.answer(actions)
    assert not ok and "state catchup" in text and actions == [C.Answer(ok, text)]
    assert (c.state, c.epoch) == (S.CATCHUP, 3)
    ok, _ = C.answer(c.handle(C.Promote(forced=True)))
    assert ok and c.state is S.RECOVERING and c.epoch == 4


def test_a_brand_new_broker_may_become_the_first_primary() -> None:
    c = C.Controller("b1")
    c.handle(C.Started())
    actions = c.handle(C.Promote())
    assert C.answer(actions) == (True, "promoted to primary, epoch 1")
    assert C.StartPrimary((), previous_epoch=0) in actions
    assert C.answer(c.handle(C.Promote())) == (True, "already primary (recovering)")


def test_an_event_the_table_has_no_entry_for_is_refused_and_changes_nothing() -> None:
    c = ready_backup()
    with pytest.raises(IllegalTransition):
        c.handle(C.Recovered(0.0))  # a backup does not recover
    with pytest.raises(IllegalTransition):
        c.handle(C.Lost("primary gone"))  # a ready backup stays ready (it can be promoted)
    assert (c.state, c.epoch, c.ready_epoch) == (S.READY, 3, 3)
    standalone = C.Controller("s", epoch=2)
    standalone.state = S.STANDALONE  # no promotion from there, even forced
    with pytest.raises(IllegalTransition):
        standalone.handle(C.Promote(forced=True))
    assert (standalone.state, standalone.epoch, standalone.view) == (S.STANDALONE, 2, None)


EVENTS = st.one_of(
    st.builds(C.Connected, st.just("r")), st.builds(C.CaughtUp, st.just("r")), st.builds(C.Lost, st.just("r")),
    st.builds(C.EpochSeen, st.integers(0, 8)), st.builds(C.Demote, st.just("r")),
    st.builds(C.Recovered, st.floats(0, 10), st.just(())),
    st.builds(C.Promote, st.booleans(), st.none() | st.integers(0, 8), st.booleans(), st.just(("a", "b"))),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(EVENTS, max_size=30))
def test_any_sequence_of_events_moves_only_along_the_table_and_never_back_in_epochs(events: list[C.Event]) -> None:
    c = C.Controller("a")
    c.handle(C.Started())
    for e in events:
        before = (c.state, c.epoch, c.ready_epoch)
        try:
            actions = c.handle(e)
        except IllegalTransition:
            assert (c.state, c.epoch, c.ready_epoch) == before
            continue
        assert c.epoch >= before[1] and c.ready_epoch >= before[2]
        if c.state is not before[0]:
            assert (before[0], c.state) in TRANSITIONS
            assert any(isinstance(a, C.StateChanged) and a.new is c.state for a in actions)
        if c.state.role is not before[0].role:  # a role change stops the old role and starts the new one
            started = C.StartPrimary if c.state.role.value == "primary" else C.StartBackup
            assert any(isinstance(a, started) for a in actions)
