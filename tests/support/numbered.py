"""A numbered sender or receiver that fails over across a URL list (run as a subprocess by HA tests).

    python -m tests.support.numbered send --urls A,B,C --queue Q --count N [--first F] --out acked.txt
    python -m tests.support.numbered receive --urls A,B,C --queue Q --out received.txt [--idle 30]

The sender writes each number once the broker settled it as accepted (one per line); after a failure it resends the
numbers that were not confirmed. The receiver writes each number it accepted (and, with --history-out, which of
its accepts the broker confirmed). Both reconnect with a short backoff,
trying every URL in turn (a backup refuses clients, so only the primary takes them).
"""

from __future__ import annotations

import argparse
import contextlib
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, TextIO

from proton import Delivery, Message
from proton.utils import BlockingConnection

from tests.support.amqp import SettleSecond


def connect(urls: list[str], deadline: float) -> BlockingConnection:
    i = 0
    while True:
        url = urls[i % len(urls)]
        i += 1
        try:
            return BlockingConnection(url, timeout=5, reconnect=False)
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05 if i % len(urls) else 0.2)


def send(urls: list[str], queue: str, count: int, out: str, pause: float, first: int = 1,
         patience: float = 120.0, id_prefix: str | None = None, timeout: float = 10.0, pad: int = 0) -> int:
    """Gives up when no message could be confirmed for `patience` seconds. With `id_prefix` each message carries
    the message-id PREFIX+number (a resend has the same id); `timeout`: seconds to wait for one settlement; `pad`:
    bytes of an application property "pad" on each message (the body stays the number)."""
    props = {"pad": "p" * pad} if pad > 0 else None
    n, end = first, first + count  # the next number to send (resent until confirmed), one past the last
    deadline = time.monotonic() + patience
    with open(out, "a", buffering=1) as f:
        while n < end:
            c: BlockingConnection | None = None
            try:
                c = connect(urls, deadline)
                s = c.create_sender(queue)
                while n < end:
                    mid = None if id_prefix is None else f"{id_prefix}{n}"
                    s.send(Message(body=n, durable=True, id=mid, properties=props), timeout=timeout)
                    f.write(f"{n}\n")
                    n += 1
                    deadline = time.monotonic() + patience
                    if pause:
                        time.sleep(pause)
            except Exception as e:
                print(f"sender: {type(e).__name__}: {e}; failing over", file=sys.stderr, flush=True)
                if time.monotonic() > deadline:
                    return 1
            finally:
                _close(c)
    return 0


def _close(c: BlockingConnection | None) -> None:
    """Close a connection whatever state it is in (one left open after a failure keeps its memory for good)."""
    if c is not None:
        with contextlib.suppress(Exception):
            c.close()


def receive(urls: list[str], queue: str, out: str, idle: float, until: int, patience: float = 180.0,
            redelivered_out: str | None = None, times_out: str | None = None, history_out: str | None = None,
            pause: float = 0.0) -> int:
    """Gives up when it cannot reconnect for `patience` seconds; sleeps `pause` seconds after each message; with `redelivered_out`, the numbers that came
    flagged as possible duplicates (delivery-count > 0) are also written there; with `times_out`, each number with
    the wall-clock time it was received. With `history_out` it consumes in receiver-settle-mode second and writes
    there, in order, "d N" for each delivery and "c N" once the broker confirmed (settled) the accept of N."""
    deadline = time.monotonic() + patience
    got = 0
    flagged = open(redelivered_out, "a", buffering=1) if redelivered_out else None  # noqa: SIM115
    stamps = open(times_out, "a", buffering=1) if times_out else None  # noqa: SIM115
    history = open(history_out, "a", buffering=1) if history_out else None  # noqa: SIM115
    with open(out, "a", buffering=1) as f:
        last = time.monotonic()
        while time.monotonic() - last < idle and (until <= 0 or got < until):
            waiting: list[tuple[object, Any]] = []  # (number, delivery): accepted, not yet confirmed
            c: BlockingConnection | None = None
            try:
                c = connect(urls, deadline)
                r = c.create_receiver(queue, credit=10, options=SettleSecond() if history else None)
                while time.monotonic() - last < idle and (until <= 0 or got < until):
                    try:
                        m = r.receive(timeout=0.5)
                    except Exception as e:
                        if "Timeout" in type(e).__name__:
                            waiting = _confirmed(waiting, history)
                            continue
                        raise
                    f.write(f"{m.body}\n")
                    if stamps is not None:
                        stamps.write(f"{m.body} {time.time():.3f}\n")
                    if flagged is not None and m.delivery_count:
                        flagged.write(f"{m.body}\n")
                    if history is not None:
                        history.write(f"d {m.body}\n")
                        d = r.fetcher.unsettled.popleft()
                        d.update(Delivery.ACCEPTED)  # settled by the broker once it took effect
                        waiting.append((m.body, d))
                        waiting = _confirmed(waiting, history)
                    else:
                        r.accept()
                    got += 1
                    if pause:
                        time.sleep(pause)
                    last = time.monotonic()
                    deadline = last + patience
            except Exception as e:
                print(f"receiver: {type(e).__name__}: {e}; failing over", file=sys.stderr, flush=True)
                if time.monotonic() > deadline:
                    return 1
            finally:
                _close(c)
    for extra in (flagged, stamps, history):
        if extra is not None:
            extra.close()
    return 0


