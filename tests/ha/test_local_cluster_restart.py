"""understudy-cluster's manager after a whole-cluster outage: every broker SIGKILLed, restarted from its journal,
the newest store promoted (ha.core.restart), nothing confirmed lost; an older store never wins, even when it is
back first. A primary that stops answering is fenced (killed) before a backup is promoted, and a primary with
no backup ready confirms nothing (the manager's brokers run with `--ha-min-ready-backups 1`), and of two primaries
the older one steps down.

The manager (ha.local_cluster.Manager) runs in the test process, turn by turn; the brokers are real processes."""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from proton import Message, Timeout

from broker.client import ManagementClient, ManagementError
from ha.local_cluster import Manager, Member, make_members
from tests.support.amqp import connect, drain, mgmt
from tests.support.bulk import fill
from tests.support.cluster import free_port_run
from tests.support.procs import read_events


@pytest.fixture
def members(tmp_path: Path) -> Iterator[list[Member]]:
    ms = make_members(3, free_port_run(3), tmp_path, heartbeat=0.5, extra=["--ha-backup-timeout", "2"])
    try:
        yield ms
    finally:
        for m in ms:
            if m.alive:
                assert m.proc is not None
                m.proc.kill()
                m.proc.wait(10)
        for m in ms:
            events = m.data_dir / "events.log"
            if events.exists():
                print(f"==== {m.name}: {events}\n" + events.read_text()[-4000:])


def turn_until(mgr: Manager, pred: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        mgr.step(timeout=2.0)
        if callable(pred) and pred():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}: "
                         f"{[(m.name, m.status and (m.status['role'], m.status['state'])) for m in mgr.members]}")


def state(m: Member) -> str | None:
    return m.status["state"] if m.status else None


def all_up(mgr: Manager) -> bool:
    return sorted(state(m) or "" for m in mgr.members) == ["active", "ready", "ready"]


def sigkill(m: Member) -> None:
    assert m.proc is not None
    m.proc.send_signal(signal.SIGKILL)
    m.proc.wait(10)


def promoted(m: Member) -> list[dict[str, object]]:
    return [e for e in read_events(m.data_dir / "events.log") if e["event"] == "ha.promoted"]


def start_loaded(members: list[Member], said: list[str]) -> tuple[Manager, Member]:
    mgr = Manager(members, echo=False, restart_wait=60.0)
    mgr.say = lambda text, once=False: said.append(text)  # type: ignore[method-assign]
    for m in members:
        m.start()
    turn_until(mgr, lambda: all_up(mgr), 60, "a primary and two ready backups")
    primary = next(m for m in members if state(m) == "active")
    with mgmt(primary.url) as c:
        c.call("CREATE", "queue", "d", {"arguments": {"durable": True}})
    turn_until(mgr, lambda: all_up(mgr), 30, "the backups ready again after the new queue")
    fill(primary.url, "d", 1000, durable=True)
    return mgr, primary


def test_after_every_broker_is_sigkilled_the_manager_restarts_them_and_promotes_the_newest_store(
    members: list[Member],
) -> None:
    said: list[str] = []
    mgr, _ = start_loaded(members, said)
    for m in members:
        sigkill(m)
    turn_until(mgr, lambda: any(state(m) == "active" for m in members), 60, "a primary after the restart")
    assert any("no broker is running: restarting every broker from its journal" in s for s in said)
    assert any("whole-cluster restart:" in s and "holds the newest store" in s for s in said), said
    winner = next(m for m in members if state(m) == "active")
    assert promoted(winner)[-1]["forced"] is False  # newest_store, not --force
    turn_until(mgr, lambda: all_up(mgr), 60, "the others back as ready backups")
    assert sorted(drain(winner.url, "d")) == list(range(1, 1001))


def test_replication_is_authenticated_with_a_secret_made_once(members: list[Member], tmp_path: Path) -> None:
    """The brokers log in to each other as the replication user, with a password of the data directory's (never
    on a command line); any other connection that asks to be a backup is refused."""
    said: list[str] = []
    _, primary = start_loaded(members, said)
    secret = tmp_path / "replication.secret"
    assert secret.stat().st_mode & 0o777 == 0o600 and len(secret.read_text().strip()) >= 24
    assert make_members(3, 1, tmp_path, 0.5)[0].env["UNDERSTUDY_HA_PASSWORD"] == secret.read_text().strip()
    for m in members:
        assert m.proc is not None
        assert secret.read_text().strip() not in " ".join(str(a) for a in m.proc.args)  # type: ignore[union-attr]
        assert not [e for e in read_events(m.data_dir / "events.log") if e["event"] == "access.open"]
    with pytest.raises(ManagementError, match="unauthorized-access"):
        ManagementClient(primary.url, 5, kind="ha").close()  # anonymous, asking to replicate


