"""``PositionSet``: a set of queue positions (positive ints) stored as sorted, disjoint, non-adjacent ranges.

Every operation costs O(ranges) or O(log ranges), never O(positions): a queue of a million contiguous messages is
one range. The wire form (``to_wire``/``from_wire``) is a list of inclusive ``[lo, hi]`` pairs in ascending order,
which is how a backup announces what it holds and how the primary batches dequeue events.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Iterator

Range = tuple[int, int]


class PositionSet:
    """A mutable set of positive ints. Iteration is ascending; ``ranges()`` gives inclusive (lo, hi) pairs."""

    __slots__ = ("_count", "_hi", "_lo")

    def __init__(self, positions: Iterable[int] = ()) -> None:
        self._lo: list[int] = []
        self._hi: list[int] = []
        self._count = 0
        if isinstance(positions, PositionSet):
            self._lo, self._hi, self._count = list(positions._lo), list(positions._hi), positions._count
        else:
            for p in positions:
                self.add(p)

    # -- construction ---------------------------------------------------------------------------------------------

    @classmethod
    def from_ranges(cls, ranges: Iterable[Range]) -> PositionSet:
        """Build from (lo, hi) pairs in any order, overlapping or not."""
        s = cls()
        for lo, hi in ranges:
            s.add_range(lo, hi)
        return s

    @classmethod
    def from_wire(cls, data: object) -> PositionSet:
        """Parse the wire form: a list of ``[lo, hi]`` int pairs, ascending and disjoint (adjacent is fine).

        Raises ``ValueError`` naming the first bad item. This validates peer input, so it never trusts the shape.
        """
        if not isinstance(data, list | tuple):
            raise ValueError(f"position set must be a list of [lo, hi] pairs, got {type(data).__name__}")
        s = cls()
        prev_hi = 0
        for i, item in enumerate(data):
            if not isinstance(item, list | tuple) or len(item) != 2:
                raise ValueError(f"position set item {i} must be a [lo, hi] pair, got {item!r}")
            lo, hi = item
            if not _is_int(lo) or not _is_int(hi):
                raise ValueError(f"position set item {i} must hold two ints, got {item!r}")
            if lo < 1:
                raise ValueError(f"position set item {i} {item!r}: positions start at 1")
            if lo > hi:
                raise ValueError(f"position set item {i} {item!r}: lo > hi")
            if lo <= prev_hi:
                raise ValueError(
                    f"position set item {i} {item!r} overlaps or precedes the previous range ending at {prev_hi}: "
                    "ranges must be ascending and disjoint"
                )
            prev_hi = hi
            s._append_range(lo, hi)
        return s

    def to_wire(self) -> list[list[int]]:
        return [[lo, hi] for lo, hi in zip(self._lo, self._hi, strict=True)]

    def copy(self) -> PositionSet:
        return PositionSet(self)

    # -- mutation ---------------------------------------------------------------------------------------------------

    def add(self, position: int) -> None:
        hi = self._hi
        if hi and type(position) is int and position == hi[-1] + 1:  # fast path: the next position in order
            hi[-1] = position
            self._count += 1
            return
        self.add_range(position, position)

    def add_range(self, lo: int, hi: int) -> None:
        """Add every position in [lo, hi] (inclusive). An empty range (lo > hi) is an error."""
        _check_range(lo, hi)
        if not self._lo or lo > self._hi[-1] + 1:  # fast path: append at the end (live enqueues)
            self._append_range(lo, hi)
            return
        i = bisect_left(self._hi, lo - 1)  # first range that touches or follows lo
        j = bisect_right(self._lo, hi + 1)  # ranges before j start at or before hi + 1
        if i < j:
            lo = min(lo, self._lo[i])
            hi = max(hi, self._hi[j - 1])
            removed = sum(self._hi[k] - self._lo[k] + 1 for k in range(i, j))
        else:
            removed = 0
        self._lo[i:j] = [lo]
        self._hi[i:j] = [hi]
        self._count += hi - lo + 1 - removed

    def discard(self, position: int) -> None:
        self.discard_range(position, position)

    def discard_range(self, lo: int, hi: int) -> None:
        """Remove every position in [lo, hi] that is present; absent ones are ignored."""
        _check_range(lo, hi)
        i = bisect_left(self._hi, lo)  # first range ending at or after lo
        j = bisect_right(self._lo, hi)  # ranges before j start at or before hi
        if i >= j:
            return
        new_lo: list[int] = []
        new_hi: list[int] = []
        if self._lo[i] < lo:
            new_lo.append(self._lo[i])
            new_hi.append(lo - 1)
        if self._hi[j - 1] > hi:
            new_lo.append(hi + 1)
            new_hi.append(self._hi[j - 1])
        removed = sum(self._hi[k] - self._lo[k] + 1 for k in range(i, j))
        kept = sum(h - lo_ + 1 for lo_, h in zip(new_lo, new_hi, strict=True))
        self._lo[i:j] = new_lo
        self._hi[i:j] = new_hi
        self._count -= removed - kept

    def add_sequence(self, positions: Iterable[int]) -> None:
        """Add positions that mostly come in runs (ascending or descending, as replication batches carry them):
        one range operation per run instead of one per position."""
        lo = hi = prev = 0
        step = 0
        for p in positions:
            if prev and step == 0 and p in (prev + 1, prev - 1):
                step = p - prev
            if prev and p == prev + step and step:
                lo, hi = min(lo, p), max(hi, p)
            else:
                if prev:
                    self.add_range(lo, hi)
                lo = hi = p
                step = 0
            prev = p
        if prev:
            self.add_range(lo, hi)

    def update(self, other: Iterable[int]) -> None:
        for lo, hi in _ranges_of(other):
            self.add_range(lo, hi)

    def difference_update(self, other: Iterable[int]) -> None:
        for lo, hi in _ranges_of(other):
            self.discard_range(lo, hi)

    def clear(self) -> None:
        self._lo, self._hi, self._count = [], [], 0

    def pop_max(self) -> int:
        """Remove and return the highest position (KeyError if empty)."""
        if not self._lo:
            raise KeyError("pop_max from an empty PositionSet")
        top = self._hi[-1]
        if self._lo[-1] == top:
            self._lo.pop()
            self._hi.pop()
        else:
            self._hi[-1] = top - 1
        self._count -= 1
        return top

    # -- queries ----------------------------------------------------------------------------------------------------

    def __contains__(self, position: object) -> bool:
        if not _is_int(position):
            return False
        assert isinstance(position, int)
        i = bisect_right(self._lo, position) - 1
        return i >= 0 and self._hi[i] >= position

    def contains(self, position: int) -> bool:
        return position in self

    def contains_range(self, lo: int, hi: int) -> bool:
        """True if every position in [lo, hi] is present."""
        _check_range(lo, hi)
        i = bisect_right(self._lo, lo) - 1
        return i >= 0 and self._hi[i] >= hi

    def __len__(self) -> int:
        return self._count

    def __bool__(self) -> bool:
        return self._count > 0

    def __iter__(self) -> Iterator[int]:
        for lo, hi in zip(self._lo, self._hi, strict=True):
            yield from range(lo, hi + 1)

    def __reversed__(self) -> Iterator[int]:
        for lo, hi in zip(reversed(self._lo), reversed(self._hi), strict=True):
            yield from range(hi, lo - 1, -1)

    def ranges(self, *, descending: bool = False) -> list[Range]:
        pairs = list(zip(self._lo, self._hi, strict=True))
        if descending:
            pairs.reverse()
        return pairs

    def last_range(self) -> Range:
        """The highest (lo, hi) range (ValueError if empty)."""
        if not self._lo:
            raise ValueError("last_range() of an empty PositionSet")
        return self._lo[-1], self._hi[-1]

    def min(self) -> int:
        if not self._lo:
            raise ValueError("min() of an empty PositionSet")
        return self._lo[0]

    def max(self) -> int:
        if not self._lo:
            raise ValueError("max() of an empty PositionSet")
        return self._hi[-1]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, PositionSet):
            return self._lo == other._lo and self._hi == other._hi
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable

    def __repr__(self) -> str:
        body = ", ".join(f"{lo}" if lo == hi else f"{lo}-{hi}" for lo, hi in self.ranges())
        return f"PositionSet({{{body}}})"

    # -- set algebra (new sets; O(ranges of both)) -------------------------------------------------------------------

    def union(self, other: PositionSet) -> PositionSet:
        merged = sorted(self.ranges() + other.ranges())
        out = PositionSet()
        for lo, hi in merged:
            if out._lo and lo <= out._hi[-1] + 1:
                if hi > out._hi[-1]:
                    out._count += hi - out._hi[-1]
                    out._hi[-1] = hi
            else:
                out._append_range(lo, hi)
        return out

    def intersection(self, other: PositionSet) -> PositionSet:
        out = PositionSet()
        a, b = self.ranges(), other.ranges()
        i = j = 0
        while i < len(a) and j < len(b):
            lo = max(a[i][0], b[j][0])
            hi = min(a[i][1], b[j][1])
            if lo <= hi:
                out._append_range(lo, hi)
            if a[i][1] < b[j][1]:
                i += 1
            else:
                j += 1
        return out

    def difference(self, other: PositionSet) -> PositionSet:
        out = PositionSet()
        b = other.ranges()
        j = 0
        for lo, hi in self.ranges():
            cur = lo
            while j < len(b) and b[j][1] < cur:
                j += 1
            k = j
            while k < len(b) and b[k][0] <= hi:
                if b[k][0] > cur:
                    out._append_range(cur, b[k][0] - 1)
                cur = max(cur, b[k][1] + 1)
                if cur > hi:
                    break
                k += 1
            if cur <= hi:
                out._append_range(cur, hi)
        return out

    def issubset(self, other: PositionSet) -> bool:
        return not self.difference(other)

    __or__ = union
    __and__ = intersection
    __sub__ = difference

    # -- internals --------------------------------------------------------------------------------------------------

    def _append_range(self, lo: int, hi: int) -> None:
        """Append [lo, hi] after the last range (caller guarantees lo > max); merges if adjacent."""
        if self._hi and lo == self._hi[-1] + 1:
            self._hi[-1] = hi
        else:
            self._lo.append(lo)
            self._hi.append(hi)
        self._count += hi - lo + 1


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_range(lo: int, hi: int) -> None:
    if not _is_int(lo) or not _is_int(hi):
        raise TypeError(f"positions must be ints, got {lo!r}, {hi!r}")
    if lo < 1:
        raise ValueError(f"positions start at 1, got {lo}")
    if lo > hi:
        raise ValueError(f"empty range [{lo}, {hi}]")


def _ranges_of(positions: Iterable[int]) -> list[Range]:
    if isinstance(positions, PositionSet):
        return positions.ranges()
    return PositionSet(positions).ranges()


def valid_positions(positions: Iterable[object]) -> tuple[PositionSet, int]:
    """Positions from peer input: the ints >= 1 as a set, and how many items were not (bools, 0, junk)."""
    if isinstance(positions, PositionSet):
        return positions, 0
    good = PositionSet()
    bad = 0
    for p in positions:
        if isinstance(p, int) and not isinstance(p, bool) and p >= 1:
            good.add(p)
        else:
            bad += 1
    return good, bad


def as_position_set(positions: Iterable[int]) -> PositionSet:
    """Return ``positions`` if it already is a PositionSet, else a new one built from it."""
    return positions if isinstance(positions, PositionSet) else PositionSet(positions)
