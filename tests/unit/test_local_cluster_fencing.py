"""understudy-cluster's manager fences a primary that lives but stops answering (ha.local_cluster.Manager): it
waits `fence_after`, kills it, and only then promotes. The members are fakes: their answers are scripted and their
processes stand-ins; the real thing is tests/ha/test_local_cluster_restart.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from broker.store import records as R
from ha.core.restart import ReadyView
from ha.local_cluster import Manager, Member


class Proc:
    """A stand-in for the broker's `subprocess.Popen`."""

    def __init__(self) -> None:
        self.returncode: int | None = None

    def poll(self) -> int | None:
        return self.returncode

    def kill(self) -> None:
        self.returncode = -9

    def wait(self, timeout: float | None = None) -> int | None:
        return self.returncode


class Scripted(Member):
    def __init__(self, name: str, answer: dict[str, Any] | None) -> None:
        super().__init__(name, 1, Path("/nonexistent"), [])
        self.answer = answer
        self.proc = Proc()  # type: ignore[assignment]
        self.starts = 0

    def _ask(self, timeout: float) -> dict[str, Any] | None:
        return self.answer

    def _spawn(self) -> Any:
        self.starts += 1
        return Proc()


def status(name: str, role: str, state: str, position: int = 10, epoch: int = 1) -> dict[str, Any]:
    return {"name": name, "role": role, "state": state, "epoch": epoch, "position": position, "ready_view": None}


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def cluster() -> tuple[Manager, list[Scripted], Clock, list[str]]:
    ms = [Scripted("b1", status("b1", "primary", "active")), Scripted("b2", status("b2", "backup", "ready", 10)),
          Scripted("b3", status("b3", "backup", "ready", 9))]
    clock = Clock()
    mgr = Manager(list(ms), echo=False, clock=clock, fence_after=5.0)
    said: list[str] = []
    mgr.say = lambda text, once=False: said.append(text)  # type: ignore[method-assign]
    promoted: list[str] = []
    mgr._promote = lambda name, body: promoted.append(name)  # type: ignore[method-assign]
    mgr.promoted = promoted  # type: ignore[attr-defined]
    requests: list[tuple[str, str]] = []
    mgr._request = lambda m, op, body: requests.append((op, m.name))  # type: ignore[method-assign]
    mgr.requests = requests  # type: ignore[attr-defined]
    mgr.step()
    return mgr, ms, clock, said


def test_a_silent_primary_is_waited_for_then_killed_before_the_best_ready_backup_is_promoted() -> None:
    mgr, (b1, *_), clock, said = cluster()
    b1.answer = None  # stopped or hung: its process lives
    for dt in (0.0, 2.0, 4.9):
        clock.now = 100.0 + dt
        mgr.step()
        assert b1.alive and mgr.promoted == []  # type: ignore[attr-defined]
    assert said[-1] == "b1 (primary) does not answer: killing it if it still does not after 5 s"
    clock.now = 105.1
    mgr.step()
    assert not b1.alive and mgr.promoted == ["b2"]  # type: ignore[attr-defined]
    assert "b1 (primary) did not answer for 5 s: killed it (fenced) before promoting another" in said


def test_a_primary_that_answers_again_in_time_is_left_alone() -> None:
    mgr, (b1, *_), clock, _ = cluster()
    b1.answer, clock.now = None, 101.0
    mgr.step()
    b1.answer, clock.now = status("b1", "primary", "active"), 104.0
    mgr.step()
    b1.answer, clock.now = None, 108.0  # silent again: the wait starts over
    mgr.step()
    assert b1.alive and mgr.promoted == []  # type: ignore[attr-defined]


def test_a_dead_primary_is_replaced_at_once_and_restarted() -> None:
    mgr, (b1, *_), _, said = cluster()
    b1.proc.kill()  # type: ignore[union-attr]
    mgr.step()
    assert mgr.promoted == ["b2"] and b1.starts == 0  # type: ignore[attr-defined]
    assert not any("does not answer" in s for s in said)


def test_a_restarted_broker_that_does_not_answer_yet_is_not_taken_for_a_primary() -> None:
    """After its restart a former primary joins as a backup; while it starts (recovering its journal) it is
    silent, and killing it then would restart it for ever."""
    mgr, (b1, b2, _), clock, _ = cluster()
    b1.proc.kill()  # type: ignore[union-attr]
    mgr.step()
    b2.answer = status("b2", "primary", "active")
    mgr.step()  # restarts b1
    assert b1.starts == 1
    b1.answer = None
    b2.answer = None  # now the new primary goes silent too
    b2.proc.kill()  # type: ignore[union-attr]
    clock.now = 200.0
    mgr.step()
    assert b1.alive and mgr.promoted == ["b2", "b3"]  # type: ignore[attr-defined]


