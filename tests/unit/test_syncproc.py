"""The journal's sync process (broker.store.syncproc) against a real child process, its loop turned by hand: one
request in flight, the rest merged into the next; errors reported with their errno; a lost process reported once;
no descriptor left open."""

from __future__ import annotations

import errno
import os
import select
import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from broker.store.syncproc import SyncProcess


class HandLoop:
    def __init__(self) -> None:
        self.readers: dict[int, Callable[[int], None]] = {}

    def add_reader(self, fd: int, fn: Callable[[int], None]) -> None:
        self.readers[fd] = fn

    def remove_reader(self, fd: int) -> None:
        self.readers.pop(fd, None)

    def turn(self, timeout: float = 5.0) -> None:
        ready, _, _ = select.select(list(self.readers), [], [], timeout)
        assert ready, "nothing came back from the sync process"
        for fd in ready:
            self.readers[fd](select.EPOLLIN)


class Reports:
    def __init__(self) -> None:
        self.synced: list[int] = []
        self.failed: list[tuple[int, int | None]] = []
        self.lost = 0


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.fixture
def sync(tmp_path: Path) -> Iterator[tuple[SyncProcess, HandLoop, Reports, int]]:
    loop, r = HandLoop(), Reports()
    before = open_fds()
    fd = os.open(tmp_path / "seg", os.O_WRONLY | os.O_CREAT, 0o600)
    p = SyncProcess(loop, r.synced.append, lambda t, e: r.failed.append((t, e.errno)),
                    lambda: setattr(r, "lost", r.lost + 1))
    yield p, loop, r, fd
    p.stop()
    p.join(5)
    os.close(fd)
    assert open_fds() == before


def test_requests_made_while_one_is_in_flight_are_merged_into_the_next(
        sync: tuple[SyncProcess, HandLoop, Reports, int]) -> None:
    p, loop, r, fd = sync
    os.write(fd, b"a")
    p.request(1, [fd])
    os.write(fd, b"b")
    for t in range(2, 1002):  # a slow disk: many commits while one sync runs
        p.request(t, [fd])
    assert p.in_flight == 1 and p.next is not None and p.next[0] == 1001
    assert len(p.next[1]) == 1  # one descriptor per file, not one per request
    loop.turn()
    assert r.synced == [1] and p.in_flight == 1001 and p.next is None  # the merged request went out at once
    loop.turn()
    assert r.synced == [1, 1001] and not p.in_flight and r.failed == [] and r.lost == 0


def test_merged_requests_name_every_file_they_named(sync: tuple[SyncProcess, HandLoop, Reports, int],
                                                    tmp_path: Path) -> None:
    p, loop, r, fd = sync
    other = os.open(tmp_path / "next-seg", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        p.request(1, [fd])
        p.request(2, [fd])
        p.request(3, [other, fd])
        assert p.next is not None and len(p.next[1]) == 2
    finally:
        os.close(other)  # the merged request holds its own copy
    loop.turn()
    loop.turn()
    assert r.synced == [1, 3] and r.failed == []


def test_a_failed_fdatasync_is_reported_with_its_errno(sync: tuple[SyncProcess, HandLoop, Reports, int]) -> None:
    p, loop, r, _ = sync
    rd, wr = os.pipe()  # fdatasync of a pipe: EINVAL
    try:
        p.request(7, [rd])
        loop.turn()
    finally:
        os.close(rd)
        os.close(wr)
    assert r.failed == [(7, errno.EINVAL)] and r.synced == []


def test_a_lost_process_is_reported_once_and_takes_no_more_requests(
        sync: tuple[SyncProcess, HandLoop, Reports, int]) -> None:
    p, loop, r, fd = sync
    p.request(1, [fd])
    p.request(2, [fd])  # merged, holding a duplicate of fd until it is sent
    os.kill(p.pid, signal.SIGKILL)
    p.join(5)
    while loop.readers:  # the reply to 1 may have come before the kill
        loop.turn()
    assert r.lost == 1 and p.closed and p.next is None
    with pytest.raises(OSError):
        p.request(3, [fd])


def test_the_process_ignores_ctrl_c_and_exits_when_its_broker_end_closes(
        sync: tuple[SyncProcess, HandLoop, Reports, int]) -> None:
    p, loop, r, fd = sync
    assert os.getpgid(p.pid) == p.pid  # a group of its own: a Ctrl-C to the terminal's group does not reach it
    p.request(1, [fd])
    loop.turn()  # it is past its start-up (signals set)
    os.kill(p.pid, signal.SIGINT)
    os.kill(p.pid, signal.SIGTERM)
    p.request(2, [fd])
    loop.turn()
    assert r.synced == [1, 2] and p.proc.poll() is None
    p.stop()
    p.join(5)
    assert p.proc.returncode == 0 and r.lost == 0
