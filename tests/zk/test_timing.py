"""Timing validation and the retry backoff.  No server needed."""

from __future__ import annotations

import random
from itertools import islice

import pytest

from ha.coordination.backoff import backoff_delays
from ha.coordination.zookeeper import validate_timing


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
