"""`PageIndex` (broker/paging.py) against a plain dict model: any sequence of adds (in order, or anywhere as a
backup's newest-first catch-up does), takes from the front, range removals and relocations keeps the same paged
messages, in order, with the same counts and bytes. Blocks are made tiny so splits and empty blocks happen."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from broker import paging
from broker.paging import PageIndex

positions = st.integers(min_value=1, max_value=400)


class IndexMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.saved_block, paging.BLOCK = paging.BLOCK, 4  # tiny blocks: splits and emptied blocks happen
        self.index = PageIndex()
        self.model: dict[int, tuple[int, int]] = {}

    @rule(pos=positions, size=st.integers(0, 5000))
    def add(self, pos: int, size: int) -> None:
        if pos in self.model:
            with pytest.raises(ValueError, match="already paged"):
                self.index.add(pos, pos * 7, size)
            return
        self.index.add(pos, pos * 7, size)
        self.model[pos] = (pos * 7, size)

    @rule(n=st.integers(1, 20))
    def append_run(self, n: int) -> None:
        """A run of new highest positions, as paging out the tail of a queue adds them."""
        start = max(self.model, default=0) + 1
        for pos in range(start, start + n):
            self.index.add(pos, pos * 7, 100)
            self.model[pos] = (pos * 7, 100)

    @rule(n=st.integers(1, 20))
    def prepend_run(self, n: int) -> None:
        """A run of positions below the lowest, newest first, as a backup's catch-up adds them."""
        low = min(self.model, default=n + 1)
        for pos in range(low - 1, max(low - 1 - n, 0), -1):
            self.index.add(pos, pos * 7, 100)
            self.model[pos] = (pos * 7, 100)

    @rule(n=st.integers(1, 30), max_bytes=st.integers(0, 3000))
    def take_front(self, n: int, max_bytes: int) -> None:
        got = self.index.take_front(n, max_bytes)
        order = sorted(self.model)
        assert [p for p, _, _ in got] == order[: len(got)]
        if self.model:
            assert got, "at least one is taken when any is paged"
            taken_bytes = sum(s for _, _, s in got)
            assert len(got) <= n
            # it stops once max_bytes is reached (the last one may cross it)
            assert taken_bytes - got[-1][2] < max(max_bytes, 1) or len(got) == 1
            assert len(got) == n or len(got) == len(order) or taken_bytes >= max_bytes
        for p, loc, size in got:
            assert self.model.pop(p) == (loc, size)

    @rule(lo=positions, span=st.integers(0, 60))
    def remove_range(self, lo: int, span: int) -> None:
        hi = lo + span
        got = self.index.remove_range(lo, hi)
        want = sorted(p for p in self.model if lo <= p <= hi)
        assert [p for p, _, _ in got] == want
        for p in want:
            del self.model[p]

    @rule(pos=positions)
    def find_and_relocate(self, pos: int) -> None:
        if pos in self.model:
            assert self.index.find(pos) == (pos, *self.model[pos])
            self.index.relocate(pos, pos * 11)
            self.model[pos] = (pos * 11, self.model[pos][1])
        else:
            assert self.index.find(pos) is None and pos not in self.index
            with pytest.raises(KeyError):
                self.index.relocate(pos, 1)

    @rule(after=st.integers(0, 420))
    def positions_after(self, after: int) -> None:
        assert list(self.index.positions_after(after)) == sorted(p for p in self.model if p > after)

    def teardown(self) -> None:
        paging.BLOCK = self.saved_block

    @invariant()
    def same_as_model(self) -> None:
        order = sorted(self.model)
        assert [(p, loc, s) for p, loc, s in self.index.items()] == [(p, *self.model[p]) for p in order]
        assert len(self.index) == len(order) and bool(self.index) == bool(order)
        assert self.index.bytes == sum(s for _, s in self.model.values())
        explicit = sum(len(b.ps) for b in self.index._blocks if not isinstance(b.ps, range))
        assert self.index.explicit == explicit
        assert self.index.memory == (len(order) * paging.PAGED_COST + explicit * paging.POSITION_COST
                                     + len(self.index._blocks) * paging.BLOCK_COST)
        assert self.index.first() == (order[0] if order else None)
        assert self.index.last() == (order[-1] if order else None)
        expanded = [p for lo, hi in self.index.ranges() for p in range(lo, hi + 1)]
        assert expanded == order
        ranges = self.index.ranges()
        assert all(a[1] + 1 < b[0] for a, b in itertools.pairwise(ranges)), "ranges are maximal"


IndexMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=60, deadline=None)
TestPageIndex = IndexMachine.TestCase


@pytest.mark.parametrize("order", ["ascending", "descending", "gaps"])
def test_paged_messages_cost_what_the_index_counts(order: str) -> None:
    """Ascending: new messages parked behind paged ones; descending: paging out the top of a queue, or a backup's
    catch-up (newest first); gaps: every 100th position missing. Runs of positions cost nothing per message."""
    import tracemalloc

    n = 100_000  # enough blocks for the per-message figure; tracemalloc makes each add ~15x slower
    wanted = [p for p in range(1, n + 1) if order != "gaps" or p % 100]
    tracemalloc.start()
    index = PageIndex()
    before = tracemalloc.get_traced_memory()[0]
    for pos in (reversed(wanted) if order == "descending" else wanted):
        index.add(pos, pos << 8, 100)
    used = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert len(index) == len(wanted) and [p for p, _, _ in index.items()] == wanted
    assert index.explicit == 0  # every block a run
    assert index.memory / len(wanted) <= paging.PAGED_COST + (4 if order == "gaps" else 0.5)
    assert abs(used - index.memory) <= 0.1 * used, f"{used / len(wanted):.1f} bytes per paged message, counted " \
                                                   f"{index.memory / len(wanted):.1f}"


def test_positions_that_do_not_follow_each_other_cost_their_own_bytes() -> None:
    index = PageIndex()
    for pos in range(2, 2000, 2):
        index.add(pos, pos, 1)
    assert index.memory == len(index) * (paging.PAGED_COST + paging.POSITION_COST) + paging.BLOCK_COST
    assert index.remove_range(0, 1 << 40) and index.memory == 0 and index.explicit == 0