def test_a_dropped_backup_back_first_never_wins_and_catches_up(members: list[Member]) -> None:
    said: list[str] = []
    mgr, primary = start_loaded(members, said)
    dropped = next(m for m in members if m is not primary)
    sigkill(dropped)
    fill(primary.url, "d", 500, start=1001, durable=True)  # confirmed once the primary dropped it (2 s)
    for m in members:
        if m.alive:
            sigkill(m)
    dropped.start()  # the older store is back first; the manager waits for the others it names
    mgr.restart_wait = 0.0  # and waiting longer changes nothing: its list names brokers that are not back
    for _ in range(10):
        dropped.poll_status(2.0)
        if dropped.status:
            break
        time.sleep(0.5)
    assert dropped.status and dropped.status["state"] == "joining"
    mgr.step(timeout=2.0)  # the others are restarted in this turn; only the dropped one answers yet
    others = sorted(m.name for m in members if m is not dropped)
    assert any(f"no primary: waiting for {', '.join(others)}" in s for s in said), said
    turn_until(mgr, lambda: any(state(m) == "active" for m in members), 60, "a primary after the restart")
    winner = next(m for m in members if state(m) == "active")
    assert winner is not dropped and not promoted(dropped)
    turn_until(mgr, lambda: all_up(mgr), 60, "the dropped backup caught up")
    assert sorted(drain(winner.url, "d")) == list(range(1, 1501))


def test_a_primary_that_stops_answering_is_killed_before_a_backup_is_promoted_so_it_never_resumes_as_a_second_one(
    members: list[Member],
) -> None:
    said: list[str] = []
    mgr, primary = start_loaded(members, said)
    mgr.fence_after = 2.0
    stopped = primary.proc
    assert stopped is not None
    stopped.send_signal(signal.SIGSTOP)  # hung, as far as anyone can tell: alive and silent
    try:
        turn_until(mgr, lambda: any(state(m) == "active" for m in members if m is not primary), 60,
                   "a backup promoted")
    finally:
        with contextlib.suppress(ProcessLookupError):
            stopped.send_signal(signal.SIGCONT)
    time.sleep(1.0)  # had it lived, it would be running again by now
    primaries = [m.name for m in members if (m.poll_status(2.0) or {}).get("role") == "primary"]
    assert len(primaries) == 1 and primaries[0] != primary.name, primaries
    assert any(f"{primary.name} (primary) did not answer for 2 s: killed it (fenced)" in s for s in said), said
    assert stopped.returncode == -signal.SIGKILL
    turn_until(mgr, lambda: all_up(mgr), 60, "the old primary back as a ready backup")
    assert primary.status is not None and primary.status["role"] == "backup"
    assert sorted(drain(next(m for m in members if state(m) == "active").url, "d")) == list(range(1, 1001))


def test_a_primary_that_lost_every_backup_confirms_nothing_until_one_is_back(members: list[Member]) -> None:
    """Confirmed alone, a message would be lost if a backup then took over (the chaos run found it)."""
    said: list[str] = []
    mgr, primary = start_loaded(members, said)
    for m in members:
        if m is not primary:
            sigkill(m)  # the manager (not turning now) would restart them at once
    conn = connect(primary.url)
    try:
        d = conn.create_sender("d").link.send(Message(body=1001, durable=True))
        with pytest.raises(Timeout):
            conn.wait(lambda: d.settled, timeout=4.0, msg="settlement")  # dropped after 2 s; then held
        turn_until(mgr, lambda: all_up(mgr), 60, "the backups restarted and ready")
        conn.wait(lambda: d.settled, timeout=10.0, msg="settlement")
    finally:
        conn.close()
    assert sorted(drain(primary.url, "d")) == list(range(1, 1002))


def test_a_backup_promoted_by_hand_beside_the_primary_leaves_one_primary_and_nothing_lost(
    members: list[Member],
) -> None:
    said: list[str] = []
    mgr, primary = start_loaded(members, said)
    other = next(m for m in members if m is not primary)
    with mgmt(other.url) as c:
        assert c.request("PROMOTE", "ha-broker").ok  # an operator's mistake: the old primary still lives
    turn_until(mgr, lambda: state(primary) != "active" and state(other) == "active", 30, "the old primary demoted")
    assert any(f"two primaries: demoting {primary.name} (epoch 1); {other.name} has epoch 2" in s for s in said), said
    turn_until(mgr, lambda: all_up(mgr), 60, "one primary and two ready backups")
    assert primary.status is not None and primary.status["role"] == "backup"
    assert sorted(drain(other.url, "d")) == list(range(1, 1001))
