"""The external (Pacemaker/operator) backend, timing validation and the retry backoff.  No server needed."""

from __future__ import annotations

import random
from itertools import islice

import pytest

from ha.coordination.backoff import backoff_delays
from ha.coordination.base import CoordinatorError, MemberRecord
from ha.coordination.external import ExternalCoordinator
from ha.coordination.zookeeper import validate_timing
from tests.zk.recorder import Recorder


def started(epoch: int = 0) -> tuple[ExternalCoordinator, Recorder]:
    rec = Recorder()
    coordinator = ExternalCoordinator("c1", "b1", epoch=epoch)
    coordinator.start(rec.callbacks("b1"))
    coordinator.publish(MemberRecord("b1", "h:5672", "backup", "ready", epoch, 10))
    return coordinator, rec


def test_promote_without_epoch_takes_the_next_one() -> None:
    coordinator, rec = started(epoch=4)
    assert coordinator.promote() == 5
    assert rec.values("b1", "elected") == [5]
    assert coordinator.holds_lease()
    view = coordinator.view()
    assert (view.leader, view.epoch, view.i_am_leader) == ("b1", 5, True)


def test_promote_with_a_stale_epoch_is_refused() -> None:
    coordinator, rec = started(epoch=4)
    with pytest.raises(CoordinatorError, match="not above the highest epoch seen"):
        coordinator.promote(epoch=4)
    assert rec.values("b1", "elected") == []
    assert not coordinator.holds_lease()


def test_a_higher_epoch_ends_leadership() -> None:
    coordinator, rec = started()
    coordinator.promote(epoch=2)
    coordinator.observe_epoch(3, leader="b2")
    assert rec.events("b1", "lost") != []
    assert not coordinator.holds_lease()
    assert (coordinator.view().leader, coordinator.view().epoch) == ("b2", 3)


def test_demote_reports_lost_once() -> None:
    coordinator, rec = started()
    coordinator.promote()
    coordinator.demote()
    coordinator.demote()
    assert len(rec.events("b1", "lost")) == 1


def test_view_lists_members_learnt_from_the_primary() -> None:
    coordinator, _ = started()
    coordinator.observe_members([MemberRecord("b2", "h2:5672", "primary", "active", 1, 30)])
    assert [m.name for m in coordinator.view().members] == ["b1", "b2"]


def test_validate_timing_accepts_a_sane_configuration() -> None:
    assert validate_timing(session_timeout=2.0, heartbeat=1.0) == []


@pytest.mark.parametrize(
    ("session_timeout", "heartbeat", "flag"),
    [
        (0.5, 0.2, "--zk-session-timeout"),
        (120.0, 1.0, "--zk-session-timeout"),
        (2.0, 0.0, "--ha-heartbeat"),
        (2.0, 2.0, "--ha-heartbeat"),
        (2.0, 5.0, "--ha-heartbeat"),
    ],
)
def test_validate_timing_names_the_bad_flag(session_timeout: float, heartbeat: float, flag: str) -> None:
    errors = validate_timing(session_timeout, heartbeat)
    assert len(errors) == 1 and errors[0].startswith(flag)


def test_backoff_grows_to_the_cap_with_jitter() -> None:
    delays = list(islice(backoff_delays(0.1, 1.0, random.Random(1)), 12))
    assert 0.05 <= delays[0] <= 0.1
    assert all(0.5 <= d <= 1.0 for d in delays[5:])
    assert len(set(delays[5:])) > 1, "jittered, not lock-step"
