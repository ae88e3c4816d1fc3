"""The one promotion rule (ha.core.promotion) every way in asks: who may become primary, with which epoch, by which
transition of the state table."""

from __future__ import annotations

import pytest

from ha.core.promotion import Facts, Request, decide
from ha.core.restart import ReadyView
from ha.core.states import HaState, Trigger

S = HaState
MINE = ReadyView(3, 5, "b0", frozenset({"b1"}))  # b1's journal: ready in the list of epoch 3


def facts(state: HaState, epoch: int = 3, ready_epoch: int = 3, view: ReadyView | None = MINE) -> Facts:
    return Facts("b1", state, epoch, ready_epoch, view)


@pytest.mark.parametrize(
    ("f", "r", "ok", "trigger", "forced_transition"),
    [
        (facts(S.READY), Request(), True, Trigger.PROMOTE, False),
        (facts(S.READY), Request(forced=True), True, Trigger.PROMOTE, True),  # --force on a ready one: harmless
        (facts(S.CATCHUP), Request(), False, None, False),
        (facts(S.CATCHUP), Request(forced=True), True, Trigger.FORCE_PROMOTE, True),
        (facts(S.JOINING), Request(), False, None, False),
        (facts(S.JOINING, epoch=0, ready_epoch=0, view=None), Request(), True, Trigger.FORCE_PROMOTE, True),  # new
        (facts(S.JOINING), Request(newest_store=True), True, Trigger.FORCE_PROMOTE, True),  # its journal agrees
        (facts(S.JOINING, ready_epoch=0), Request(newest_store=True), False, None, False),  # never ready
        (facts(S.JOINING, view=ReadyView(3, 6, "b0", frozenset())), Request(newest_store=True), False, None, False),
        (facts(S.CATCHUP), Request(newest_store=True), False, None, False),  # newest store only from joining
    ],
)
def test_who_may_become_primary(f: Facts, r: Request, ok: bool, trigger: Trigger | None,
                                forced_transition: bool) -> None:
    d = decide(f, r)
    assert (d.ok, d.trigger, d.forced_transition) == (ok, trigger, forced_transition)
    if not ok:
        assert "refusing to promote" in d.text and "--force" in d.text


def test_the_new_epoch_is_above_its_own_and_the_coordinators() -> None:
    assert decide(facts(S.READY, epoch=3), Request()).epoch == 4
    assert decide(facts(S.READY, epoch=3), Request(epoch=9)).epoch == 9
    assert decide(facts(S.READY, epoch=3), Request(epoch=2)).epoch == 4


def test_a_primary_is_left_as_it_is() -> None:
    for state in (S.RECOVERING, S.ACTIVE):
        d = decide(facts(state), Request(forced=True))
        assert d.ok and d.already and d.trigger is None and d.text == f"already primary ({state.value})"


def test_the_newest_store_reason_is_logged() -> None:
    assert decide(facts(S.JOINING), Request(newest_store=True)).reason == "promoted with the newest store"
    assert decide(facts(S.READY), Request()).reason == "promoted"
