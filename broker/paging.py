"""`PageIndex`: the messages of a queue that are on disk only (flow to disk), by position (pure: no I/O).

A paged message costs 20 bytes of memory: its position, its journal location (`segment << 32 | offset`, as in
`Entry.seg`) and its size, in three parallel `array`s, cut into sorted blocks of at most `BLOCK` messages, so that
an insertion anywhere moves at most a block (a backup's catch-up arrives newest first) and taking from the front
is cheap. Everything else of the message (body, expiry, flags, delivery count) is read back from its journal record.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Iterator

BLOCK = 4096
PAGED_COST = 20  # bytes of memory a paged message costs (positions, locations, sizes)
# --max-memory (broker.memory): page out down to LOW_WATER of the bound, read back while below it; the messages in
# memory of queues that can page take at most PAGEABLE_SHARE of the bound (recovery reads bodies up to LOW_WATER of it)
LOW_WATER = 0.8
PAGEABLE_SHARE = 0.5

Paged = tuple[int, int, int]  # (position, location, size)


def _new() -> tuple[array[int], array[int], array[int]]:
    return array("Q"), array("Q"), array("I")


class PageIndex:
    __slots__ = ("_blocks", "_firsts", "bytes", "count")

    def __init__(self) -> None:
        self._blocks: list[tuple[array[int], array[int], array[int]]] = []  # (positions, locations, sizes), sorted
        self._firsts: list[int] = []  # the first position of each block
        self.count = 0
        self.bytes = 0  # of the paged messages' bodies (on disk)

    def __len__(self) -> int:
        return self.count

    def __bool__(self) -> bool:
        return self.count > 0

    def first(self) -> int | None:
        return self._blocks[0][0][0] if self.count else None

    def last(self) -> int | None:
        return self._blocks[-1][0][-1] if self.count else None

    def add(self, position: int, location: int, size: int) -> None:
        """Add a paged message (ValueError if the position is already here)."""
        blocks = self._blocks
        if not blocks or position > blocks[-1][0][-1]:
            if not blocks or len(blocks[-1][0]) >= BLOCK:
                blocks.append(_new())
                self._firsts.append(position)
            ps, ls, ss = blocks[-1]
            ps.append(position)
            ls.append(location)
            ss.append(size)
        else:
            i = max(bisect_right(self._firsts, position) - 1, 0)
            ps, ls, ss = blocks[i]
            j = bisect_left(ps, position)
            if j < len(ps) and ps[j] == position:
                raise ValueError(f"position {position} is already paged")
            ps.insert(j, position)
            ls.insert(j, location)
            ss.insert(j, size)
            self._firsts[i] = ps[0]
            if len(ps) > 2 * BLOCK:
                self._split(i)
        self.count += 1
        self.bytes += size

    def _split(self, i: int) -> None:
        ps, ls, ss = self._blocks[i]
        half = len(ps) // 2
        right = (ps[half:], ls[half:], ss[half:])
        del ps[half:], ls[half:], ss[half:]
        self._blocks.insert(i + 1, right)
        self._firsts.insert(i + 1, right[0][0])

    def take_front(self, n: int, max_bytes: int) -> list[Paged]:
        """Remove and return the lowest paged messages: up to `n` of them and about `max_bytes` (at least one)."""
        out: list[Paged] = []
        nbytes = 0
        blocks = self._blocks
        while blocks and len(out) < n and (nbytes < max_bytes or not out):
            ps, ls, ss = blocks[0]
            k = 0
            limit = min(len(ps), n - len(out))
            while k < limit and (nbytes < max_bytes or (not out and k == 0)):
                nbytes += ss[k]
                k += 1
            out.extend(zip(ps[:k], ls[:k], ss[:k], strict=True))
            self._drop_front(0, k)
        self.count -= len(out)
        self.bytes -= nbytes
        return out

    def _drop_front(self, i: int, k: int) -> None:
        ps, ls, ss = self._blocks[i]
        del ps[:k], ls[:k], ss[:k]
        if ps:
            self._firsts[i] = ps[0]
        else:
            del self._blocks[i], self._firsts[i]

    def remove_range(self, lo: int, hi: int) -> list[Paged]:
        """Remove and return the paged messages with positions lo..hi."""
        out: list[Paged] = []
        i = max(bisect_right(self._firsts, lo) - 1, 0)
        while i < len(self._blocks):
            ps, ls, ss = self._blocks[i]
            if ps[0] > hi:
                break
            a, b = bisect_left(ps, lo), bisect_right(ps, hi)
            if a < b:
                out.extend(zip(ps[a:b], ls[a:b], ss[a:b], strict=True))
                del ps[a:b], ls[a:b], ss[a:b]
                if not ps:
                    del self._blocks[i], self._firsts[i]
                    continue
                self._firsts[i] = ps[0]
            i += 1
        self.count -= len(out)
        self.bytes -= sum(s for _, _, s in out)
        return out

    def find(self, position: int) -> Paged | None:
        if not self.count:
            return None
        i = bisect_right(self._firsts, position) - 1
        if i < 0:
            return None
        ps, ls, ss = self._blocks[i]
        j = bisect_left(ps, position)
        if j < len(ps) and ps[j] == position:
            return position, ls[j], ss[j]
        return None

    def __contains__(self, position: int) -> bool:
        return self.find(position) is not None

    def relocate(self, position: int, location: int) -> None:
        """The message at `position` was written again elsewhere in the journal (compaction)."""
        i = bisect_right(self._firsts, position) - 1
        if i < 0:
            raise KeyError(position)
        ps, ls, _ = self._blocks[i]
        j = bisect_left(ps, position)
        if j >= len(ps) or ps[j] != position:
            raise KeyError(position)
        ls[j] = location

    def items(self) -> Iterator[Paged]:
        for ps, ls, ss in self._blocks:
            yield from zip(ps, ls, ss, strict=True)

    def positions_after(self, after: int) -> Iterator[int]:
        i = max(bisect_right(self._firsts, after) - 1, 0)
        for ps, _, _ in self._blocks[i:]:
            yield from ps[bisect_right(ps, after):]

    def ranges(self) -> list[tuple[int, int]]:
        """The paged positions as sorted, disjoint (lo, hi) ranges (a block of consecutive positions is one)."""
        out: list[tuple[int, int]] = []
        for ps, _, _ in self._blocks:
            if ps[-1] - ps[0] == len(ps) - 1:
                pieces = [(ps[0], ps[-1])]
            else:
                pieces = []
                start = prev = ps[0]
                for p in ps[1:]:
                    if p != prev + 1:
                        pieces.append((start, prev))
                        start = p
                    prev = p
                pieces.append((start, prev))
            for lo, hi in pieces:
                if out and out[-1][1] + 1 == lo:
                    out[-1] = (out[-1][0], hi)
                else:
                    out.append((lo, hi))
        return out
