"""The OCF agent's standard-library copy of the restart rule (resource_agents/agent_core.py) decides as
ha/core/restart.py does, and reads a broker's standing from its journal without the broker."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import broker.store.records as R
import broker.store.tools as T
from broker.store.store import read_journal
from ha.core import restart as rule

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "resource_agents"))

import agent_core as core

NAMES = ["b1", "b2", "b3", "node:4", "b 5"]
names = st.sampled_from(NAMES)
views = st.builds(
    lambda e, s, p, r: (e, s, p, frozenset(r)),
    st.integers(0, 4),
    st.integers(0, 4),
    names,
    st.sets(names, max_size=3),
)
standings = st.builds(
    lambda n, e, pos, r, v: (n, e, pos, r, v),
    names,
    st.integers(0, 4),
    st.integers(0, 30),
    st.integers(0, 4),
    st.none() | views,
)


def ours(t: tuple) -> rule.Standing:  # type: ignore[type-arg]
    n, e, pos, r, v = t
    return rule.Standing(n, e, pos, r, None if v is None else rule.ReadyView(*v))


def agents(t: tuple) -> core.Standing:  # type: ignore[type-arg]
    n, e, pos, r, v = t
    return core.Standing(n, e, pos, r, None if v is None else core.ReadyView(*v))


def same(a: rule.RestartDecision, b: core.RestartDecision) -> None:
    assert (a.action.value, a.reason.value, a.winner, a.epoch, a.eligible, a.missing) == (
        b.action.value, b.reason.value, b.winner, b.epoch, b.eligible, b.missing)
    assert a.describe() == b.describe()


@settings(max_examples=500, deadline=None)
@given(st.lists(standings, max_size=5, unique_by=lambda t: t[0]), st.integers(1, 5), st.booleans())
def test_the_agents_copy_decides_as_the_rule(items: list[tuple], expected: int, waited_out: bool) -> None:  # type: ignore[type-arg]
    a = rule.decide_restart([ours(t) for t in items], expected, waited_out)
    b = core.decide_restart([agents(t) for t in items], expected, waited_out)
    same(a, b)
    for t in items:
        s = ours(t)
        assert rule.may_restart_as_newest(s.name, s.ready_epoch, s.view) == core.may_restart_as_newest(
            s.name, s.ready_epoch, agents(t).view)


@given(st.lists(views, max_size=5), names, st.integers(0, 4), st.integers(0, 4))
def test_the_agents_copy_finds_a_dropped_backup_as_the_rule(items: list[tuple], name: str, epoch: int,  # type: ignore[type-arg]
                                                            seq: int) -> None:
    a = rule.dropped_by(name, (epoch, seq), [rule.ReadyView(*v) for v in items])
    b = core.dropped_by(name, (epoch, seq), [core.ReadyView(*v) for v in items])
    assert (a is None and b is None) or (a is not None and b is not None and a.key == b.key)
    if a is not None:
        assert a.key > (epoch, seq) and name not in a.eligible


@given(standings)
def test_a_published_standing_reads_back_as_it_was(t: tuple) -> None:  # type: ignore[type-arg]
    s = agents(t)
    assert core.Standing.decode(s.encode()) == s
    assert ":" not in s.encode().split(":", 1)[0]


def test_unreadable_published_standings_are_dropped() -> None:
    good = core.Standing("b1", 3, 40, 3, core.ReadyView(3, 2, "b1", frozenset({"b2"})))
    got = core.decode_standings({"n1": good.encode(), "n2": "b2:x:1:1", "n3": "b3:1:2", "n4": ""})
    assert got == {"n1": good}


def segment(number: int, *records: bytes) -> bytes:
    return R.header(number) + b"".join(records)


def marked(data: bytes, durable: int = 0) -> bytes:
    """`data` ending in a MARK, as every write of the journal ends (what follows the last one is a torn write)."""
    return data + R.mark(len(data), durable)


def test_read_standing_reads_what_the_broker_journals(tmp_path: Path) -> None:
    journal = tmp_path / "journal"
    journal.mkdir()
    (tmp_path / "epoch").write_text("4\n")
    v = {"epoch": 3, "seq": 6, "primary": "b1", "ready": ["b2"]}
    (journal / "00000001.jnl").write_bytes(marked(segment(
        1,
        R.queue(1, "q", "u1", {}, 1),
        R.queue(2, "local", "u2", {"qpid.replicate": "none"}, 1),
        R.enqueue(1, 1, 2, 1, 0, None, b"m1"),
        R.enqueue(1, 2, 2, 1, 0, None, b"m2"),
        R.enqueue(2, 9, 2, 1, 0, None, b"not replicated"),
        R.document(R.STATE, {"epoch": 3, "role": "backup", "state": "ready", "ready_epoch": 3, "view": v}),
    )))
    # a newer segment starts with a checkpoint (queue 1 with its next position), then more messages, a torn tail
    torn = R.enqueue(1, 8, 2, 1, 0, None, b"torn")[:-2]
    whole = marked(segment(2, R.queue(1, "q", "u1", {}, 3), R.enqueue(1, 3, 2, 1, 0, None, b"m3")))
    (journal / "00000002.jnl").write_bytes(whole + torn)
    s = core.read_standing(str(tmp_path), "b2")
    assert s == core.Standing("b2", 4, 3, 3, core.ReadyView(3, 6, "b1", frozenset({"b2"})))
    # a write whose MARK never reached the disk counts for nothing, its intact records neither
    (journal / "00000002.jnl").write_bytes(whole + R.enqueue(1, 4, 2, 1, 0, None, b"m4") + torn)
    assert core.read_standing(str(tmp_path), "b2").position == 3
    assert read_journal(journal)[3] == len(whole)  # the broker cuts it there too


def test_read_standing_of_an_empty_data_dir_is_fresh(tmp_path: Path) -> None:
    s = core.read_standing(str(tmp_path), "b1")
    assert s == core.Standing("b1", 0, 0) and s.fresh


def test_read_standing_refuses_a_newer_journal_format(tmp_path: Path) -> None:
    (tmp_path / "journal").mkdir()
    (tmp_path / "journal" / "00000001.jnl").write_bytes(R.HEADER.pack(R.MAGIC, R.FORMAT + 1, 1))
    try:
        core.read_standing(str(tmp_path), "b1")
    except core.JournalUnreadable as e:
        assert "newer" in str(e)
    else:
        raise AssertionError("a newer format was read")


def test_read_standing_refuses_a_journal_directory_it_cannot_list(tmp_path: Path) -> None:
    """Not an empty journal (a fresh standing would let an older store be promoted over this one): nothing."""
    (tmp_path / "journal").write_text("not a directory")  # listing fails (as a permission or I/O error would)
    with pytest.raises(core.JournalUnreadable, match="journal"):
        core.read_standing(str(tmp_path), "b1")


def test_read_standing_tells_damage_from_a_torn_tail_as_the_broker_does(tmp_path: Path) -> None:
    """A bad record that a later commit's MARK says was on disk is damage: the broker will not start, and the
    agent publishes no standing (it published the one from before the damage, which could let an older store
    win). A bad record at the end with nothing on disk after it is a torn tail: read up to it, as before."""
    journal = tmp_path / "journal"
    journal.mkdir()
    head = marked(segment(1, R.queue(1, "q", "u1", {}, 1), R.enqueue(1, 1, 2, 1, 0, None, b"m1")))
    bad_at = len(head)
    damaged = bytearray(R.enqueue(1, 2, 2, 1, 0, None, b"m2"))
    damaged[-1] ^= 0xFF
    body = head + bytes(damaged) + R.enqueue(1, 3, 2, 1, 0, None, b"m3")
    (journal / "00000001.jnl").write_bytes(body + R.mark(len(body), len(body)))  # all of it was on disk
    with pytest.raises(core.JournalUnreadable, match="damaged"):
        core.read_standing(str(tmp_path), "b1")
    assert T.inspect(journal).verdict is T.Verdict.DAMAGED  # the broker's tools agree

    (journal / "00000001.jnl").write_bytes(body + R.mark(len(body), bad_at))  # the bad one was not on disk yet
    assert core.read_standing(str(tmp_path), "b1").position == 1
    assert T.inspect(journal).verdict is T.Verdict.TORN

    (journal / "00000002.jnl").write_bytes(segment(2, R.queue(1, "q", "u1", {}, 2)))  # torn, but not the last
    with pytest.raises(core.JournalUnreadable, match="damaged"):
        core.read_standing(str(tmp_path), "b1")
    assert T.inspect(journal).verdict is T.Verdict.DAMAGED


def test_the_agents_mark_record_is_the_brokers() -> None:
    assert (core._JMARK_MAGIC, core._JMARK.size, core._JMARK_SIZE, core._MARK) == (
        R.MARK_MAGIC, R._MARK.size, R.MARK_SIZE, R.MARK)


def test_read_standing_goes_back_to_the_newest_whole_checkpoint(tmp_path: Path) -> None:
    """Two starts in a row killed between a new segment's header and its checkpoint leave two segments without
    one: the standing is the one the broker recovers (it read the last two only, and published a fresh one)."""
    journal = tmp_path / "journal"
    journal.mkdir()
    v = {"epoch": 3, "seq": 6, "primary": "b1", "ready": ["b2"]}
    (journal / "00000001.jnl").write_bytes(marked(segment(
        1, R.document(R.STATE, {"epoch": 3, "role": "primary", "state": "active", "ready_epoch": 3, "view": v}),
        R.queue(1, "q", "u1", {}, 1), R.enqueue(1, 1, 2, 1, 0, None, b"m1"), R.enqueue(1, 2, 2, 1, 0, None, b"m2"))))
    (journal / "00000002.jnl").write_bytes(segment(2))
    (journal / "00000003.jnl").write_bytes(segment(3))
    s = core.read_standing(str(tmp_path), "b1")
    assert s == core.Standing("b1", 3, 2, 3, core.ReadyView(3, 6, "b1", frozenset({"b2"})))
    assert read_journal(journal)[0].state["view"] == v  # what the broker recovers
