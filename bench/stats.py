"""Pure arithmetic for results: percentiles, rates, ratios, medians of repeats."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence


def percentile(values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile (p in 0..100) of unsorted values; NaN when empty."""
    if not values:
        return math.nan
    s = sorted(values)
    k = max(0, math.ceil(p / 100 * len(s)) - 1)
    return s[min(k, len(s) - 1)]


def rate(count: int, seconds: float) -> float:
    return count / seconds if seconds > 0 else math.nan


def per_message_us(cpu_seconds: float, count: int) -> float:
    return cpu_seconds * 1e6 / count if count > 0 else math.nan


def ratio(ours: float, theirs: float) -> float:
    if theirs == 0 or math.isnan(theirs) or math.isnan(ours):
        return math.nan
    return ours / theirs


def median(values: Sequence[float]) -> float:
    vals = [v for v in values if not math.isnan(v)]
    return statistics.median(vals) if vals else math.nan
