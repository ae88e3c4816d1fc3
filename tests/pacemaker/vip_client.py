"""A client that only knows the VIP: sends numbered messages, reconnecting through failovers, and logs each one the
broker settled as accepted. Run inside the client namespace:

    python -m tests.pacemaker.vip_client send --url 10.77.0.100:5672 --queue q --log sent.log
    python -m tests.pacemaker.vip_client drain --url 10.77.0.100:5672 --queue q

``send`` writes ``<unix-ts> <n>`` per accepted message (so the failover gap can be measured) until SIGTERM.
``drain`` prints every message body (the numbers) left on the queue, one per line.
``fill --count N`` sends 1..N (each settled by the broker); ``take --count N`` takes N messages in receiver-settle-mode
second, accepts them and waits until the broker settled every accept (it then holds them dequeued on its backups),
and prints their bodies.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import time
from types import FrameType

from proton import ConnectionException, Delivery, Link, LinkException, Message, Timeout
from proton.reactor import LinkOption
from proton.utils import BlockingConnection, SendException

TRANSIENT = (ConnectionException, LinkException, Timeout, SendException, OSError)
_stop = False


def _on_term(signum: int, frame: FrameType | None) -> None:
    global _stop
    _stop = True


def drop(conn: BlockingConnection) -> None:
    """Forget a broken connection at once.

    ``BlockingConnection.close()`` waits for the peer's close frame and then runs the event loop until the socket
    is gone: behind a crashed primary (or a VIP that moved) that is until TCP gives up, tens of seconds. Closing
    the transport first makes the close local and immediate.
    """
    transport = conn.conn.transport if conn.conn is not None else None
    if transport is not None:
        transport.close_tail()
        transport.close_head()
    conn.disconnected = conn.disconnected or "dropped by the client"
    with contextlib.suppress(Exception):
        conn.close()


def send(url: str, queue: str, log_path: str, interval: float, timeout: float, connect_timeout: float) -> int:
    signal.signal(signal.SIGTERM, _on_term)
    n = 1
    with open(log_path, "a", buffering=1) as log:
        while not _stop:
            try:
                # A short connect timeout: while the VIP moves, a SYN sent to the old owner's MAC is lost and TCP
                # would only retry it after 1 s, 3 s, ...; a new attempt every connect_timeout gets through as soon
                # as the new owner's gratuitous ARP has arrived.
                conn = BlockingConnection(url, timeout=connect_timeout, reconnect=False)
            except TRANSIENT as exc:
                print(f"{time.time():.3f} connect: {exc!r}", flush=True)
                time.sleep(0.05)
                continue
            conn.timeout = timeout
            print(f"{time.time():.3f} connected", flush=True)
            try:
                sender = conn.create_sender(queue)
                while not _stop:
                    sender.send(Message(body=n, durable=True))  # blocks until settled; raises unless accepted
                    log.write(f"{time.time():.6f} {n}\n")
                    n += 1
                    if interval:
                        time.sleep(interval)
            except TRANSIENT as exc:  # resend n on the next connection: at-least-once
                print(f"{time.time():.3f} message {n}: {exc!r}", flush=True)
                drop(conn)
            else:
                with contextlib.suppress(Exception):
                    conn.close()
    return 0


def drain(url: str, queue: str, timeout: float) -> int:
    conn = BlockingConnection(url, timeout=timeout, reconnect=False)
    receiver = conn.create_receiver(queue, credit=100)
    try:
        while True:
            try:
                msg = receiver.receive(timeout=timeout)
            except Timeout:
                break
            print(msg.body)
            receiver.accept()
    finally:
        conn.close()
    return 0


def fill(url: str, queue: str, count: int, timeout: float) -> int:
    conn = BlockingConnection(url, timeout=timeout, reconnect=False)
    try:
        sender = conn.create_sender(queue)
        for n in range(1, count + 1):
            sender.send(Message(body=n, durable=True))
    finally:
        conn.close()
    print(count)
    return 0


class _SettleSecond(LinkOption):  # type: ignore[misc]
    def apply(self, link: Link) -> None:
        link.rcv_settle_mode = Link.RCV_SECOND


def take(url: str, queue: str, count: int, timeout: float) -> int:
    conn = BlockingConnection(url, timeout=timeout, reconnect=False)
    try:
        r = conn.create_receiver(queue, credit=0, options=_SettleSecond())
        fetcher = r.fetcher
        assert fetcher is not None
        r.link.flow(count)
        conn.wait(lambda: fetcher.has_message >= count, timeout=timeout, msg=f"{count} messages")
        deliveries, bodies = [], []
        for _ in range(count):
            bodies.append(fetcher.pop().body)
            d = fetcher.unsettled.popleft()
            d.update(Delivery.ACCEPTED)
            deliveries.append(d)
        conn.wait(lambda: all(d.settled for d in deliveries), timeout=timeout, msg="accepts settled")
        for d in deliveries:
            d.settle()
    finally:
        conn.close()
    print(*bodies, sep="\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["send", "drain", "fill", "take"])
    p.add_argument("--count", type=int, default=10, help="fill/take: how many messages")
    p.add_argument("--url", required=True)
    p.add_argument("--queue", default="failover")
    p.add_argument("--log", default="sent.log")
    p.add_argument("--interval", type=float, default=0.005)
    p.add_argument("--timeout", type=float, default=2.0, help="seconds to wait for a settlement")
    p.add_argument("--connect-timeout", type=float, default=0.5, help="seconds per connection attempt")
    a = p.parse_args(argv)
    if a.mode == "send":
        return send(a.url, a.queue, a.log, a.interval, a.timeout, a.connect_timeout)
    if a.mode == "fill":
        return fill(a.url, a.queue, a.count, a.timeout)
    if a.mode == "take":
        return take(a.url, a.queue, a.count, a.timeout)
    return drain(a.url, a.queue, a.timeout)


if __name__ == "__main__":
    sys.exit(main())
