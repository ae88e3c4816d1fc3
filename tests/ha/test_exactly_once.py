"""What clients see across a failover: a publisher resending with the same message-ids creates no duplicate
(`duplicate-window` replicated to the backups), and messages delivered but not settled come back marked as possible
duplicates (acquisitions replicated). Real broker processes, SIGKILL of the primary.

The module is also the pipelining publisher the first test runs as a subprocess:

    python -m tests.ha.test_exactly_once URL,URL,... QUEUE COUNT OUT [WINDOW]
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from proton import Delivery, Message, Timeout
from proton.handlers import MessagingHandler
from proton.reactor import AtMostOnce, Container

from tests.support.amqp import connect, mgmt, settle_last
from tests.support.cluster import Cluster
from tests.support.procs import wait_for
from tests.support.txn import Txn

Make = Callable[..., Cluster]
ROOT = Path(__file__).resolve().parents[2]


# ----- the publisher -------------------------------------------------------------------------------------------
class Publisher(MessagingHandler):  # type: ignore[misc]
    """Sends message-ids m-1..m-COUNT with up to WINDOW unsettled; writes each confirmed number to OUT. On losing
    its connection it tries the next URL and resends, with the same ids, every message not confirmed."""

    def __init__(self, urls: list[str], queue: str, count: int, out: Path, window: int) -> None:
        super().__init__(auto_accept=False, auto_settle=True)
        self.urls, self.queue, self.count, self.window = urls, queue, count, window
        self.out = open(out, "a", buffering=1)  # noqa: SIM115
        self.pending = list(range(count, 0, -1))  # a stack: the lowest number on top
        self.inflight: dict[Any, int] = {}
        self.confirmed = 0
        self.attempt = 0
        self.sender: Any = None
        self.conn: Any = None
        self.deadline = time.monotonic() + 120

    def on_start(self, event: Any) -> None:
        self._connect(event.container)

    def _connect(self, container: Any) -> None:
        url = self.urls[self.attempt % len(self.urls)]
        self.attempt += 1
        self.conn = container.connect(url, reconnect=False)
        self.sender = container.create_sender(self.conn, self.queue)

    def on_sendable(self, event: Any) -> None:
        s = event.sender
        while s.credit and self.pending and len(self.inflight) < self.window:
            n = self.pending.pop()
            d = s.send(Message(id=f"m-{n}", body=n, durable=True))
            self.inflight[d] = n

    def on_accepted(self, event: Any) -> None:
        n = self.inflight.pop(event.delivery, None)
        if n is not None:
            self.out.write(f"{n}\n")
            self.confirmed += 1
            if self.confirmed == self.count:
                event.connection.close()
                return
        self.on_sendable(event)

    def on_rejected(self, event: Any) -> None:
        self._lost(event)

    def on_released(self, event: Any) -> None:
        self._lost(event)

    def _lost(self, event: Any) -> None:
        n = self.inflight.pop(event.delivery, None)
        if n is not None:
            self.pending.append(n)

    def on_transport_error(self, event: Any) -> None:
        self._failover(event)

    def on_connection_error(self, event: Any) -> None:
        self._failover(event)

    def on_disconnected(self, event: Any) -> None:
        self._failover(event)

    def _failover(self, event: Any) -> None:
        if self.confirmed == self.count or self.conn is None:  # done, or already failing over
            return
        if time.monotonic() > self.deadline:
            raise SystemExit("publisher: gave up")
        self.pending.extend(sorted(self.inflight.values(), reverse=True))  # resend, same ids, lowest first
        self.inflight.clear()
        self.conn = None
        event.container.schedule(0.1, self)  # on_timer_task: connect again

    def on_timer_task(self, event: Any) -> None:
        if self.conn is None:
            self._connect(event.container)


def _publisher_main(argv: list[str]) -> int:
    urls, queue, count, out = argv[0].split(","), argv[1], int(argv[2]), Path(argv[3])
    window = int(argv[4]) if len(argv) > 4 else 200
    p = Publisher(urls, queue, count, out, window)
    Container(p).run()
    return 0 if p.confirmed == p.count else 1


# ----- helpers -------------------------------------------------------------------------------------------------
def _take_all(url: str, queue: str) -> list[Message]:
    """Every message of `queue` (accepted), until none arrives for a second."""
    c = connect(url, 30)
    try:
        r = c.create_receiver(queue, credit=500)
        out: list[Message] = []
        while True:
            try:
                m = r.receive(timeout=1.0)
            except Exception:
                return out
            out.append(m)
            r.accept()
    finally:
        c.close()


def _take_unsettled(conn: Any, queue: str, n: int) -> tuple[list[Message], Any]:
    """Exactly `n` messages of `queue`, left unsettled (credit given once: no prefetch window that refills)."""
    r = conn.create_receiver(queue, credit=0)
    r.link.flow(n)
    conn.wait(lambda: r.fetcher.has_message >= n, timeout=10, msg=f"{n} messages")
    return [r.fetcher.pop() for _ in range(n)], r


def _confirmed(path: Path) -> list[int]:
    return [int(x) for x in path.read_text().split()] if path.exists() else []


def _send_ids(url: str, queue: str, numbers: list[int]) -> None:
    c = connect(url)
    try:
        s = c.create_sender(queue)
        for n in numbers:
            s.send(Message(id=f"m-{n}", body=n, durable=True))
    finally:
        c.close()


# ----- tests ---------------------------------------------------------------------------------------------------
def test_publisher_resending_after_sigkill_of_the_primary_delivers_each_id_exactly_once(
        cluster: Make, tmp_path: Path) -> None:
    c = cluster(2)
    c.start_with_primary(0)
    with mgmt(c[0].url) as m:
        m.call("CREATE", "queue", "eo", {"arguments": {"duplicate-window": 100_000}})
    count = 6000
    out = tmp_path / "confirmed.txt"
    pub = subprocess.Popen([sys.executable, "-m", "tests.ha.test_exactly_once", ",".join(c.urls), "eo", str(count),
                            str(out), "300"], cwd=ROOT, stderr=open(tmp_path / "publisher.err", "wb"))  # noqa: SIM115
    try:
        wait_for(lambda: len(_confirmed(out)) >= count // 3, timeout=60, what="a third confirmed")
        c[0].kill()  # mid-stream: up to 300 messages in flight, some replicated and not confirmed
        c.promote(1)
        c.wait_state(1, "recovering", "active")
        assert pub.wait(120) == 0, (tmp_path / "publisher.err").read_text()[-2000:]
    finally:
        if pub.poll() is None:
            pub.kill()
            pub.wait()
    assert sorted(set(_confirmed(out))) == list(range(1, count + 1))
    # A publisher that lost every confirmation resends the first 1000 too: all dropped by the promoted backup.
    _send_ids(c[1].url, "eo", list(range(1, 1001)))
    got = _take_all(c[1].url, "eo")
    ids = Counter(str(m.id) for m in got)
    dupes = sorted(i for i, n in ids.items() if n > 1)
    assert not dupes, f"{len(got) - len(ids)} duplicates, e.g. {dupes[:10]}"
    assert sorted(int(str(m.body)) for m in got) == list(range(1, count + 1))
    with mgmt(c[1].url) as m:
        assert m.call("READ", "queue", "eo").body["duplicates"] >= 1000


def _windowed_queue_on_two(cluster: Make, queue: str) -> tuple[Cluster, Any, Any]:
    """Two brokers (a backup stopped by the test is not dropped while it watches: heartbeat 4 s), `queue` with a
    duplicate window, and two client connections to the primary."""
    c = cluster(2, heartbeat=4.0)
    c.start_with_primary(0)
    with mgmt(c[0].url) as m:
        m.call("CREATE", "queue", queue, {"arguments": {"duplicate-window": 100}})
    return c, connect(c[0].url), connect(c[0].url)


def _bodies_after_failover(c: Cluster, queue: str) -> list[Any]:
    """Kill the primary, promote the backup: the bodies of `queue` it delivers."""
    c[0].kill()
    c.promote(1)
    c.wait_state(1, "recovering", "active")
    return [m.body for m in _take_all(c[1].url, queue)]


def test_a_resend_to_the_same_primary_is_answered_only_after_its_original(cluster: Make) -> None:
    """A publisher that times out and resends on a new link while its original is still being replicated: the
    window drops the resend, and the resend is confirmed only once the original is (were it confirmed at once, a
    primary dying before the backup had the original would lose a message the publisher saw confirmed)."""
    c, first, second = _windowed_queue_on_two(cluster, "resend")
    c[1].signal(signal.SIGSTOP)
    try:
        original = first.create_sender("resend").link.send(Message(id="m-1", body=1, durable=True))
        with contextlib.suppress(Timeout):
            first.wait(lambda: original.settled, timeout=0.5)  # it goes out, and stays unconfirmed
        assert not original.settled
        resend = second.create_sender("resend").link.send(Message(id="m-1", body=1, durable=True))
        with contextlib.suppress(Timeout):
            second.wait(lambda: resend.settled, timeout=1.0)
        assert not resend.settled and not original.settled
    finally:
        c[1].signal(signal.SIGCONT)
    second.wait(lambda: resend.settled, timeout=10)
    first.wait(lambda: original.settled, timeout=10)
    assert resend.remote_state == Delivery.ACCEPTED and original.remote_state == Delivery.ACCEPTED
    first.close()
    second.close()
    assert _bodies_after_failover(c, "resend") == [1]


def test_a_retried_transaction_whose_messages_the_window_drops_is_answered_only_after_the_first_commit(
        cluster: Make) -> None:
    """A client loses its connection while its commit waits for the backup, and retries the transaction with the
    same message-ids: the window drops them, and the retry is answered only once the first commit is (it was
    answered at once: a primary dying before the backup had the first commit lost the message the client was told
    was committed)."""
    c, first, second = _windowed_queue_on_two(cluster, "tq")
    c[1].signal(signal.SIGSTOP)
    try:
        t1 = Txn(first)
        t1.send(first.create_sender("tq"), Message(id="order-42", body=42, durable=True))
        t1.start_commit()
        assert t1.answered(0.5) is None  # it waits for the backup
        t2 = Txn(second)
        t2.send(second.create_sender("tq"), Message(id="order-42", body=42, durable=True))
        t2.start_commit()
        assert t2.answered(1.0) is None
    finally:
        c[1].signal(signal.SIGCONT)
    assert t2.answered(10) == "committed" and t1.answered(10) == "committed"
    first.close()
    second.close()
    assert _bodies_after_failover(c, "tq") == [42]


def test_a_resend_the_window_drops_is_held_while_a_new_primary_recovers(cluster: Make) -> None:
    """A new primary holds what it takes until the backups that were ready before are back (recovery): a resend
    its window drops is held too (it was answered at once; were the new primary to die before the other backup
    had the original, the resend confirmed would be lost)."""
    c = cluster(3)
    c.start_with_primary(0)
    with mgmt(c[0].url) as m:
        m.call("CREATE", "queue", "rq", {"arguments": {"duplicate-window": 100}})
    sender = connect(c[0].url)
    sender.create_sender("rq").send(Message(id="m-1", body=1, durable=True))
    sender.close()
    c[2].signal(signal.SIGSTOP)
    try:
        c[0].kill()
        c.promote(1)
        assert c.wait_state(1, "recovering", "active")["state"] == "recovering"
        conn = connect(c[1].url)
        link = conn.create_sender("rq").link
        fresh = link.send(Message(id="m-2", body=2, durable=True))
        resend = link.send(Message(id="m-1", body=1, durable=True))
        with contextlib.suppress(Timeout):
            conn.wait(lambda: resend.settled, timeout=1.0)
        assert not resend.settled and not fresh.settled
    finally:
        c[2].signal(signal.SIGCONT)
    conn.wait(lambda: resend.settled and fresh.settled, timeout=20)
    assert resend.remote_state == Delivery.ACCEPTED and fresh.remote_state == Delivery.ACCEPTED
    conn.close()
    assert [m.body for m in _take_all(c[1].url, "rq")] == [1, 2]


def _consumed_at_once_then_failover(c: Cluster, queue: str, publisher: Any, consumer: Any) -> None:
    """With the backup stopped, publish id m-1 to `queue` and let an at-most-once consumer take it: the publisher
    must not be confirmed before the backup (continued) has the id. Then a failover, and m-1 resent to the promoted
    backup as by a publisher whose confirmation was lost: it must be dropped."""
    receiver = consumer.create_receiver(queue, credit=10, options=AtMostOnce())
    sent = publisher.create_sender(queue).link.send(Message(id="m-1", body=1, durable=True))
    try:
        with contextlib.suppress(Timeout):
            publisher.wait(lambda: sent.settled, timeout=1.0)  # it goes out
        assert receiver.receive(5).body == 1  # consumed on the primary (before the backup could be sent it)
        with contextlib.suppress(Timeout):
            publisher.wait(lambda: sent.settled, timeout=1.0)
        assert not sent.settled, "confirmed while the backup did not have the id"
    finally:
        c[1].signal(signal.SIGCONT)
    publisher.wait(lambda: sent.settled, timeout=10)
    assert sent.remote_state == Delivery.ACCEPTED
    publisher.close()
    consumer.close()
    c[0].kill()
    c.promote(1)
    c.wait_state(1, "recovering", "active")
    _send_ids(c[1].url, queue, [1])
    assert _take_all(c[1].url, queue) == []


def test_a_message_consumed_before_its_batch_went_out_is_confirmed_once_the_backup_has_its_id(
        cluster: Make) -> None:
    """An at-most-once consumer takes a windowed message before the backup was sent it: the publisher was
    confirmed at the dequeue, the backup never learned the id, and a resend after a failover (the confirmation
    lost) was delivered again. Now the backup is sent the id alone (a "G" record, batch version 4) and the
    publisher is confirmed once it acknowledges it."""
    c, consumer, publisher = _windowed_queue_on_two(cluster, "eo")
    c[1].signal(signal.SIGSTOP)
    _consumed_at_once_then_failover(c, "eo", publisher, consumer)


def test_a_message_consumed_before_the_backup_attached_its_queue_is_confirmed_once_it_did(cluster: Make) -> None:
    """The queue is declared while the backup is stopped, and its message consumed before the backup attaches its
    browser (so it is never sent): the publisher waits for the backup to attach and acknowledge the position (the
    id came in the window of its first batch)."""
    c = cluster(2, heartbeat=4.0)  # the stopped backup is not dropped while the test watches
    c.start_with_primary(0)
    c[1].signal(signal.SIGSTOP)
    try:
        with mgmt(c[0].url) as m:
            m.call("CREATE", "queue", "late", {"arguments": {"duplicate-window": 100}})
    except BaseException:
        c[1].signal(signal.SIGCONT)
        raise
    _consumed_at_once_then_failover(c, "late", connect(c[0].url), connect(c[0].url))


def test_messages_delivered_but_not_settled_come_back_after_failover_marked_redelivered(cluster: Make) -> None:
    c = cluster(2)
    c.start_with_primary(0)
    with mgmt(c[0].url) as m:
        m.call("CREATE", "queue", "work", {})
    conn = connect(c[0].url)
    s = conn.create_sender("work")
    for n in range(10):
        s.send(Message(body=n))
    taken = _take_unsettled(conn, "work", 6)
    assert [m.body for m in taken[0]] == list(range(6))
    settle_last(taken[1], Delivery.RELEASED)  # 0 and 1 go back untried (not a failed delivery)
    settle_last(taken[1], Delivery.RELEASED)
    # 2..5 stay unsettled. A message confirmed after this was acknowledged by the backup after the batch that
    # told it about the acquisitions and releases (a backup applies in order).
    s.send(Message(body="marker"))
    c[0].kill()
    c.promote(1)
    c.wait_state(1, "recovering", "active")
    got = _take_all(c[1].url, "work")
    seen = {m.body: (m.delivery_count, m.first_acquirer) for m in got}
    assert sorted(seen, key=str) == sorted([*range(10), "marker"], key=str)
    # (first-acquirer is false on every message: the broker does not set it on a first delivery either.)
    assert {b: count for b, (count, _) in seen.items()} == {0: 0, 1: 0, 2: 1, 3: 1, 4: 1, 5: 1, 6: 0, 7: 0, 8: 0,
                                                            9: 0, "marker": 0}


def test_a_backup_joining_while_messages_are_held_learns_it_in_catch_up(cluster: Make) -> None:
    """The backup starts after the consumer took the messages: catch-up carries the acquired flag."""
    c = cluster(2)
    c.start(0)
    c.promote(0)
    c.wait_state(0, "active")
    with mgmt(c[0].url) as m:
        m.call("CREATE", "queue", "late", {})
    conn = connect(c[0].url)
    s = conn.create_sender("late")
    for n in range(6):
        s.send(Message(body=n))
    assert [m.body for m in _take_unsettled(conn, "late", 3)[0]] == [0, 1, 2]
    c.start(1)
    c.wait_state(1, "ready")
    c[0].kill()
    c.promote(1)
    c.wait_state(1, "recovering", "active")
    got = _take_all(c[1].url, "late")
    assert {m.body: m.delivery_count for m in got} == {0: 1, 1: 1, 2: 1, 3: 0, 4: 0, 5: 0}


def test_a_backup_joining_later_gets_the_whole_window_including_ids_already_consumed(cluster: Make) -> None:
    c = cluster(2)
    c.start(0)
    c.promote(0)
    c.wait_state(0, "active")
    with mgmt(c[0].url) as m:
        m.call("CREATE", "queue", "ids", {"arguments": {"duplicate-window": 150}})
    _send_ids(c[0].url, "ids", list(range(1, 201)))  # the window keeps 51..200
    assert len(_take_all(c[0].url, "ids")) == 200  # consumed: only the window remembers them
    c.start(1)
    c.wait_state(1, "ready")
    _send_ids(c[0].url, "ids", [201])  # live, after the snapshot: evicts 51
    c[0].kill()
    c.promote(1)
    c.wait_state(1, "recovering", "active")
    _send_ids(c[1].url, "ids", list(range(52, 202)))  # the whole window: all dropped (so nothing is evicted)
    _send_ids(c[1].url, "ids", [51, 202])  # 51 was evicted by 201: new, like 202
    assert [m.body for m in _take_all(c[1].url, "ids")] == [201, 51, 202]  # 201 was never consumed


if __name__ == "__main__":
    sys.exit(_publisher_main(sys.argv[1:]))
