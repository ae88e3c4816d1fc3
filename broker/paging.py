"""`PageIndex`: the messages of a queue that are on disk only (flow to disk), by position (pure: no I/O).

A paged message costs 12 to 20 bytes of memory: its journal location (`segment << 32 | offset`, as in `Entry.seg`)
and its size in parallel `array`s, and its position, cut into sorted blocks of at most `BLOCK` messages, so that an
insertion anywhere moves at most a block (a backup's catch-up arrives newest first) and taking from the front is
cheap. A block whose positions follow each other (what paging out the top of a queue, and parking new messages behind
it, make) keeps them as a `range` (nothing per message); one that gets a gap keeps them in an array (8 bytes each).
Everything else of the message (body, expiry, flags, delivery count) is read back from its journal record.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Iterator

BLOCK = 4096
PAGED_COST = 12  # bytes of memory a paged message costs (location, size), and POSITION_COST more outside a run
POSITION_COST = 8
RUN_BLOCK = 64  # a run of at least this many positions is not broken up by a gap after it: a new block starts
BLOCK_COST = 350  # bytes a block takes besides its messages (its objects, the arrays' headers and slack; measured)
# --max-memory (broker.memory): page out down to LOW_WATER of the bound, read back while below it; the messages in
# memory of queues that can page take at most PAGEABLE_SHARE of the bound (recovery reads bodies up to LOW_WATER of it)
LOW_WATER = 0.8
PAGEABLE_SHARE = 0.5

Paged = tuple[int, int, int]  # (position, location, size)
Positions = array | range  # type: ignore[type-arg]


class _Block:
    __slots__ = ("ls", "ps", "ss")

    def __init__(self, ps: Positions, ls: array[int], ss: array[int]) -> None:
        self.ps = ps  # positions, sorted: a range while they follow each other
        self.ls = ls  # journal locations
        self.ss = ss  # sizes


def _explicit(ps: Positions) -> int:
    return 0 if isinstance(ps, range) else len(ps)


class PageIndex:
    __slots__ = ("_blocks", "_firsts", "bytes", "count", "explicit")

    def __init__(self) -> None:
        self._blocks: list[_Block] = []  # sorted
        self._firsts: list[int] = []  # the first position of each block
        self.count = 0
        self.bytes = 0  # of the paged messages' bodies (on disk)
        self.explicit = 0  # positions kept one by one (blocks with gaps)

    @property
    def memory(self) -> int:
        """Bytes of memory the index takes for its messages (what --max-memory counts)."""
        return self.count * PAGED_COST + self.explicit * POSITION_COST + len(self._blocks) * BLOCK_COST

    def __len__(self) -> int:
        return self.count

    def __bool__(self) -> bool:
        return self.count > 0

    # ----- positions: a range while they follow each other ----------------------------------------------------------
    def _set(self, b: _Block, ps: Positions) -> None:
        self.explicit += _explicit(ps) - _explicit(b.ps)
        b.ps = ps

    def _array(self, b: _Block) -> array[int]:
        """The block's positions as an array it can change anywhere."""
        ps = b.ps
        if isinstance(ps, range):
            self._set(b, array("Q", ps))
        return b.ps  # type: ignore[return-value]

    def _insert(self, b: _Block, j: int, position: int) -> None:
        ps = b.ps
        if isinstance(ps, range):
            if not ps:
                b.ps = range(position, position + 1)
                return
            if j == len(ps) and position == ps.stop:
                b.ps = range(ps.start, position + 1)
                return
            if j == 0 and position == ps.start - 1:
                b.ps = range(position, ps.stop)
                return
        self._array(b).insert(j, position)
        self.explicit += 1

    def _delete(self, b: _Block, a: int, z: int) -> None:
        """Remove the positions at indexes a..z-1 of the block (its locations and sizes too)."""
        ps = b.ps
        if isinstance(ps, range) and (a == 0 or z >= len(ps)):
            b.ps = ps[z:] if a == 0 else ps[:a]
        else:
            del self._array(b)[a:z]
            self.explicit -= z - a
        del b.ls[a:z], b.ss[a:z]

    def first(self) -> int | None:
        return self._blocks[0].ps[0] if self.count else None

    def last(self) -> int | None:
        return self._blocks[-1].ps[-1] if self.count else None

    def add(self, position: int, location: int, size: int) -> None:
        """Add a paged message (ValueError if the position is already here)."""
        blocks = self._blocks
        if not blocks or position > blocks[-1].ps[-1]:
            last = blocks[-1].ps if blocks else None
            if last is None or len(last) >= BLOCK or (
                    isinstance(last, range) and position != last.stop and len(last) >= RUN_BLOCK):
                blocks.append(_Block(range(position, position), array("Q"), array("I")))
                self._firsts.append(position)
            b = blocks[-1]
            self._insert(b, len(b.ps), position)
            b.ls.append(location)
            b.ss.append(size)
        else:
            i = max(bisect_right(self._firsts, position) - 1, 0)
            b = blocks[i]
            j = bisect_left(b.ps, position)
            if j < len(b.ps) and b.ps[j] == position:
                raise ValueError(f"position {position} is already paged")
            self._insert(b, j, position)
            b.ls.insert(j, location)
            b.ss.insert(j, size)
            self._firsts[i] = b.ps[0]
            if len(b.ps) > 2 * BLOCK:
                self._split(i)
        self.count += 1
        self.bytes += size

    def _split(self, i: int) -> None:
        b = self._blocks[i]
        half = len(b.ps) // 2
        right = _Block(b.ps[half:], b.ls[half:], b.ss[half:])
        self.explicit += _explicit(right.ps)
        self._delete(b, half, len(b.ps))
        self._blocks.insert(i + 1, right)
        self._firsts.insert(i + 1, right.ps[0])

    def take_front(self, n: int, max_bytes: int, whole: bool = False) -> list[Paged]:
        """Remove and return the lowest paged messages: up to `n` of them and about `max_bytes` (at least one), or
        with `whole` none beyond `max_bytes` (maybe none)."""
        out: list[Paged] = []
        nbytes = 0
        blocks = self._blocks
        while blocks and len(out) < n and (nbytes < max_bytes or not out):
            b = blocks[0]
            ss = b.ss
            k = 0
            limit = min(len(ss), n - len(out))
            while k < limit and (nbytes < max_bytes or (not out and k == 0)):
                if whole and nbytes + ss[k] > max_bytes:
                    break
                nbytes += ss[k]
                k += 1
            if not k:
                break
            out.extend(zip(b.ps[:k], b.ls[:k], ss[:k], strict=True))
            self._drop(0, 0, k)
        self.count -= len(out)
        self.bytes -= nbytes
        return out

    def _drop(self, i: int, a: int, z: int) -> None:
        """Remove indexes a..z-1 of block i (the block too if that empties it)."""
        b = self._blocks[i]
        self._delete(b, a, z)
        if b.ps:
            self._firsts[i] = b.ps[0]
        else:
            del self._blocks[i], self._firsts[i]

    def remove_range(self, lo: int, hi: int) -> list[Paged]:
        """Remove and return the paged messages with positions lo..hi."""
        out: list[Paged] = []
        i = max(bisect_right(self._firsts, lo) - 1, 0)
        while i < len(self._blocks):
            b = self._blocks[i]
            ps = b.ps
            if ps[0] > hi:
                break
            a, z = bisect_left(ps, lo), bisect_right(ps, hi)
            if a < z:
                out.extend(zip(ps[a:z], b.ls[a:z], b.ss[a:z], strict=True))
                self._drop(i, a, z)
                if not b.ps:
                    continue
            i += 1
        self.count -= len(out)
        self.bytes -= sum(s for _, _, s in out)
        return out

    def _locate(self, position: int) -> tuple[_Block, int] | None:
        if not self.count:
            return None
        i = bisect_right(self._firsts, position) - 1
        if i < 0:
            return None
        b = self._blocks[i]
        j = bisect_left(b.ps, position)
        if j < len(b.ps) and b.ps[j] == position:
            return b, j
        return None

    def find(self, position: int) -> Paged | None:
        at = self._locate(position)
        if at is None:
            return None
        b, j = at
        return position, b.ls[j], b.ss[j]

    def __contains__(self, position: int) -> bool:
        return self._locate(position) is not None

    def relocate(self, position: int, location: int) -> None:
        """The message at `position` was written again elsewhere in the journal (compaction)."""
        at = self._locate(position)
        if at is None:
            raise KeyError(position)
        b, j = at
        b.ls[j] = location

    def items(self) -> Iterator[Paged]:
        for b in self._blocks:
            yield from zip(b.ps, b.ls, b.ss, strict=True)

    def positions_after(self, after: int) -> Iterator[int]:
        i = max(bisect_right(self._firsts, after) - 1, 0)
        for b in self._blocks[i:]:
            ps = b.ps
            yield from ps[bisect_right(ps, after):]

    def ranges(self) -> list[tuple[int, int]]:
        """The paged positions as sorted, disjoint (lo, hi) ranges (a block of consecutive positions is one)."""
        out: list[tuple[int, int]] = []
        for b in self._blocks:
            ps = b.ps
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
