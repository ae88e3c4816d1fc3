"""The chaos run under pytest: short seeded runs in the default suite (ZooKeeper; understudy-cluster's manager),
each fault kind once and then a few drawn by weight; ≥ 1000 weighted faults with `-m soak`.

UNDERSTUDY_CHAOS_SEED / UNDERSTUDY_CHAOS_FAULTS choose the run; the seed is printed and named in every failure, so
the printed `python -m tests.chaos --seed N --faults M [--cover]` replays it."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from tests.chaos.model import ACCEPT_CONFIRMED, DELIVERED, Kind, check, schedule
from tests.chaos.runner import Run, iptables_usable, markdown

pytestmark = pytest.mark.zookeeper


def run(tmp_path: Path, faults: int, coordinator: str = "zookeeper", cover: bool = False) -> dict[str, object]:
    seed = int(os.environ.get("UNDERSTUDY_CHAOS_SEED", random.randrange(1 << 30)))
    faults = int(os.environ.get("UNDERSTUDY_CHAOS_FAULTS", faults))
    print(f"\nchaos: {faults} faults, seed {seed} (replay: python -m tests.chaos --seed {seed} --faults {faults} "
          f"--coordinator {coordinator}{' --cover' if cover else ''})")
    report = Run(seed, faults, tmp_path, coordinator=coordinator, cover=cover).execute()
    print("\n".join(markdown(report)))
    return report


def assert_exactly_once(report: dict[str, object]) -> None:
    v = report["verdict"]
    assert isinstance(v, dict)
    seed = report["seed"]
    assert v["lost"] == 0, f"seed {seed}: confirmed messages lost: {report['lost']}"
    assert v["unexpected"] == 0, f"seed {seed}: messages nobody sent: {report['unexpected']}"
    assert v["duplicated"] == 0, f"seed {seed}: delivered again after an accept was confirmed: {report['duplicated']}"
    assert v["confirmed"] > 0


def test_a_short_chaos_run_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    """Every kind of fault once (7), then 7 drawn by weight."""
    report = run(tmp_path, 14, cover=True)
    assert_exactly_once(report)
    cut = set() if iptables_usable() else {Kind.CUT_PRIMARY}
    mix = report["mix"]
    assert isinstance(mix, dict) and set(mix) == {k.value for k in set(Kind) - cut}, f"seed {report['seed']}: {mix}"


def test_a_short_chaos_run_under_understudy_clusters_manager_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    """No coordinator in the brokers (as under Pacemaker): the manager promotes, fences silent primaries, restarts."""
    assert_exactly_once(run(tmp_path, 8, "local", cover=True))


@pytest.mark.soak
@pytest.mark.timeout(3 * 3600)  # ~90 min on an idle machine; the suite's 300 s would stop it every time
def test_a_thousand_faults_lose_and_duplicate_nothing(tmp_path: Path) -> None:
    assert_exactly_once(run(tmp_path, 1000))


@pytest.mark.soak
@pytest.mark.timeout(3 * 3600)
def test_a_thousand_faults_under_understudy_clusters_manager_lose_and_duplicate_nothing(tmp_path: Path) -> None:
    assert_exactly_once(run(tmp_path, 1000, "local"))


def test_the_checker_names_each_kind_of_anomaly() -> None:
    v = check(attempted=["1", "2", "3", "4"], confirmed=["1", "2", "3"], delivered=["1", "1", "3", "4", "9"])
    assert v.lost == ["2"] and v.duplicated == {"1": 1} and v.unexpected == ["9"] and v.recovered == ["4"]
    assert v.summary() == {"attempted": 4, "confirmed": 3, "delivered": 5, "lost": 1, "duplicated": 1,
                           "unexpected": 1, "recovered": 1, "redelivered": 0}
    assert not v.ok
    assert check(["1"], ["1"], ["1"]).ok


def test_with_a_history_only_what_follows_a_confirmed_accept_is_a_duplicate() -> None:
    d, c = DELIVERED, ACCEPT_CONFIRMED
    ids = ["1", "2", "3", "4"]
    # 1: redelivered after an accept that was never confirmed (allowed); 2: delivered again after its accept was
    # confirmed; 3: two copies both delivered before either accept was confirmed, both confirmed; 4: once.
    history = [(d, "1"), (d, "1"), (c, "1"), (d, "2"), (c, "2"), (d, "2"), (c, "2"),
               (d, "3"), (d, "3"), (c, "3"), (c, "3"), (d, "4"), (c, "4")]
    v = check(ids, ids, [i for k, i in history if k == d], history)
    assert v.duplicated == {"2": 1, "3": 1} and v.redelivered == {"1": 1}
    assert v.summary()["duplicated"] == 2 and v.summary()["redelivered"] == 1
    assert not v.ok
    fine = [(d, "1"), (d, "1"), (c, "1")]
    assert check(["1"], ["1"], ["1", "1"], fine).ok


def test_a_seed_names_the_schedule() -> None:
    a = schedule(7, 200, session=1.5)
    assert a == schedule(7, 200, session=1.5) and a != schedule(8, 200, session=1.5)
    assert {f.kind for f in a} == set(Kind)  # every fault kind is drawn in a long run
    only = schedule(7, 50, session=1.5, only={Kind.KILL_BACKUP})
    assert {f.kind for f in only} == {Kind.KILL_BACKUP} and all(0.3 <= f.duration <= 2.25 for f in only)
    with pytest.raises(ValueError):
        schedule(1, 1, 1.5, only=set())


def test_a_covering_schedule_has_every_kind_first_and_a_seed_still_names_it() -> None:
    a = schedule(7, 10, session=1.5, cover=True)
    assert {f.kind for f in a[:len(Kind)]} == set(Kind) and len(a) == 10
    assert a == schedule(7, 10, session=1.5, cover=True)
    assert [f.kind for f in a] != [f.kind for f in schedule(8, 10, session=1.5, cover=True)]
    some = {Kind.KILL_BACKUP, Kind.STOP_PRIMARY}
    assert {f.kind for f in schedule(3, 2, session=1.5, only=some, cover=True)} == some
    assert len(schedule(3, 1, session=1.5, cover=True)) == 1  # fewer faults than kinds: the first few kinds
