"""The HA state table: what is allowed, what is refused, and that docs/states.md matches the code."""

from __future__ import annotations

from pathlib import Path

import pytest

from ha.core import controller
from ha.core.states import (
    TRANSITIONS,
    HaState,
    IllegalTransition,
    Role,
    Trigger,
    allowed_targets,
    fire,
    render_mermaid,
    transition,
)

S = HaState
DOC = Path(__file__).resolve().parents[2] / "docs" / "states.md"

ALLOWED = [
    (S.JOINING, S.CATCHUP),
    (S.CATCHUP, S.READY),
    (S.CATCHUP, S.JOINING),
    (S.READY, S.CATCHUP),
    (S.READY, S.RECOVERING),
    (S.RECOVERING, S.ACTIVE),
    (S.RECOVERING, S.JOINING),
    (S.ACTIVE, S.JOINING),
]
FORCED = [(S.JOINING, S.RECOVERING), (S.CATCHUP, S.RECOVERING)]


def test_roles() -> None:
    assert [s for s in S if s.role is Role.BACKUP] == [S.JOINING, S.CATCHUP, S.READY]
    assert [s for s in S if s.role is Role.PRIMARY] == [S.RECOVERING, S.ACTIVE]
    assert S.STANDALONE.role is Role.STANDALONE


def test_the_table_is_exactly_the_allowed_and_forced_transitions() -> None:
    assert set(TRANSITIONS) == set(ALLOWED) | set(FORCED)
    assert {k for k, t in TRANSITIONS.items() if t.forced} == set(FORCED)


@pytest.mark.parametrize(("frm", "to"), ALLOWED)
def test_allowed_transitions_return_the_new_state(frm: HaState, to: HaState) -> None:
    assert transition(frm, to, "test") is to


@pytest.mark.parametrize(("frm", "to"), [(a, b) for a in S for b in S if (a, b) not in TRANSITIONS])
def test_everything_else_is_refused_naming_both_states(frm: HaState, to: HaState) -> None:
    with pytest.raises(IllegalTransition) as info:
        transition(frm, to, "because", forced=True)
    msg = str(info.value)
    assert f"{frm.value} -> {to.value}" in msg and "because" in msg
    assert info.value.log_fields() == {"from_state": frm.value, "to_state": to.value, "reason": "because"}
    assert not info.value.needs_force


def test_joining_to_joining_is_refused() -> None:
    with pytest.raises(IllegalTransition):
        transition(S.JOINING, S.JOINING, "reconnect")


@pytest.mark.parametrize("to", list(S))
def test_standalone_never_changes_state(to: HaState) -> None:
    with pytest.raises(IllegalTransition):
        transition(S.STANDALONE, to, "x", forced=True)
    assert allowed_targets(S.STANDALONE, forced=True) == []


@pytest.mark.parametrize(("frm", "to"), FORCED)
def test_promotion_from_joining_or_catchup_needs_force(frm: HaState, to: HaState) -> None:
    with pytest.raises(IllegalTransition) as info:
        transition(frm, to, "ha-admin promote")
    assert info.value.needs_force
    assert "--force" in str(info.value) and frm.value in str(info.value)
    assert transition(frm, to, "ha-admin promote --force", forced=True) is S.RECOVERING
    assert TRANSITIONS[(frm, to)].trigger is Trigger.FORCE_PROMOTE


def test_force_is_harmless_on_a_ready_backup() -> None:
    assert transition(S.READY, S.RECOVERING, "promote --force", forced=True) is S.RECOVERING


def test_allowed_targets_hides_forced_ones_unless_asked() -> None:
    assert allowed_targets(S.CATCHUP) == [S.READY, S.JOINING]
    assert allowed_targets(S.CATCHUP, forced=True) == [S.READY, S.JOINING, S.RECOVERING]


def test_mermaid_has_one_edge_per_table_entry() -> None:
    text = render_mermaid()
    for (frm, to), t in TRANSITIONS.items():
        assert f"{frm.value} --> {to.value}: {t.trigger.value}" in text


def test_docs_states_md_is_generated_from_the_table() -> None:
    assert DOC.read_text() == controller.render_markdown(), (
        "docs/states.md is out of date: run `python -m ha.core.controller > docs/states.md`"
    )


# ----- the trigger picks the transition (what the controller fires: ha.core.controller) ---------------------------
EVENTS = [
    (S.JOINING, Trigger.PRIMARY_CONNECTED, S.CATCHUP),
    (S.READY, Trigger.PRIMARY_CONNECTED, S.CATCHUP),
    (S.CATCHUP, Trigger.CAUGHT_UP, S.READY),
    (S.CATCHUP, Trigger.PRIMARY_LOST, S.JOINING),
    (S.READY, Trigger.PROMOTE, S.RECOVERING),
    (S.RECOVERING, Trigger.RECOVERED, S.ACTIVE),
    (S.RECOVERING, Trigger.DEMOTE, S.JOINING),
    (S.ACTIVE, Trigger.DEMOTE, S.JOINING),
]


@pytest.mark.parametrize(("frm", "trigger", "to"), EVENTS)
def test_a_trigger_leads_where_the_table_says(frm: HaState, trigger: Trigger, to: HaState) -> None:
    assert fire(frm, trigger, "test") is to


@pytest.mark.parametrize("frm", [S.JOINING, S.CATCHUP])
def test_promoting_a_backup_that_is_not_ready_needs_force(frm: HaState) -> None:
    with pytest.raises(IllegalTransition, match="requires a forced promotion"):
        fire(frm, Trigger.FORCE_PROMOTE, "promote")
    assert fire(frm, Trigger.FORCE_PROMOTE, "promote --force", forced=True) is S.RECOVERING


def test_every_other_state_and_trigger_is_refused_with_both_named() -> None:
    known = {(f, t) for f, t, _ in EVENTS} | {(S.JOINING, Trigger.FORCE_PROMOTE), (S.CATCHUP, Trigger.FORCE_PROMOTE)}
    assert len(known) == len(TRANSITIONS)  # every table entry is reachable by its trigger
    for frm in HaState:
        for trigger in Trigger:
            if (frm, trigger) in known:
                continue
            with pytest.raises(IllegalTransition, match=f"{frm.value} -> \\? on {trigger.value}") as e:
                fire(frm, trigger, "x", forced=True)
            assert e.value.log_fields()["to_state"] == "none"
