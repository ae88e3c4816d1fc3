"""Flow to disk (`--max-memory`): beyond the bound a durable queue keeps its newest bodies only in the journal and
reads them back in order as consumers need them; memory stays bounded; a kill loses nothing; what cannot be paged
is refused with amqp:resource-limit-exceeded and everything already accepted stays intact."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

from proton import Delivery, Message

from tests.support.amqp import connect, drain, mgmt
from tests.support.bulk import fill, number_of, take
from tests.support.procs import BIN, BrokerFactory, BrokerProcess, wait_for

MiB = 1 << 20
PAD = 1000  # bytes per message body


def rss(b: BrokerProcess) -> int:
    assert b.proc is not None
    status = Path(f"/proc/{b.proc.pid}/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("VmRSS:")).split()[1]) * 1024


def broker_attrs(b: BrokerProcess) -> dict[str, Any]:
    with mgmt(b.url) as m:
        return dict(m.call("READ", "broker", "").body)


def queue_attrs(b: BrokerProcess, name: str) -> dict[str, Any]:
    with mgmt(b.url) as m:
        return dict(m.call("READ", "queue", name).body)


def create(b: BrokerProcess, name: str, durable: bool = True) -> None:
    with mgmt(b.url) as m:
        m.call("CREATE", "queue", name, {"arguments": {"durable": durable}})


def numbers(bodies: list[Any]) -> list[int]:
    return [number_of(x) for x in bodies]


def test_a_durable_queue_beyond_the_bound_pages_to_disk_survives_a_kill_and_delivers_everything_in_order(
        brokers: BrokerFactory) -> None:
    n = 20_000  # about 20 MiB of bodies against a 4 MiB bound
    b = brokers("--max-memory", "4M")
    create(b, "big")
    base = rss(b)
    fill(b.url, "big", n, durable=True, pad=PAD)
    attrs = broker_attrs(b)
    assert attrs["memory"]["limit"] == 4 * MiB
    assert attrs["memory"]["used"] <= 4 * MiB, attrs["memory"]
    assert attrs["journal"]["paged"] >= n * 3 // 4, attrs["journal"]  # most of the queue is on disk only
    assert queue_attrs(b, "big")["depth"] == n
    grown = rss(b) - base
    assert grown < 12 * MiB, f"RSS grew {grown / MiB:.1f} MiB for {n * PAD / MiB:.0f} MiB of queued bodies"

    b.kill()  # SIGKILL with most of the queue paged
    b.start()
    attrs = broker_attrs(b)
    assert attrs["memory"]["used"] <= 4 * MiB and attrs["journal"]["paged"] > 0, attrs  # recovered under the bound
    recovered = next(e for e in b.events(since_start=True) if e["event"] == "journal.recovered")
    assert recovered["messages"] == n

    assert numbers(take(b.url, "big", n)) == list(range(1, n + 1))  # read back in order as the consumer goes
    attrs = broker_attrs(b)
    assert attrs["journal"]["paged"] == 0 and queue_attrs(b, "big")["depth"] == 0
    assert attrs["journal"]["paged-in"] > 0


def test_durable_queues_keep_at_most_half_the_bound_in_memory(brokers: BrokerFactory) -> None:
    """Under the bound but over its pageable half, a durable queue pages (memory paging frees stays with the
    allocator a while: the index of paged messages must grow into room of its own); its messages still come back
    in order."""
    n = 6_000  # about 7.5 MiB counted against an 8 MiB bound: under it, over its half
    b = brokers("--max-memory", "8M")
    create(b, "half")
    fill(b.url, "half", n, durable=True, pad=PAD)
    attrs = broker_attrs(b)
    assert not attrs["memory"]["over"], attrs["memory"]
    assert attrs["journal"]["paged"] > 0, attrs["journal"]
    assert attrs["memory"]["used"] <= 4 * MiB + attrs["journal"]["paged"] * 20, attrs
    assert numbers(take(b.url, "half", n)) == list(range(1, n + 1))


def test_consumers_are_fed_while_publishers_keep_the_queue_beyond_the_bound(brokers: BrokerFactory) -> None:
    """A consumer attached the whole time: it gets every message in order while most wait on disk."""
    b = brokers("--max-memory", "2M")
    create(b, "flow")
    fill(b.url, "flow", 8000, durable=True, pad=PAD)
    got = take(b.url, "flow", 3000, credit=100)
    fill(b.url, "flow", 4000, start=8001, durable=True, pad=PAD)  # appended behind the paged ones
    got += take(b.url, "flow", 9000, credit=100)
    assert numbers(got) == list(range(1, 12001))
    assert broker_attrs(b)["journal"]["paged"] == 0


def test_non_durable_messages_beyond_the_bound_are_refused_and_nothing_accepted_is_lost(
        brokers: BrokerFactory) -> None:
    b = brokers("--max-memory", "1M")
    create(b, "scratch", durable=False)
    c = connect(b.url)
    s = c.create_sender("scratch")
    accepted, refused = 0, None
    for i in range(1, 5000):
        d = s.link.send(Message(body=f"{i}:".ljust(10_000, "x")))
        c.wait(lambda d=d: bool(d.remote_state), timeout=10)
        if d.remote_state != Delivery.ACCEPTED:
            refused = d
            break
        accepted = i
    c.close()
    assert refused is not None and refused.remote_state == Delivery.REJECTED
    assert refused.remote.condition.name == "amqp:resource-limit-exceeded"
    assert "--max-memory" in refused.remote.condition.description
    assert 50 <= accepted < 200, accepted  # about 1 MiB of 10 KB messages
    over = wait_for(lambda: next((e for e in b.events() if e["event"] == "memory.over"), None), 5)
    assert over["limit"] == MiB
    assert broker_attrs(b)["memory"]["over"] is True
    assert numbers(drain(b.url, "scratch")) == list(range(1, accepted + 1))  # every accepted one, intact
    wait_for(lambda: any(e["event"] == "memory.under" for e in b.events()), 5, what="memory.under")
    fill(b.url, "scratch", 10, pad=10_000)  # accepted again once under the bound


def test_non_durable_messages_behind_paged_ones_are_spilled_to_disk_and_not_recovered(
        brokers: BrokerFactory) -> None:
    """A message that arrives at a durable queue while some of it is paged out goes behind them, so its body waits
    in the journal too, durable or not (spilled, not refused: memory stays under the bound). A spilled message is
    still not durable: a restart drops it."""
    b = brokers("--max-memory", "1M")
    create(b, "mixed")
    fill(b.url, "mixed", 3000, durable=True, pad=PAD)  # about 3 MiB: paging
    assert broker_attrs(b)["journal"]["paged"] > 1000
    fill(b.url, "mixed", 2000, start=3001, durable=False, pad=PAD)  # 2 MiB more, none refused
    assert broker_attrs(b)["memory"]["used"] <= MiB
    assert queue_attrs(b, "mixed")["depth"] == 5000
    assert numbers(take(b.url, "mixed", 1000)) == list(range(1, 1001))
    b.kill()
    b.start()
    assert numbers(take(b.url, "mixed", 2000)) == list(range(1001, 3001))  # the durable ones, in order
    assert queue_attrs(b, "mixed")["depth"] == 0  # the spilled non-durable ones were not recovered


def test_purge_and_move_take_paged_messages_too(brokers: BrokerFactory) -> None:
    """A move reads paged messages back a part at a time (about 40 % of the bound per request, `more` says there
    is more: it read them all into memory at once), and ha-admin move asks until it is done."""
    b = brokers("--max-memory", "1M")
    create(b, "src")
    create(b, "dst")
    fill(b.url, "src", 4000, durable=True, pad=PAD)
    assert broker_attrs(b)["journal"]["paged"] > 2000
    with mgmt(b.url) as m:
        part = m.call("MOVE", "queue", "src", {"destination": "dst", "count": 1500}).body
    assert part["more"] and 0 < part["moved"] < 1500 and part["moved"] * PAD < MiB, part
    r = subprocess.run([str(BIN / "ha-admin"), "--broker", b.url, "move", "src", "dst", "--count",
                        str(1500 - part["moved"])], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.startswith(f"moved {1500 - part['moved']} messages"), r
    with mgmt(b.url) as m:
        purged = m.call("PURGE", "queue", "src").body
    assert purged == {"purged": 2500, "depth": 0}
    assert numbers(take(b.url, "dst", 1500)) == list(range(1, 1501))
    b.kill()
    b.start()
    assert queue_attrs(b, "src")["depth"] == 0 and queue_attrs(b, "dst")["depth"] == 0
    assert broker_attrs(b)["journal"]["paged"] == 0


def test_messages_held_by_an_open_transaction_count_and_are_refused_over_the_bound(brokers: BrokerFactory) -> None:
    """A transaction holds what it was sent in memory until its commit: without counting it one client could grow
    the broker past any bound by never committing."""
    from tests.support.txn import Txn

    b = brokers("--max-memory", "2M")
    create(b, "held")  # durable: a plain durable message to it would be taken (paged) while over the bound
    c = connect(b.url)
    try:
        s = c.create_sender("held")
        txn = Txn(c)
        sent, refused = 0, None
        for i in range(1, 2000):
            d = txn.send(s, Message(body=f"{i}:".ljust(10_000, "x"), durable=True))
            if d.remote_state == Delivery.REJECTED:
                refused = d
                break
            sent = i
        assert refused is not None, "20 MB held by one transaction under a 2 MiB bound"
        assert refused.remote.condition.name == "amqp:resource-limit-exceeded"
        assert "a transaction holds its messages in memory" in refused.remote.condition.description
        assert 100 <= sent < 400, sent  # about 2 MiB of 10 KB messages, give or take a check interval
        memory = broker_attrs(b)["memory"]
        assert memory["over"] is True and memory["used"] >= sent * 10_000, memory
        assert txn.abort() == "aborted"  # the roll back frees it
        wait_for(lambda: not broker_attrs(b)["memory"]["over"], 5, what="memory under the bound again")
        txn = Txn(c)  # the transaction of a client that commits in time is taken whole
        for i in range(1, 51):
            assert txn.send(s, Message(body=f"{i}:".ljust(10_000, "x"), durable=True)).remote_state != \
                Delivery.REJECTED
        assert txn.commit() == "committed"
    finally:
        c.close()
    assert numbers(take(b.url, "held", 50)) == list(range(1, 51))


def test_the_ids_of_paged_messages_that_are_not_durable_outlive_a_restart_once_they_are_purged(
        brokers: BrokerFactory) -> None:
    """The id of a message that is not durable is journaled once the message leaves its queue. A purge takes paged
    messages without reading them back (nothing to read an id from): the id is found by the message's position, or
    it would never be journaled and a resend after a restart be taken though the window had dropped it before."""
    b = brokers("--max-memory", "1M")
    with mgmt(b.url) as m:
        m.call("CREATE", "queue", "mixed", {"arguments": {"durable": True, "duplicate-window": 1000}})
    fill(b.url, "mixed", 3000, durable=True, pad=PAD)  # about 3 MiB: paging
    ids = [f"v-{i}" for i in range(200)]

    def publish() -> None:
        c = connect(b.url)
        try:
            s = c.create_sender("mixed")
            for mid in ids:
                s.send(Message(id=mid, body="x" * PAD))  # not durable: spilled behind the paged ones
        finally:
            c.close()

    publish()
    assert broker_attrs(b)["journal"]["paged"] > 2000 and queue_attrs(b, "mixed")["depth"] == 3200
    with mgmt(b.url) as m:
        assert m.call("PURGE", "queue", "mixed").body == {"purged": 3200, "depth": 0}
    publish()  # resent before the restart: the window drops them
    assert queue_attrs(b, "mixed")["depth"] == 0
    b.kill()
    b.start()
    publish()  # and after it
    assert queue_attrs(b, "mixed")["depth"] == 0
