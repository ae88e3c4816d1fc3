"""LagSampler: every acknowledgement below the limit, uniform sampling above it, counts recoverable by 1/rate."""

from __future__ import annotations

import random

import pytest

from ha.core.lag import LagSample, LagSampler


def feed(sampler: LagSampler, rate: int, seconds: int, start: float = 1000.0) -> list[list[float]]:
    """Acknowledgements evenly spread at ``rate`` per second; returns the logged sample rates, per second."""
    out: list[list[float]] = []
    for s in range(seconds):
        logged: list[float] = []
        for i in range(rate):
            r = sampler.sample(start + s + i / rate)
            if r is not None:
                logged.append(r)
        out.append(logged)
    return out


def test_keeps_every_acknowledgement_under_the_limit() -> None:
    sampler = LagSampler(100, rng=random.Random(1).random)
    per_second = feed(sampler, rate=99, seconds=5)
    assert all(len(s) == 99 and set(s) == {1.0} for s in per_second)


def test_samples_uniformly_above_the_limit_and_weights_recover_the_count() -> None:
    sampler = LagSampler(100, rng=random.Random(7).random)
    per_second = feed(sampler, rate=1000, seconds=6)
    steady = per_second[1:]
    for logged in steady:
        assert 60 <= len(logged) <= 140  # about max_per_second lines per second
        assert all(r == pytest.approx(0.1) for r in logged)
    estimate = sum(1 / r for logged in per_second for r in logged)
    assert estimate == pytest.approx(6000, rel=0.15)


def test_first_second_of_a_burst_is_bounded() -> None:
    sampler = LagSampler(100, rng=random.Random(3).random)
    first = feed(sampler, rate=1000, seconds=1)[0]
    assert 100 <= len(first) <= 500  # trails the real rate, but not by 10x
    assert sum(1 / r for r in first) == pytest.approx(1000, rel=0.3)


def test_back_to_every_acknowledgement_after_the_burst() -> None:
    sampler = LagSampler(100, rng=random.Random(5).random)
    feed(sampler, rate=1000, seconds=2, start=0.0)
    assert feed(sampler, rate=10, seconds=3, start=10.0) == [[1.0] * 10] * 3


def test_deterministic_with_an_injected_rng() -> None:
    a = feed(LagSampler(50, rng=random.Random(11).random), rate=400, seconds=3)
    b = feed(LagSampler(50, rng=random.Random(11).random), rate=400, seconds=3)
    assert a == b


def test_clock_stepping_back_does_not_crash_or_drop_everything() -> None:
    sampler = LagSampler(10, rng=lambda: 0.99)
    assert sampler.sample(100.0) == 1.0
    assert sampler.sample(50.0) == 1.0


def test_rejects_a_nonsense_limit() -> None:
    with pytest.raises(ValueError):
        LagSampler(0)


def test_lag_sample_fields_follow_the_event_schema() -> None:
    s = LagSample("orders", "b2", 17, 1795833000.1201, 1795833000.1234, backlog=4, sample_rate=1.0)
    fields = s.fields()
    assert set(fields) == {
        "queue",
        "backup",
        "position",
        "enqueue_ts",
        "ack_ts",
        "lag_ms",
        "backlog",
        "sample_rate",
    }
    assert fields["lag_ms"] == pytest.approx(3.3, abs=1e-3)  # float seconds near 1.8e9 keep ~0.2 us


def test_batches_keep_the_rule_and_the_weights_recover_the_count() -> None:
    sampler = LagSampler(100, rng=random.Random(13).random)
    logged: list[float] = []
    per_second: dict[int, int] = {}
    for step in range(4000):  # 4 s of batches of 20 acknowledgements every ms: 20,000/s
        t = 100.0 + step / 1000
        rate, picked = sampler.sample_batch(t, 20)
        logged += [rate] * len(picked)
        per_second[int(t)] = per_second.get(int(t), 0) + len(picked)
        assert all(0 <= i < 20 for i in picked) and picked == sorted(set(picked))
    assert sum(1 / r for r in logged) == pytest.approx(80_000, rel=0.1)
    assert all(n <= 300 for n in per_second.values()), per_second  # about max_per_second lines per second
    assert LagSampler(100).sample_batch(1.0, 5) == (1.0, [0, 1, 2, 3, 4])  # under the limit: every one
    assert LagSampler(100).sample_batch(1.0, 0) == (1.0, [])


def test_the_lag_histogram_counts_each_sample_by_its_weight_into_cumulative_buckets() -> None:
    from ha.core.lag import LAG_BOUNDS, LagHistogram

    h = LagHistogram()
    h.observe(0.0004)  # <= 0.5 ms
    h.observe(0.003, weight=4.0)  # a sample kept at rate 1/4 stands for four
    h.observe(30.0)  # above every bound: only in +Inf
    h.observe(-1.0)  # a clock step back counts as 0
    cum = dict(h.cumulative())
    assert cum[LAG_BOUNDS[0]] == 2 and cum[0.002] == 2 and cum[0.005] == 6 and cum[10.0] == 6
    assert cum[float("inf")] == h.total == 7
    assert abs(h.sum - (0.0004 + 0.012 + 30.0)) < 1e-9
    wire = h.to_wire()
    assert wire["count"] == 7 and len(wire["counts"]) == len(LAG_BOUNDS) + 1  # type: ignore[arg-type]