def _confirmed(waiting: list[tuple[object, Any]], history: TextIO | None) -> list[tuple[object, Any]]:
    """Write "c N" for each accept the broker settled (and settle it here too); the rest still wait."""
    rest = []
    for n, d in waiting:
        if d.settled:  # the broker settled it
            d.settle()
            if history is not None:
                history.write(f"c {n}\n")
        else:
            rest.append((n, d))
    return rest


def spawn(mode: str, urls: list[str], queue: str, out: Path, *extra: str) -> subprocess.Popen[bytes]:
    """Run this module as a subprocess (its stderr goes next to `out`, as .err)."""
    root = Path(__file__).resolve().parents[2]
    return subprocess.Popen([sys.executable, "-m", "tests.support.numbered", mode, "--urls", ",".join(urls),
                             "--queue", queue, "--out", str(out), *extra], cwd=root,
                            stderr=open(out.with_suffix(".err"), "wb"))


def numbers(path: Path) -> list[int]:
    """The numbers a sender confirmed or a receiver accepted so far."""
    return [int(x) for x in path.read_text().split()] if path.exists() else []


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["send", "receive"])
    ap.add_argument("--urls", required=True)
    ap.add_argument("--queue", required=True)
    ap.add_argument("--count", type=int, default=1000)
    ap.add_argument("--first", type=int, default=1, help="the first number to send")
    ap.add_argument("--out", required=True)
    ap.add_argument("--pause", type=float, default=0.0, help="seconds to sleep after each message sent or received")
    ap.add_argument("--idle", type=float, default=30.0)
    ap.add_argument("--until", type=int, default=0)
    ap.add_argument("--times-out", help="receiver: also write 'number time' of each delivery here")
    ap.add_argument("--redelivered-out", help="receiver: also write here the numbers flagged as redelivered")
    ap.add_argument("--history-out", help="receiver: consume in receiver-settle-mode second and write here "
                                          "'d N' per delivery and 'c N' per accept the broker confirmed")
    ap.add_argument("--id-prefix", help="sender: message-id PREFIX+number on each message")
    ap.add_argument("--timeout", type=float, default=10.0, help="sender: seconds to wait for one settlement")
    ap.add_argument("--patience", type=float, default=120.0, help="seconds without progress before giving up")
    ap.add_argument("--pad", type=int, default=0, help="sender: bytes of padding (an application property) a message")
    a = ap.parse_args()
    urls = a.urls.split(",")
    if a.mode == "send":
        return send(urls, a.queue, a.count, a.out, a.pause, a.first, a.patience, a.id_prefix, a.timeout, a.pad)
    return receive(urls, a.queue, a.out, a.idle, a.until, a.patience, a.redelivered_out, a.times_out,
                   a.history_out, a.pause)


if __name__ == "__main__":
    sys.exit(main())
