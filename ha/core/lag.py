"""Which acknowledgements become ``ha.lag`` samples (docs/events.md).

``LagSampler.sample(now)`` is asked once per acknowledged position (``sample_batch(now, n)`` for n at once). While
acknowledgements arrive at under ``max_per_second`` it keeps every one (sample rate 1.0). Above that it keeps each
with probability ``max_per_second / rate``, where ``rate`` is estimated from the previous one-second window and the
current one so far (its count over its elapsed time, at least a quarter second). The probability is decided *before*
the coin is tossed, from past acknowledgements only, so weighting each logged sample by ``1 / sample_rate`` gives an
unbiased count. In the first quarter second of a burst the estimate trails the real rate, so somewhat more than
``max_per_second`` lines may be written in that second; from then on it is about ``max_per_second``.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass


class LagSampler:
    def __init__(self, max_per_second: float = 1000.0, *, rng: Callable[[], float] | None = None) -> None:
        """``rng`` returns uniform floats in [0, 1) (default: a private ``random.Random``); inject one in tests."""
        if max_per_second <= 0:
            raise ValueError(f"max_per_second must be > 0, got {max_per_second}")
        self.max_per_second = max_per_second
        self._rng = rng if rng is not None else random.Random().random
        self._window_start: float | None = None
        # Acknowledgements seen in the current window and in the one just before it.
        self._current = 0
        self._previous = 0

    def rate(self, now: float) -> float:
        """The estimated acknowledgement rate per second at ``now`` (before counting a new one)."""
        self._roll(now)
        elapsed = now - self._window_start if self._window_start is not None else 0.0
        return float(max(self._previous, self._current / max(elapsed, 0.25)))

    def sample(self, now: float) -> float | None:
        """Count one acknowledgement at ``now``; return the sample rate to log it with, or None to skip it."""
        rate = self.rate(now)
        self._current += 1
        if rate < self.max_per_second:
            return 1.0
        p = self.max_per_second / rate
        return p if self._rng() < p else None

    def sample_batch(self, now: float, n: int) -> tuple[float, list[int]]:
        """Count ``n`` acknowledgements at ``now`` at once; return the sample rate and the indices (0..n-1) to log.

        The same rule as ``sample`` applied to each of the ``n`` (kept with probability ``p`` each, decided from the
        rate before the batch), with one random draw per *kept* acknowledgement instead of one per acknowledgement:
        the gaps between kept ones are geometric.
        """
        if n <= 0:
            return 1.0, []
        rate = self.rate(now)
        self._current += n
        if rate < self.max_per_second:
            return 1.0, list(range(n))
        p = self.max_per_second / rate
        picked: list[int] = []
        log_q = math.log1p(-p) if p < 1.0 else None
        i = -1
        while True:
            if log_q is None:
                i += 1
            else:
                u = self._rng()
                i += 1 + int(math.log1p(-u) / log_q)  # P(gap = k) = (1-p)^k p
            if i >= n:
                return p, picked
            picked.append(i)

    def _roll(self, now: float) -> None:
        if self._window_start is None:
            self._window_start = now
            return
        elapsed = now - self._window_start
        # A clock step back, or a silent second: start afresh rather than trusting either window.
        if elapsed < 0 or elapsed >= 2.0:
            self._window_start, self._previous, self._current = now, 0, 0
        elif elapsed >= 1.0:
            self._window_start, self._previous, self._current = self._window_start + 1.0, self._current, 0


@dataclass(frozen=True)
class LagSample:
    """One ``ha.lag`` event's fields; ``fields()`` is what the caller passes to the logger."""

    queue: str
    backup: str
    position: int
    enqueue_ts: float
    ack_ts: float
    backlog: int
    sample_rate: float

    @property
    def lag_ms(self) -> float:
        return (self.ack_ts - self.enqueue_ts) * 1000.0

    def fields(self) -> dict[str, object]:
        return {
            "queue": self.queue,
            "backup": self.backup,
            "position": self.position,
            "enqueue_ts": self.enqueue_ts,
            "ack_ts": self.ack_ts,
            "lag_ms": self.lag_ms,
            "backlog": self.backlog,
            "sample_rate": self.sample_rate,
        }


LAG_BOUNDS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)  # seconds


class LagHistogram:
    """Replication lag (enqueue to a backup's acknowledgement) of one backup, in fixed buckets (`LAG_BOUNDS`, seconds,
    as Prometheus' `le`). Fed with the samples ``LagSampler`` keeps, each weighted by ``1 / sample_rate``, so the
    counts estimate every acknowledgement (exact below the sampler's rate)."""

    __slots__ = ("counts", "sum", "total")

    def __init__(self) -> None:
        self.counts = [0.0] * (len(LAG_BOUNDS) + 1)  # the last one: above every bound
        self.sum = 0.0
        self.total = 0.0

    def observe(self, seconds: float, weight: float = 1.0) -> None:
        seconds = max(seconds, 0.0)
        i = 0
        while i < len(LAG_BOUNDS) and seconds > LAG_BOUNDS[i]:
            i += 1
        self.counts[i] += weight
        self.sum += seconds * weight
        self.total += weight

    def cumulative(self) -> list[tuple[float, float]]:
        """(le, count of samples <= le) for every bound and +inf."""
        out, running = [], 0.0
        for le, c in zip((*LAG_BOUNDS, math.inf), self.counts, strict=True):
            running += c
            out.append((le, running))
        return out

    def to_wire(self) -> dict[str, object]:
        return {"bounds": list(LAG_BOUNDS), "counts": list(self.counts), "sum": self.sum, "count": self.total}
