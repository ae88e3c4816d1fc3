"""The duplicate window (broker.dedup) against a model: the last `count` ids taken within `seconds`, oldest first;
a dropped duplicate changes nothing; a copy built from `since`/`replace` is the same window; the memory cost per id."""

from __future__ import annotations

import sys
import tracemalloc
import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.dedup import DuplicateWindow, key

Op = tuple[str, int, float]  # (id, time step)


def model(ops: list[tuple[bytes, float]], count: int | None, seconds: float | None, now: float) -> list[bytes]:
    """What should be in the window at `now`: replay taking each id not in the window at its time."""
    window: list[tuple[bytes, float]] = []
    for k, t in ops:
        if seconds is not None:
            window = [(x, tx) for x, tx in window if tx > t - seconds]
        if any(x == k for x, _ in window):
            continue
        window.append((k, t))
        if count is not None and len(window) > count:
            window.pop(0)
    if seconds is not None:
        window = [(x, tx) for x, tx in window if tx > now - seconds]
    return [x for x, _ in window]


ids = st.integers(0, 12).map(lambda i: key(f"id-{i}"))
steps = st.lists(st.tuples(ids, st.floats(0, 3)), max_size=60)
bounds = st.one_of(
    st.tuples(st.integers(1, 8), st.none()),
    st.tuples(st.none(), st.floats(0.5, 10)),
    st.tuples(st.integers(1, 8), st.floats(0.5, 10)),
)


@settings(max_examples=300, deadline=None)
@given(steps=steps, bound=bounds)
def test_the_window_is_the_last_count_ids_taken_within_seconds_in_order(steps: list[tuple[bytes, float]],
                                                                        bound: tuple[int | None, float | None]) -> None:
    count, seconds = bound
    w = DuplicateWindow(count, seconds)
    now = 0.0
    taken: list[tuple[bytes, float]] = []
    for k, dt in steps:
        now += dt
        expected_seen = k in model(taken, count, seconds, now)
        assert w.seen(k, now) == expected_seen
        if not expected_seen:
            assert w.add(k, now)
            taken.append((k, now))
        assert [x for x, _ in w.items()] == model(taken, count, seconds, now) or seconds is not None
        if count is not None:
            assert len(w) <= count
    w.expire(now)
    assert [x for x, _ in w.items()] == model(taken, count, seconds, now)


@settings(max_examples=200, deadline=None)
@given(steps=steps, bound=bounds, cut=st.integers(0, 60))
def test_a_copy_fed_a_snapshot_then_what_was_added_since_is_the_same_window(
        steps: list[tuple[bytes, float]], bound: tuple[int | None, float | None], cut: int) -> None:
    """How a backup follows the primary (the whole window when it attaches, then every id taken after, in order)
    and how the journal does (a snapshot, then what `since` says was added, replayed with `replace`)."""
    count, seconds = bound
    primary = DuplicateWindow(count, seconds)
    backup, replayed = DuplicateWindow(count, seconds), DuplicateWindow(count, seconds)
    now = 0.0
    mark = 0
    snapshot: list[tuple[bytes, float]] = []
    for i, (k, dt) in enumerate(steps):
        now += dt
        if i == cut:
            snapshot = primary.items()
            backup.replace(snapshot, now)
            mark = primary.added
        if not primary.seen(k, now):
            primary.add(k, now)
            if i >= cut:
                backup.add(k, now)
    if cut < len(steps):
        replayed.replace(snapshot + primary.since(mark), now)
        primary.expire(now)
        backup.expire(now)
        assert backup.items() == primary.items()
        assert replayed.items() == primary.items()


def test_a_dropped_duplicate_does_not_refresh_its_id() -> None:
    w = DuplicateWindow(count=2)
    a, b, c = key("a"), key("b"), key("c")
    assert a is not None and b is not None and c is not None
    w.add(a, 0)
    w.add(b, 1)
    assert w.seen(a, 2) and not w.add(a, 2)
    w.add(c, 3)
    assert not w.seen(a, 4) and w.seen(b, 4) and w.seen(c, 4)


def test_ids_of_different_types_are_different_keys() -> None:
    u = uuid.uuid4()
    keys = [key("7"), key(7), key(b"7"), key(u), key(str(u))]
    assert len(set(keys)) == len(keys)
    assert key(None) is None and key(-1) is None and key(1.5) is None and key(True) is None
    assert key("x" * 70000) is None


@pytest.mark.parametrize(("count", "seconds"), [(0, None), (None, 0), (None, None), (-3, 5.0)])
def test_a_window_without_a_valid_bound_is_refused(count: int | None, seconds: float | None) -> None:
    with pytest.raises(ValueError, match="duplicate window"):
        DuplicateWindow(count, seconds)


def test_since_after_a_replace_starts_over() -> None:
    w = DuplicateWindow(count=10)
    for i in range(5):
        w.add(key(i) or b"", float(i))
    mark, gen = w.added, w.generation
    w.replace([(b"Sx", 1.0)])
    assert w.generation != gen and w.items() == [(b"Sx", 1.0)]
    assert w.since(mark) == []  # a reader compares generations first (broker.store does)


def test_memory_per_id_is_what_docs_broker_md_says() -> None:
    """docs/broker.md: about 150 bytes per id for a 36-character string id (a UUID as text), besides the window's
    fixed size; measured here with tracemalloc over 100,000 ids."""
    n = 100_000
    texts = [str(uuid.UUID(int=i)) for i in range(n)]
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    w = DuplicateWindow(count=n)
    for i, t in enumerate(texts):
        w.add(key(t) or b"", float(i))
    used = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    per_id = used / n
    print(f"duplicate window: {per_id:.0f} bytes per 36-character id (python {sys.version_info[:2]})")
    assert 100 < per_id < 200, per_id


