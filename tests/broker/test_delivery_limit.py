"""The `delivery-limit` queue argument: after that many failed deliveries a message is dead-lettered (through the
queue's alternate exchange) or dropped; real broker processes, proton clients and the cli-proton-python receiver."""

from __future__ import annotations

import subprocess

import pytest
from proton import Delivery

from tests.support.amqp import connect, drain, mgmt, send, settle_last
from tests.support.procs import BIN, BrokerProcess, read_events, wait_for


def dead_letter_setup(url: str, queue: str, limit: int, alternate: bool = True) -> str:
    """`queue` with the limit, and (when `alternate`) a fanout exchange to a queue `<queue>-dlq`; returns it."""
    dlq = f"{queue}-dlq"
    with mgmt(url) as m:
        args: dict[str, object] = {"delivery-limit": limit}
        if alternate:
            m.call("CREATE", "exchange", f"{queue}-dlx", {"exchange-type": "fanout"})
            m.call("CREATE", "queue", dlq)
            m.call("CREATE", "binding", body={"source": f"{queue}-dlx", "destination": dlq})
            args["alternate-exchange"] = f"{queue}-dlx"
        m.call("CREATE", "queue", queue, {"arguments": args})
    return dlq


def cli_take_and_vanish(url: str, queue: str) -> subprocess.CompletedProcess[str]:
    """cli-proton-python-receiver takes one message and exits without settling it, like a consumer that crashes on
    it: a failed delivery. (Its `-a release` sends `modified` without delivery-failed, which does not count.)"""
    return subprocess.run(
        [str(BIN / "cli-proton-python-receiver"), "-b", f"{url}/{queue}", "-c", "1", "-a", "noack", "-t", "10",
         "--reactor-prefetch", "1", "--log-msgs", "body"],
        capture_output=True, text=True, timeout=60)


def test_consumer_crashing_three_times_on_a_message_moves_it_to_the_alternate_exchange(broker: BrokerProcess) -> None:
    url = broker.url
    dlq = dead_letter_setup(url, "work", 3)
    send(url, "work", ["poison", "good"])
    for attempt in range(3):
        r = cli_take_and_vanish(url, "work")
        assert r.returncode == 0, r.stderr
        assert "poison" in r.stdout, f"attempt {attempt}: {r.stdout}"
    assert drain(url, "work") == ["good"]
    assert drain(url, dlq) == ["poison"]
    ev = wait_for(lambda: [e for e in read_events(broker.log_file) if e["event"] == "queue.delivery_limit"],
                  what="queue.delivery_limit logged")
    assert (ev[0]["queue"], ev[0]["count"], ev[0]["exchange"]) == ("work", 3, "work-dlx")


def test_plain_release_is_not_a_failure_and_a_vanished_consumer_is(broker: BrokerProcess) -> None:
    url = broker.url
    dlq = dead_letter_setup(url, "jobs", 2)
    send(url, "jobs", ["x"])
    c = connect(url)
    r = c.create_receiver("jobs", credit=1)
    for _ in range(5):  # released without delivery-failed: the consumer never tried it
        assert r.receive(5).body == "x"
        r.release(delivered=False)
    m = r.receive(5)
    assert m.delivery_count == 0
    settle_last(r, Delivery.MODIFIED, failed=True)  # failure 1
    assert r.receive(5).delivery_count == 1
    c.close()  # held unsettled when the connection went: failure 2 = the limit
    wait_for(lambda: drain(url, dlq, timeout=0.2) == ["x"] or None, what="x dead-lettered", timeout=10)
    assert drain(url, "jobs") == []


def test_without_alternate_exchange_the_message_is_dropped_and_logged(broker: BrokerProcess) -> None:
    url = broker.url
    dead_letter_setup(url, "solo", 1, alternate=False)
    send(url, "solo", ["once"])
    c = connect(url)
    r = c.create_receiver("solo", credit=1)
    assert r.receive(5).body == "once"
    settle_last(r, Delivery.MODIFIED, failed=True)
    c.close()
    assert drain(url, "solo") == []
    ev = wait_for(lambda: [e for e in read_events(broker.log_file) if e["event"] == "queue.delivery_limit"],
                  what="queue.delivery_limit logged")
    assert ev[0]["exchange"] is None and ev[0]["count"] == 1
    with mgmt(url) as m:
        assert m.call("READ", "queue", "solo").body["depth"] == 0


@pytest.mark.parametrize("bad", [0, -1, "three", True, 1.5])
def test_bad_delivery_limit_is_refused_with_the_reason_and_nothing_is_created(broker: BrokerProcess, bad: object) -> None:
    with mgmt(broker.url) as m:
        r = m.request("CREATE", "queue", "q", {"arguments": {"delivery-limit": bad}})
        assert r.status == 400
        assert "delivery-limit" in r.description
        assert m.request("READ", "queue", "q").status == 404


def test_delivery_limit_can_be_set_later_with_update(broker: BrokerProcess) -> None:
    url = broker.url
    with mgmt(url) as m:
        m.call("CREATE", "queue", "later")
        assert m.call("UPDATE", "queue", "later", {"delivery-limit": "1"}).body["arguments"]["delivery-limit"] == 1
        assert m.request("UPDATE", "queue", "later", {"delivery-limit": 0}).status == 400
    send(url, "later", ["gone"])
    c = connect(url)
    r = c.create_receiver("later", credit=1)
    r.receive(5)
    settle_last(r, Delivery.MODIFIED, failed=True)
    c.close()
    assert drain(url, "later") == []
