"""Recovery phase: how long a broker takes to come back after a crash with N durable messages in its journal.

Timeline (on a started standalone durable target, `ours-durable`): create a fresh durable queue and fill it with N
durable messages (C client, 1000 in flight, every message confirmed, so every one is on disk); SIGKILL the broker
(no clean shutdown); start it again on the same data dir and port; poll management (`READ queue`, every 20 ms)
until it answers; read the queue's depth; delete the queue.

Reported: the broker's own `journal.recovered` event (`seconds`: reading the journal and rebuilding the queues;
`messages`, `bytes`, `segments`), the time from the new process's start to its first management answer (Python
start-up + recovery + listening: what a client sees), and the depth after recovery (must be N).
"""

from __future__ import annotations

import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench import cclient, stats
from bench.ours import OursStandalone

POLL_SECONDS = 0.02
DELETE_TIMEOUT = 300.0


@dataclass
class RecoveryResult:
    target: str
    messages: int  # filled (accepted, so durable on disk)
    fill_seconds: float
    fill_rate: float
    journal_seconds: float  # `journal.recovered` seconds
    journal_messages: int  # `journal.recovered` messages
    journal_bytes: int
    journal_segments: int
    answer_seconds: float  # new process start -> first management answer
    depth_after: int  # the queue's depth after recovery (-1 unknown)
    phase: str = "recovery"
    errors: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def recovered_fields(event: dict[str, Any]) -> tuple[float, int, int, int]:
    """(seconds, messages, bytes, segments) of a `journal.recovered` event; NaN / -1 where missing (pure)."""
    def num(k: str) -> float:
        v = event.get(k)
        return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else float("nan")

    def integer(k: str) -> int:
        v = num(k)
        return int(v) if v == v else -1

    return num("seconds"), integer("messages"), integer("bytes"), integer("segments")


def run_recovery(target: OursStandalone, n: int, size: int, loadgen: str | Path, give_up: float = 3600.0
                 ) -> RecoveryResult:
    if not target.durable or target.broker is None:
        raise RuntimeError(f"recovery phase: {target.name} is not a started durable standalone target")
    queue = f"bench-recovery-{uuid.uuid4().hex[:8]}"
    errors: list[str] = []
    target.create_queue(queue)
    accepted, fill_s, _ = cclient.fill(loadgen, target.client(), target.address(queue), n, size, True,
                                       timeout=give_up)
    t0 = time.monotonic()
    offset = target.restart(kill=True)
    answer = depth = float("nan")
    while True:
        try:
            d = target.queue_depth(queue, timeout=2.0)
        except Exception:
            b = target.broker
            if b.proc is None or b.proc.poll() is not None:
                errors.append(f"broker exited during recovery: {b.stderr_file.read_text()[-500:]}")
                break
            if time.monotonic() - t0 > give_up:
                errors.append(f"no management answer within {give_up}s")
                break
            time.sleep(POLL_SECONDS)
            continue
        answer, depth = time.monotonic() - t0, d
        break
    ev: dict[str, Any] = {}
    try:
        ev = dict(target.broker.wait_event("journal.recovered", timeout=10.0, after=offset))
    except RuntimeError as e:
        errors.append(str(e))
    j_s, j_msgs, j_bytes, j_segs = recovered_fields(ev)
    if depth == depth and int(depth) != accepted:
        errors.append(f"depth after recovery {int(depth)}, {accepted} were confirmed")
    try:
        target.delete_queue(queue, timeout=DELETE_TIMEOUT)
    except Exception as e:
        errors.append(f"deleting {queue}: {type(e).__name__}: {e}")
    return RecoveryResult(target=target.name, messages=accepted, fill_seconds=fill_s,
                          fill_rate=stats.rate(accepted, fill_s), journal_seconds=j_s, journal_messages=j_msgs,
                          journal_bytes=j_bytes, journal_segments=j_segs, answer_seconds=answer,
                          depth_after=int(depth) if depth == depth else -1, errors=errors)
