"""What clients see after a failover is what they would have seen without it (issue 12), with real brokers.

- A message keeps the absolute expiry the primary gave it: a backup that got it in catch-up, long after it was sent,
  does not restart its TTL, so on the new primary it expires at its original time.
- An exchange's `alternate-exchange` and `auto-delete` replicate and keep working on the new primary, and a backup
  never deletes an auto-delete exchange on its own (the primary's bindings to queues that do not replicate are not
  on the backup): it follows the primary's deletion.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from tests.support.amqp import drain, mgmt, send
from tests.support.cluster import Cluster, kill
from tests.support.procs import BrokerProcess, wait_for

Make = Callable[..., Cluster]

TTL = 10.0  # seconds: long enough for a catch-up and a failover inside it, short enough for a test


def exchanges(b: BrokerProcess) -> dict[str, dict[str, Any]]:
    with mgmt(b.url, timeout=10) as m:
        return {r["name"]: r.get("arguments") or {} for r in m.call("QUERY", "exchange").rows()}


def sleep_until(t: float) -> None:
    time.sleep(max(0.0, t - time.time()))


@pytest.mark.parametrize("fmt", ["batch", "per-message"])
def test_a_message_caught_up_late_expires_on_the_new_primary_at_its_original_time(cluster: Make, fmt: str) -> None:
    c = cluster(2, *(["--ha-batch-bytes", "0"] if fmt == "per-message" else []))
    c.start(0)
    c.promote(0)
    c.wait_state(0, "active")
    with mgmt(c[0].url) as m:
        m.call("CREATE", "queue", "ttl", {})
    t0 = time.time()
    send(c[0].url, "ttl", ["short-lived"], ttl=TTL)
    sleep_until(t0 + 3.0)  # the backup is not there yet: it gets the message in catch-up, 3 s after it was sent
    c.start(1)
    c.wait_state(1, "ready")
    kill(c[0])
    c.promote(1)
    c.wait_state(1, "recovering", "active")
    assert time.time() < t0 + TTL - 2.0, "the failover took too long for this test's TTL"
    assert drain(c[1].url, "ttl", browse=True) == ["short-lived"]  # kept across the failover, before its time
    sleep_until(t0 + TTL + 1.0)
    # A backup that restarted the TTL on arrival would still hold it for about 3 s more.
    assert drain(c[1].url, "ttl") == []


def test_exchange_arguments_replicate_and_work_on_the_new_primary(cluster: Make) -> None:
    c = cluster(2)
    c.start_with_primary(0)
    with mgmt(c[0].url) as m:
        for q in ("orders", "strays"):
            m.call("CREATE", "queue", q, {})
        m.call("CREATE", "queue", "local", {"arguments": {"qpid.replicate": "none"}})
        m.call("CREATE", "exchange", "spill", {"exchange-type": "fanout"})
        m.call("CREATE", "exchange", "in", {"exchange-type": "direct", "arguments": {"alternate-exchange": "spill"}})
        m.call("CREATE", "binding", None, {"source": "in", "destination": "orders", "binding-key": "order"})
        m.call("CREATE", "binding", None, {"source": "spill", "destination": "strays", "binding-key": ""})
        m.call("CREATE", "exchange", "fleeting", {"exchange-type": "direct", "arguments": {"auto-delete": True}})
        m.call("CREATE", "binding", None, {"source": "fleeting", "destination": "orders", "binding-key": "k"})
        m.call("CREATE", "binding", None, {"source": "fleeting", "destination": "local", "binding-key": "k"})
        m.call("CREATE", "exchange", "kept-then-gone", {"arguments": {"auto-delete": True}})
        m.call("CREATE", "binding", None, {"source": "kept-then-gone", "destination": "orders", "binding-key": "k"})
    want = {"spill": {}, "in": {"alternate-exchange": "spill"}, "fleeting": {"auto-delete": True},
            "kept-then-gone": {"auto-delete": True}}
    wait_for(lambda: exchanges(c[1]) == want, 20, 0.1, what="exchanges with their arguments on the backup")

    with mgmt(c[0].url) as m:
        # On the primary `fleeting` keeps its binding to `local`, which the backup does not have: the backup must
        # not delete it when the binding to `orders` goes.
        m.call("DELETE", "binding", "fleeting|orders|k")
        m.call("DELETE", "binding", "kept-then-gone|orders|k")  # its last: deleted on the primary, then the backup
    del want["kept-then-gone"]
    wait_for(lambda: exchanges(c[1]) == want, 20, 0.1, what="the primary's auto-deletion followed by the backup")
    assert exchanges(c[0]) == want

    kill(c[0])
    c.promote(1)
    c.wait_state(1, "recovering", "active")
    new = c[1].url
    send(new, "in", ["order"], subject="order")
    send(new, "in", ["typo"], subject="typo")
    assert drain(new, "orders") == ["order"]
    assert drain(new, "strays") == ["typo"]  # the alternate exchange works on the new primary
    with mgmt(new) as m:  # and auto-delete does: the new primary is no longer a mirror
        m.call("CREATE", "binding", None, {"source": "fleeting", "destination": "orders", "binding-key": "k2"})
        m.call("DELETE", "binding", "fleeting|orders|k2")
        assert m.request("READ", "exchange", "fleeting").status == 404