def test_a_forgotten_id_is_taken_again_and_a_reader_of_since_misses_nothing() -> None:
    """`forget`: the id of a message that was refused after all (its journal write failed) leaves the window, so
    that the resend gets in; a reader of `since` (the journal, a backup) still gets every id added after its mark
    (at most one it had already: harmless)."""
    w = DuplicateWindow(count=10)
    for i in range(4):
        w.add(key(i) or b"", float(i))
    before, after = w.added - 1, w.added  # a reader that had all but the newest, one that had everything
    assert w.forget(key(3) or b"") and not w.forget(key(3) or b"") and not w.forget(b"never")
    assert (key(3) or b"") not in w and w.items() == [(key(i) or b"", float(i)) for i in range(3)]
    assert w.add(key(3) or b"", 9.0)  # the resend
    assert [k for k, _ in w.since(before)] == [key(2), key(3)]  # key(2): one it had already
    assert w.since(after) == [(key(3) or b"", 9.0)]
    w.forget(key(1) or b"")  # from the middle
    assert [k for k, _ in w.items()] == [key(0), key(2), key(3)] and len(w) == 3


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["add", "add-volatile", "forget", "settled"]), st.integers(1, 6)),
                max_size=40), st.none() | st.integers(1, 4))
def test_volatile_ids_are_ids_of_the_window_and_settle_once(ops: list[tuple[str, int]], count: int | None) -> None:
    """Ids of messages that are not durable are marked, with their message's position (a journal leaves them out),
    for as long as they are in the window; `settled(position)` gives each back once, when its message goes."""
    w = DuplicateWindow(count=count or None, seconds=None if count else 100.0)
    position = 0
    for t, (op, n) in enumerate(ops):
        k = key(f"id-{n}")
        assert k is not None
        if op.startswith("add") and not w.seen(k, float(t)):
            position += 1
            w.add(k, float(t), volatile_at=position if op == "add-volatile" else 0)
        elif op == "forget":
            w.forget(k)
        elif op == "settled" and k in w.volatile:
            at, when = w.volatile[k]
            assert w.settled(at) == (k, when) and w.settled(at) is None and k not in w.volatile
        assert set(w.volatile) <= w.ids
        assert {at: k for k, (at, _) in w.volatile.items()} == w.volatile_at


def test_an_id_put_back_on_its_queue_is_volatile_again_with_its_time() -> None:
    w = DuplicateWindow(count=5)
    w.add(b"Sa", 1.0, volatile_at=1)
    w.add(b"Sb", 2.0)
    assert w.settled(1) == (b"Sa", 1.0) and not w.volatile
    w.unsettle(b"Sa", 1.0, 1)  # the commit that consumed it was undone
    assert w.volatile == {b"Sa": (1, 1.0)} and w.volatile_at == {1: b"Sa"}
    w.forget(b"Sa")
    w.unsettle(b"Sa", 1.0, 1)  # no longer in the window: nothing to mark
    assert not w.volatile and not w.volatile_at


def test_an_id_is_never_given_a_time_before_the_last_ones() -> None:
    """A clock stepped back (or a window taken from another broker whose clock is ahead): the id gets the time of
    the one before it, so that times follow the window's order (a journal's recovery sorts by time)."""
    w = DuplicateWindow(count=5)
    w.replace([(b"Sa", 100.0), (b"Sb", 102.0)])
    w.add(b"Sc", 93.0)
    w.add(b"Sd", 103.0)
    assert w.items() == [(b"Sa", 100.0), (b"Sb", 102.0), (b"Sc", 102.0), (b"Sd", 103.0)]


def test_a_new_window_of_a_queue_keeps_which_ids_are_volatile() -> None:
    """`update_options` with a new duplicate-window replaces the window with the old one's ids: the marks stay."""
    from broker.options import QueueOptions
    from broker.queue import Queue

    q = Queue("q", {"duplicate-window": 10}, QueueOptions.from_arguments({"duplicate-window": 10}))
    assert q.dedup is not None
    q.dedup.add(b"Sa", 1.0, volatile_at=1)
    q.dedup.add(b"Sb", 2.0)
    q.update_options({"duplicate-window": 20}, QueueOptions.from_arguments({"duplicate-window": 20}))
    assert q.dedup.count == 20 and q.dedup.volatile == {b"Sa": (1, 1.0)} and q.dedup.volatile_at == {1: b"Sa"}
    assert len(q.dedup) == 2


def test_a_backup_marks_the_ids_of_replicated_messages_that_are_not_durable() -> None:
    """A backup's window takes each replicated message's id as its primary's did, and its journal leaves out the
    same ids (those of messages that are not durable), so that a whole-cluster restart that promotes it behaves the
    same."""
    from proton import Message

    from broker.options import QueueOptions
    from broker.queue import DURABLE, WINDOWED, Queue
    from ha.replica import QueueReplicator

    q = Queue("q", {"duplicate-window": 10}, QueueOptions.from_arguments({"durable": True, "duplicate-window": 10}))
    assert q.dedup is not None
    for pos, (mid, durable) in enumerate((("a", True), ("b", False)), 1):
        body = bytes(Message(id=mid, body="x", durable=durable).encode())
        flags = WINDOWED | (DURABLE if durable else 0)
        QueueReplicator._apply_flags(q, q.enqueue_replica(pos, body, 4, flags, 0, None), flags, body)
    assert q.dedup.ids == {key("a"), key("b")} and set(q.dedup.volatile) == {key("b")}
    assert q.dedup.volatile_at == {2: key("b")}
