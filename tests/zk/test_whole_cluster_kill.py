"""SIGKILL of every broker at once under durable load, at random moments, again and again: the brokers come back in
a random order, ZooKeeper's election promotes the newest store, and no message a publisher saw confirmed is lost.

The brokers journal in the smallest segments (64 KiB) and each message carries 4 KiB of padding: every second of
load rolls over several segments, the next one zero-filled in advance after the first 32 KiB, so the kills land in
the middle of writes into prepared segments, of roll-overs and of zero-filling too. The default suite runs a couple
of rounds; `-m soak` runs many (UNDERSTUDY_KILL_ROUNDS, UNDERSTUDY_KILL_SEED pick them; the seed is printed and
named in every failure)."""

from __future__ import annotations

import os
import random
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.support.amqp import mgmt
from tests.support.bulk import take
from tests.support.numbered import numbers, spawn
from tests.support.procs import BrokerFactory, wait_for
from tests.zk.conftest import ZkTest
from tests.zk.test_broker_zk import SESSION, check_history, wait_primary, zk_cluster

pytestmark = pytest.mark.zookeeper

SECOND_RANGE = 10_000_000  # the second publisher's numbers start here
SMALL_SEGMENTS = ("--journal-segment-bytes", str(64 * 1024))


def kill_rounds(zk: ZkTest, brokers: BrokerFactory, tmp_path: Path, rounds: int, seed: int) -> None:
    print(f"\nwhole-cluster kill: {rounds} rounds, seed {seed}")
    rng = random.Random(seed)
    c = zk_cluster(brokers, zk, extra=SMALL_SEGMENTS)
    c.start()
    p = wait_primary(c)
    with mgmt(c[p].url) as m:
        m.call("CREATE", "queue", "dq", {"arguments": {"durable": True}})
    acked = [tmp_path / "acked-1.txt", tmp_path / "acked-2.txt"]
    patience = ["--patience", str(SESSION + 60), "--pad", "4000"]  # ~4 KiB a message: segments fill in rounds
    senders = [spawn("send", c.urls, "dq", acked[0], "--count", "1000000", *patience),
               spawn("send", c.urls, "dq", acked[1], "--count", "1000000", "--first", str(SECOND_RANGE), *patience)]
    try:
        for r in range(rounds):
            before = sum(len(numbers(a)) for a in acked)
            wait_for(lambda before=before: sum(len(numbers(a)) for a in acked) > before + 50, SESSION + 60,
                     what=f"publishers confirming again (round {r}, seed {seed})")
            time.sleep(rng.uniform(0.0, 1.0))  # a random moment under load
            c.kill_all_at_once()
            order = rng.sample(range(len(c.brokers)), len(c.brokers))
            for i in order:
                c[i].start(wait=False)
                time.sleep(rng.uniform(0.0, 0.5))
            for b in c.brokers:
                b.wait_started()
            wait_primary(c, timeout=SESSION + 30)
        wait_for(lambda: sum(len(numbers(a)) for a in acked) > before + 100, SESSION + 60,
                 what=f"publishers confirming after the last restart (seed {seed})")
    finally:
        for s in senders:
            s.kill()
            s.wait(10)
    confirmed = numbers(acked[0]) + numbers(acked[1])
    p = wait_primary(c, timeout=SESSION + 30)
    c.wait_state(p, "active", timeout=60)
    with mgmt(c[p].url) as m:
        depth = m.call("READ", "queue", "dq").body["depth"]
    got = take(c[p].url, "dq", depth)
    counts = Counter(got)
    lost = sorted(set(confirmed) - counts.keys())
    sent_max = (max(numbers(acked[0]), default=0), max(numbers(acked[1]), default=SECOND_RANGE))
    unexpected = sorted(n for n in counts if not (1 <= n <= sent_max[0] + 1 or SECOND_RANGE <= n <= sent_max[1] + 1))
    duplicated = sum(v - 1 for v in counts.values())
    print(f"confirmed {len(confirmed)}, delivered {len(got)}, duplicated {duplicated} (resends of unconfirmed "
          f"transfers: exactly-once is issue 12), lost {len(lost)}")
    assert not lost, f"seed {seed}: {len(lost)} confirmed messages lost, e.g. {lost[:10]}"
    assert not unexpected, f"seed {seed}: messages nobody sent: {unexpected[:10]}"
    for name in ("acked-1.txt", "acked-2.txt"):
        seq = numbers(tmp_path / name)
        assert seq == sorted(set(seq)), f"seed {seed}: a publisher confirmed out of order"
    check_history(c)
    segments = [p for b in c.brokers for p in (b.data_dir / "journal").glob("*.jnl")]
    full = sum(p.stat().st_size >= 64 * 1024 for p in segments)  # filled to the size, or zero-filled in advance
    assert full > 0, f"seed {seed}: no segment reached 64 KiB: the kills did not meet the segment code"


def test_every_broker_killed_at_once_under_durable_load_loses_no_confirmed_message(
        zk: ZkTest, brokers: BrokerFactory, tmp_path: Path) -> None:
    seed = int(os.environ.get("UNDERSTUDY_KILL_SEED", random.randrange(1 << 30)))
    kill_rounds(zk, brokers, tmp_path, rounds=2, seed=seed)


@pytest.mark.soak
def test_many_whole_cluster_kills_soak(zk: ZkTest, brokers: BrokerFactory, tmp_path: Path) -> None:
    seed = int(os.environ.get("UNDERSTUDY_KILL_SEED", random.randrange(1 << 30)))
    kill_rounds(zk, brokers, tmp_path, rounds=int(os.environ.get("UNDERSTUDY_KILL_ROUNDS", "25")), seed=seed)
