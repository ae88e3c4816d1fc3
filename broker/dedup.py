"""Duplicate detection: a window of recently seen AMQP `message-id`s per queue (pure; the clock is passed in).

A queue declared with `duplicate-window` (a count) and/or `duplicate-window-seconds` keeps the ids of the messages
it took, oldest first. A transfer whose id is in the window is accepted and dropped (a publisher resending after a
failover does not create a duplicate); one without an id is never checked. Only a message the queue actually took
enters the window, and a dropped duplicate does not refresh it: the window is the last `count` ids taken within the
last `seconds`, so any two brokers that add the same ids in the same order (with the same times) hold the same window.

Ids are kept as `key(message_id)`: bytes tagged with the AMQP type (a string `"7"` and the ulong 7 are different
ids). The memory cost per id is measured in docs/broker.md (`tests/unit/test_dedup.py` keeps it honest).

    >>> w = DuplicateWindow(count=2)
    >>> w.add(key("a"), 0.0), w.add(key("b"), 1.0), w.add(key("c"), 2.0)
    (True, True, True)
    >>> w.seen(key("a"), 3.0), w.seen(key("c"), 3.0)
    (False, True)
"""

from __future__ import annotations

import uuid
from collections import deque
from collections.abc import Iterable

__all__ = ["DuplicateWindow", "key"]

_KEY_MAX = 65535  # bytes of an encoded id (AMQP allows longer strings; nobody uses them as ids)


