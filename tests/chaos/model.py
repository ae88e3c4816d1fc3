"""The chaos run's pure parts: the fault mix as data, a seeded schedule, and the checker (Jepsen's taxonomy).

A run is a list of `Fault`s drawn from `MIX` by a seeded `random.Random`, so a seed names the run exactly. The
checker compares what publishers attempted and saw confirmed with what consumers accepted:

- **lost**: confirmed to a publisher, never delivered;
- **duplicated**: delivered more than once (by message-id) — with the consumer's history of deliveries and
  confirmed accepts (receiver-settle-mode second: the broker settled its accept), only what a consumer must never
  see: a delivery after that id's accept was confirmed, or a second confirmed accept of it;
- **redelivered**: (with a history) delivered again after accepts that were never confirmed (the consumer's
  connection failed first) — allowed, at-least-once;
- **unexpected**: delivered but never attempted;
- **recovered**: attempted but not confirmed (the publisher saw a failure), and delivered anyway — allowed: the
  publisher resent it, and duplicate detection keeps it once.
"""

from __future__ import annotations

import enum
import math
import random
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field


class Kind(enum.Enum):
    KILL_PRIMARY = "kill-primary"  # SIGKILL, restarted once the cluster recovered
    STOP_PRIMARY = "stop-primary"  # SIGSTOP for `duration`, then SIGCONT (longer than the session: it is deposed)
    KILL_BACKUP = "kill-backup"  # SIGKILL a backup, restarted after `duration`
    STOP_BACKUP = "stop-backup"  # SIGSTOP a backup for `duration`
    CUT_PRIMARY = "cut-primary"  # iptables: the primary's AMQP port and its ZooKeeper session dropped for `duration`
    STOP_ZOOKEEPER = "stop-zookeeper"  # the ZooKeeper server down for `duration`
    KILL_ALL = "kill-all"  # every broker SIGKILLed at once, restarted in a random order


@dataclass(frozen=True)
class Weight:
    kind: Kind
    weight: float
    min_duration: float  # seconds (0: instantaneous faults)
    max_duration: float


# The fault mix: how often each fault is drawn and how long it lasts. Durations around the ZooKeeper session timeout
# (the run's `session`, scaled by `Weight.*_duration` as multiples of it) exercise both sides of the lease.
MIX: tuple[Weight, ...] = (
    Weight(Kind.KILL_PRIMARY, 3, 0, 0),
    Weight(Kind.STOP_PRIMARY, 2, 0.3, 2.5),
    Weight(Kind.KILL_BACKUP, 2, 0.2, 1.5),
    Weight(Kind.STOP_BACKUP, 1, 0.3, 2.5),
    Weight(Kind.CUT_PRIMARY, 2, 0.3, 2.5),
    Weight(Kind.STOP_ZOOKEEPER, 1, 0.3, 2.0),
    Weight(Kind.KILL_ALL, 1, 0, 0),
)


@dataclass(frozen=True)
class Fault:
    index: int
    kind: Kind
    duration: float  # seconds
    pause: float  # seconds of load before the fault
    pick: float  # in [0, 1): which backup, restart order, ... (the runner maps it)


def schedule(seed: int, n: int, session: float, mix: Sequence[Weight] = MIX,
             only: Iterable[Kind] | None = None, cover: bool = False) -> list[Fault]:
    """`n` faults drawn from `mix` (restricted to `only` if given); durations are multiples of `session`.

    `cover`: the first faults are each kind once, in a seeded order, and only the rest are drawn by weight, so a
    short run hurts the cluster every way there is (30 weighted draws miss some kind in about one run in five). A
    seed names a different schedule with and without it."""
    rng = random.Random(seed)
    allowed = set(only) if only is not None else None
    weights = [w for w in mix if allowed is None or w.kind in allowed]
    if not weights:
        raise ValueError("no fault kind left to draw from")
    first = rng.sample(weights, len(weights)) if cover else []
    out = []
    for i in range(n):
        w = first[i] if i < len(first) else rng.choices(weights, [x.weight for x in weights])[0]
        duration = rng.uniform(w.min_duration, w.max_duration) * session
        out.append(Fault(i, w.kind, round(duration, 3), round(rng.uniform(0.2, 1.5), 3), rng.random()))
    return out


