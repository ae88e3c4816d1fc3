"""Jittered exponential backoff for retrying the coordination store (pure).

Jitter (each delay uniform in [cap/2, cap]) keeps a crowd of brokers that lost the same server from retrying in
lock-step.  Usage::

    for delay in backoff_delays(first=0.1, maximum=2.0):
        if try_again():
            break
        time.sleep(delay)
"""

from __future__ import annotations

import random
from collections.abc import Iterator


def backoff_delays(first: float = 0.1, maximum: float = 2.0, rng: random.Random | None = None) -> Iterator[float]:
    """An endless series of delays: uniform in [cap/2, cap], cap doubling from ``first`` up to ``maximum``."""
    if first <= 0 or maximum < first:
        raise ValueError("need 0 < first <= maximum")
    draw = rng or random.Random()
    cap = first
    while True:
        yield draw.uniform(cap / 2, cap)
        cap = min(cap * 2, maximum)