def key(message_id: object) -> bytes | None:
    """A message-id as window key (None: no id, or a type AMQP does not allow for ids)."""
    if message_id is None:
        return None
    if isinstance(message_id, str):
        k = b"S" + message_id.encode("utf-8", "surrogatepass")
    elif isinstance(message_id, bool):
        return None
    elif isinstance(message_id, int):
        if message_id < 0:
            return None
        k = b"L" + message_id.to_bytes((message_id.bit_length() + 7) // 8 or 1, "big")
    elif isinstance(message_id, uuid.UUID):
        k = b"U" + message_id.bytes
    elif isinstance(message_id, bytes | bytearray | memoryview):
        k = b"B" + bytes(message_id)
    else:
        return None
    return k if len(k) <= _KEY_MAX else None


class DuplicateWindow:
    """The ids a queue took recently: at most `count` of them (None: no bound), none older than `seconds`.

    `seen` tells whether an id is in the window now; `add` puts a new one at the back (a no-op for an id already in
    it). Times are whatever clock the caller uses (the broker passes `time.time()`); an id is never given a time
    before the last one's (a clock stepped back, a window taken from another broker's), so that times follow the
    window's order: eviction by age takes from the front, and a journal's recovery sorts by time."""

    __slots__ = ("added", "count", "generation", "ids", "keys", "seconds", "times", "volatile", "volatile_at")

    def __init__(self, count: int | None = None, seconds: float | None = None) -> None:
        if count is None and seconds is None:
            raise ValueError("a duplicate window needs a count, a time, or both")
        if count is not None and count < 1:
            raise ValueError(f"duplicate window count must be >= 1, got {count}")
        if seconds is not None and seconds <= 0:
            raise ValueError(f"duplicate window seconds must be > 0, got {seconds}")
        self.count = count
        self.seconds = seconds
        self.ids: set[bytes] = set()
        self.keys: deque[bytes] = deque()  # oldest first
        self.times: deque[float] = deque()  # the time each of `keys` was added
        self.added = 0  # ids added since the window was made (or last `replace`d): `since` counts from it
        self.generation = 0  # bumped by `replace`: a reader of `since` starts over
        # Ids whose messages are not durable and still queued, with the message's position and the id's time: a
        # journal leaves them out (after a restart their messages are gone, so a resend must be taken) until
        # `settled` says the message at that position went (broker.store)
        self.volatile: dict[bytes, tuple[int, float]] = {}
        self.volatile_at: dict[int, bytes] = {}  # position -> the id of `volatile` its message has

    def __len__(self) -> int:
        return len(self.keys)

    def __contains__(self, k: object) -> bool:
        return k in self.ids

    def expire(self, now: float) -> int:
        """Forget ids older than `seconds`; returns how many."""
        if self.seconds is None:
            return 0
        limit = now - self.seconds
        keys, times, ids = self.keys, self.times, self.ids
        n = 0
        while times and times[0] <= limit:
            times.popleft()
            k = keys.popleft()
            ids.discard(k)
            if self.volatile:
                self._unmark(k)
            n += 1
        return n

    def seen(self, k: bytes, now: float) -> bool:
        """Is `k` in the window at `now`?"""
        if k not in self.ids:
            return False
        if self.seconds is None:
            return True
        self.expire(now)
        return k in self.ids

    def add(self, k: bytes, now: float, volatile_at: int = 0) -> bool:
        """Take `k` at `now` (after `seen` said no; `volatile_at`: the position of its message when that is not
        durable). Returns False if it was in the window already (nothing changes)."""
        self.expire(now)
        ids = self.ids
        if k in ids:
            return False
        times = self.times
        if times and now < times[-1]:
            now = times[-1]  # never before the id taken last: a window's times follow its order (a journal's
            #                 recovery puts ids back in time order), whatever the clock or another broker's did
        ids.add(k)
        self.keys.append(k)
        times.append(now)
        self.added += 1
        if volatile_at:
            self.volatile[k] = (volatile_at, now)
            self.volatile_at[volatile_at] = k
        if self.count is not None and len(ids) > self.count:
            old = self.keys.popleft()
            ids.discard(old)
            self.times.popleft()
            if self.volatile:
                self._unmark(old)
        return True

    def settled(self, position: int) -> tuple[bytes, float] | None:
        """The message at `position` left its queue (consumed, expired, moved): if it was a not durable one whose id
        is in the window, that id is kept from now on like any other, and returned with its time (for a journal to
        write it now)."""
        k = self.volatile_at.pop(position, None)
        if k is None:
            return None
        return k, self.volatile.pop(k)[1]

    def unsettle(self, k: bytes, t: float, position: int) -> None:
        """The not durable message at `position` that `settled` gave `k` and `t` for is back on its queue (a commit
        undone): its id is left out of a journal again (if it is still in the window)."""
        if k in self.ids and k not in self.volatile:
            self.volatile[k] = (position, t)
            self.volatile_at[position] = k

    def _unmark(self, k: bytes) -> None:
        mark = self.volatile.pop(k, None)
        if mark is not None:
            self.volatile_at.pop(mark[0], None)

    def forget(self, k: bytes) -> bool:
        """Take `k` out of the window: its message was not taken after all (its journal write failed and its
        publisher was refused, so that a resend must get in). Returns whether it was in. A reader of `since` whose
        mark is older than `k` may then be given one id it had already: taking an id again changes nothing."""
        if k not in self.ids:
            return False
        self.ids.discard(k)
        if self.volatile:
            self._unmark(k)
        keys = self.keys
        for i in range(len(keys) - 1, -1, -1):  # the newest first: a refused id is one of the last
            if keys[i] == k:
                del keys[i]
                del self.times[i]
                break
        return True

    def items(self) -> list[tuple[bytes, float]]:
        """The window, oldest first."""
        return list(zip(self.keys, self.times, strict=True))

    def since(self, mark: int) -> list[tuple[bytes, float]]:
        """The ids added after `added` was `mark` that are still in the window, oldest first."""
        n = min(self.added - mark, len(self.keys))
        if n <= 0:
            return []
        start = len(self.keys) - n
        return [(self.keys[i], self.times[i]) for i in range(start, len(self.keys))]

    def replace(self, items: Iterable[tuple[bytes, float]], now: float | None = None) -> None:
        """Become the window that taking `items` in order gives (oldest first: another broker's window, or a
        journal's snapshot followed by what was added since). An id that comes again was evicted in between and
        taken again: its later time stands. Then the bounds apply."""
        latest: dict[bytes, float] = {}
        for k, t in items:
            latest.pop(k, None)
            latest[k] = t
        keys = list(latest)
        if self.count is not None and len(keys) > self.count:
            keys = keys[len(keys) - self.count:]
        self.ids = set(keys)
        self.keys = deque(keys)
        self.times = deque(latest[k] for k in keys)
        self.keep_marks(self)  # (another broker's window says nothing of them: its ids count as durable)
        if now is not None:
            self.expire(now)
        self.added = len(self.keys)
        self.generation += 1

    def keep_marks(self, other: DuplicateWindow) -> None:
        """Take `other`'s marks of volatile ids (for the ids in this window): a window that replaced it."""
        self.volatile = {k: m for k, m in other.volatile.items() if k in self.ids}
        self.volatile_at = {m[0]: k for k, m in self.volatile.items()}