@dataclass
class Verdict:
    attempted: int
    confirmed: int
    delivered: int
    lost: list[str] = field(default_factory=list)
    duplicated: dict[str, int] = field(default_factory=dict)  # id -> deliveries too many
    unexpected: list[str] = field(default_factory=list)
    recovered: list[str] = field(default_factory=list)
    redelivered: dict[str, int] = field(default_factory=dict)  # id -> allowed extra deliveries (accept unconfirmed)

    @property
    def ok(self) -> bool:
        return not (self.lost or self.duplicated or self.unexpected)

    def summary(self) -> dict[str, int]:
        return {"attempted": self.attempted, "confirmed": self.confirmed, "delivered": self.delivered,
                "lost": len(self.lost), "duplicated": sum(self.duplicated.values()),
                "unexpected": len(self.unexpected), "recovered": len(self.recovered),
                "redelivered": sum(self.redelivered.values())}


DELIVERED = "d"
ACCEPT_CONFIRMED = "c"


def check(attempted: Iterable[str], confirmed: Iterable[str], delivered: Iterable[str],
          history: Iterable[tuple[str, str]] | None = None) -> Verdict:
    """The verdict over message-ids: `attempted` (every id a publisher sent at least once), `confirmed` (those it
    saw accepted), `delivered` (every id consumers accepted, once per delivery); `history`: the consumers' events
    in order, (DELIVERED, id) and (ACCEPT_CONFIRMED, id), which tells allowed redeliveries from duplicates."""
    tried = set(attempted)
    ok = set(confirmed)
    if not ok <= tried:
        raise ValueError(f"confirmed but never attempted: {sorted(ok - tried)[:5]}")
    times = Counter(delivered)
    extra = {k: v - 1 for k, v in sorted(times.items()) if v > 1}
    duplicated, redelivered = (extra, {}) if history is None else _duplicates(history, extra)
    return Verdict(
        attempted=len(tried), confirmed=len(ok), delivered=sum(times.values()),
        lost=sorted(ok - times.keys()),
        duplicated=duplicated,
        unexpected=sorted(times.keys() - tried),
        recovered=sorted((tried - ok) & times.keys()),
        redelivered=redelivered,
    )


def _duplicates(history: Iterable[tuple[str, str]], extra: dict[str, int]) -> tuple[dict[str, int], dict[str, int]]:
    """(duplicated, redelivered): a delivery after the id's accept was confirmed is a duplicate, and so is a
    confirmed accept of an id whose accept was confirmed before (counted once per delivery); every other extra
    delivery had only unconfirmed accepts before it."""
    settled: set[str] = set()
    counted: Counter[str] = Counter()  # duplicate deliveries already counted whose accept may still be confirmed
    dup: Counter[str] = Counter()
    for kind, i in history:
        if kind == DELIVERED:
            if i in settled:
                dup[i] += 1
                counted[i] += 1
        elif kind == ACCEPT_CONFIRMED:
            if i in settled:
                if counted[i]:
                    counted[i] -= 1
                else:
                    dup[i] += 1
            settled.add(i)
        else:
            raise ValueError(f"unknown history event {kind!r}")
    allowed = {k: n - dup.get(k, 0) for k, n in extra.items() if n > dup.get(k, 0)}
    return dict(sorted(dup.items())), allowed


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100); nan when empty."""
    if not values:
        return math.nan
    s = sorted(values)
    return s[max(0, math.ceil(q / 100 * len(s)) - 1)]


def recovery_table(times: Mapping[Kind, Sequence[float]]) -> list[dict[str, object]]:
    """Per fault kind: count, p50 and p99 of the seconds from the fault to publishers confirming again."""
    return [{"fault": k.value, "count": len(v), "p50": percentile(v, 50), "p99": percentile(v, 99)}
            for k, v in sorted(times.items(), key=lambda kv: kv[0].value)]
