"""Accept round trip in receiver-settle-mode second: a replicated queue against an unreplicated one, same primary.

    python -m bench.accept_latency [--messages 2000]

Starts a primary and one backup (real `ha-broker` processes, in a temporary directory), fills a durable replicated
queue and a durable queue with `qpid.replicate: none`, then consumes half of each twice, one message at a time: the
time from sending the accept (unsettled) to the broker's settlement is the figure. On the replicated queue the
primary settles once the backup acknowledged the dequeue and both journals hold it (docs/replication.md); on the
other, at once. Prints p50/p99 per queue and round. The Python client costs as much as the brokers here: compare the
two queues of one run, not runs of different machines.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from proton import Delivery, Message

from tests.support.amqp import SettleSecond, connect, mgmt
from tests.support.cluster import Cluster
from tests.support.procs import BrokerFactory


def round_trips(c: Any, queue: str, n: int, name: str) -> list[float]:
    r = c.create_receiver(queue, credit=0, name=name, options=SettleSecond())
    lat = []
    for _ in range(n):
        r.link.flow(1)
        c.wait(lambda: r.fetcher.has_message, timeout=10)
        r.fetcher.pop()
        d = r.fetcher.unsettled.popleft()
        t0 = time.perf_counter()
        d.update(Delivery.ACCEPTED)
        c.wait(functools.partial(_settled, d), timeout=10)
        lat.append((time.perf_counter() - t0) * 1000.0)
        d.settle()
    r.close()
    return sorted(lat)


def _settled(d: Any) -> bool:
    return bool(d.settled)


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.accept_latency", description=__doc__)
    ap.add_argument("--messages", type=int, default=2000)
    n = ap.parse_args().messages
    factory = BrokerFactory(Path(tempfile.mkdtemp(prefix="accept-latency-")))
    c = Cluster(factory, 2, [])
    try:
        c.start_with_primary(0)
        with mgmt(c[0].url) as m:
            m.call("CREATE", "queue", "replicated", {"arguments": {"durable": True}})
            m.call("CREATE", "queue", "unreplicated", {"arguments": {"durable": True, "qpid.replicate": "none"}})
        conn = connect(c[0].url)
        for q in ("replicated", "unreplicated"):
            s = conn.create_sender(q)
            for i in range(n):
                s.send(Message(body=i, durable=True))
        for rnd in range(2):
            for q in ("replicated", "unreplicated"):
                lat = round_trips(conn, q, n // 2, f"{q}-{rnd}")
                print(f"round {rnd + 1} {q:13} accept round trip p50 {statistics.median(lat):.3f} ms "
                      f"p99 {lat[int(len(lat) * 0.99)]:.3f} ms")
        conn.close()
    finally:
        for _ in factory.cleanup():
            pass


if __name__ == "__main__":
    main()