def test_of_two_primaries_the_older_epoch_is_demoted() -> None:
    mgr, (b1, b2, _), _, said = cluster()
    b2.answer = status("b2", "primary", "active", epoch=2)  # promoted by hand beside b1
    mgr.step()
    assert mgr.requests == [("DEMOTE", "b1")]  # type: ignore[attr-defined]
    assert said[-1] == "two primaries: demoting b1 (epoch 1); b2 has epoch 2"
    b1.answer = status("b1", "primary", "active", epoch=2)  # the same epoch: nobody to prefer, nobody demoted
    mgr.step()
    assert mgr.requests == [("DEMOTE", "b1")] and mgr.promoted == []  # type: ignore[attr-defined]


def test_a_broker_that_refuses_to_start_is_started_again_every_30_s_and_says_why(tmp_path: Path) -> None:
    """Exit code 2 (a bad flag, a damaged journal) will come again: not a restart every turn, but one every 30 s,
    with the broker's own last line; a broker that crashed (SIGKILL) is restarted at once."""
    mgr, (_, b2, b3), clock, said = cluster()
    b3.data_dir = tmp_path
    why = "ha-broker: journal: /d/journal/00000002.jnl: Is a directory"
    (tmp_path / "broker.log").write_text(f"earlier output\n{why}\n")
    b3.proc.returncode = 2  # type: ignore[union-attr]
    mgr.step()
    refused = f"b3 refused to start (exit code 2: {why}): starting it again every 30 s until that is mended"
    assert b3.starts == 0 and said[-1] == refused
    clock.now += 29.0
    mgr.step()
    assert b3.starts == 0 and said.count(refused) == 1
    clock.now += 1.0
    mgr.step()
    assert b3.starts == 1 and said[-1] == "b3 is down: restarting it as a backup"
    b3.proc.returncode = 2  # type: ignore[union-attr]  # refused again
    mgr.step()
    assert b3.starts == 1 and said.count(refused) == 2
    b2.proc.kill()  # type: ignore[union-attr]  # a crash: no waiting
    mgr.step()
    assert b2.starts == 1


def _journal_with_list(data_dir: Path, view: ReadyView) -> None:
    """A broker's journal whose last HA standing holds member list `view` (what the primary journals on a drop)."""
    (data_dir / "journal").mkdir(parents=True)
    state = {"epoch": view.epoch, "role": "primary", "state": "active", "ready_epoch": view.epoch,
             "view": view.to_json()}
    data = R.header(1) + R.document(R.STATE, state)
    (data_dir / "journal" / "00000001.jnl").write_bytes(data + R.mark(len(data), 0))  # a write ends in its MARK


def ready(name: str, seq: int, position: int = 10) -> dict[str, Any]:
    return {**status(name, "backup", "ready", position),
            "ready_view": ReadyView(1, seq, "b1", frozenset({"b2", "b3"} if seq < 6 else {"b2"})).to_json()}


def test_a_ready_backup_its_primary_dropped_is_not_promoted_while_the_journals_of_the_newer_list_are_down(
        tmp_path: Path) -> None:
    """b1 (primary) dropped b3 in list 6 (b3 stays `ready` with list 5), confirmed messages with b2, then b1 and b2
    died together: b3 must not be promoted (it lacks those messages) though it is the only one ready; once b1 and
    b2 are back (joining) the restart rule picks one of them. With only b1 dead, b2 (list 6) is promoted at once."""
    mgr, (b1, b2, b3), _, said = cluster()
    for m in (b1, b2):
        m.data_dir = tmp_path / m.name
        _journal_with_list(m.data_dir, ReadyView(1, 6, "b1", frozenset({"b2"})))
    b2.answer, b3.answer = ready("b2", 6), ready("b3", 5, position=30)
    b1.proc.kill()  # type: ignore[union-attr]
    mgr.step()
    assert mgr.promoted == ["b2"]  # type: ignore[attr-defined]

    mgr, (b1, b2, b3), _, said = cluster()
    for m in (b1, b2):
        m.data_dir = tmp_path / m.name
    b2.answer, b3.answer = None, ready("b3", 5, position=30)
    b1.proc.kill()  # type: ignore[union-attr]
    b2.proc.kill()  # type: ignore[union-attr]
    mgr.step()
    assert mgr.promoted == [] and b1.starts == b2.starts == 1  # type: ignore[attr-defined]
    assert ("b3 is ready but not promoted: its primary dropped it (member list 6 of epoch 1, primary b1, does not "
            "name it): waiting for the brokers that list names") in said
    joining = {"role": "backup", "state": "joining", "epoch": 1, "ready_epoch": 1,
               "ready_view": ReadyView(1, 6, "b1", frozenset({"b2"})).to_json()}
    b1.answer = {**joining, "name": "b1", "position": 40}
    b2.answer = {**joining, "name": "b2", "position": 40}
    mgr.step()
    assert mgr.promoted == ["b1"]  # type: ignore[attr-defined]
