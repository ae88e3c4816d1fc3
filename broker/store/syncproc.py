"""The journal's fdatasync in a process of its own: `SyncProcess` (in the broker) and `main` (the process).

Why a process and not a thread: the syncer thread shared the event loop's GIL and core. Each sync woke it on a
condition, it took the GIL to run a few lines, gave it back for the fdatasync, took it again to post the result to
the loop; on 2 cores the durable broker spent 0.9-1.4 µs more CPU a message beside it and published ~12 % less
(measured: docs/performance.md, "the syncer in a process"). A process needs no GIL: the loop sends a request and reads the reply when epoll says it is there, like
any other socket.

The protocol, on a SOCK_SEQPACKET socketpair: a request is an 8-byte ticket with the file descriptors to sync
(SCM_RIGHTS: the process gets its own copies, so the broker may close its own at any time); the reply is the ticket
and an errno (0: everything the request named is on disk). One request is in flight at a time; requests made
meanwhile are merged into the next one (one `dup` per file they name, kept open until it is sent), as the thread
merged what queued up while it synced. A request whose descriptors did not all arrive (more than MAX_FDS) is answered
EMSGSIZE, never "synced".

The process lives as long as its end of the socket: it exits when the broker closes its end or dies (SIGKILL
included), once any fdatasync it is in has returned. It has a process group of its own and ignores SIGINT and
SIGTERM, so that a Ctrl-C to the terminal (or a signal to the broker's group) leaves the broker to close the journal
(its last sync) before the process goes. Should the
process go while the broker runs (killed by hand, the OOM killer), `on_lost` tells the journal, which goes back to
the syncer thread (`journal.syncer.lost`).

It imports the standard library only (run by path with `-I`): starting it costs an interpreter's start-up (~20 ms)
and ~13 MiB of memory (resident), once per broker.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import socket
import struct
import subprocess
import sys
from collections.abc import Callable
from typing import Protocol

REQUEST = struct.Struct("<Q")
REPLY = struct.Struct("<Qq")
MAX_FDS = 253  # descriptors one request may carry (Linux's SCM_MAX_FD; the journal names one or two files)


class Loop(Protocol):
    """What the process needs of the event loop (broker.engine.Engine has it)."""

    def add_reader(self, fd: int, fn: Callable[[int], None]) -> None: ...

    def remove_reader(self, fd: int) -> None: ...


class SyncProcess:
    """fdatasync in a child process: `request(ticket, fds)`; `on_synced(ticket)` or `on_failed(ticket, error)` are
    called on the loop's thread; `on_lost()` once if the process goes while requests may be outstanding."""

    def __init__(self, loop: Loop, on_synced: Callable[[int], None], on_failed: Callable[[int, OSError], None],
                 on_lost: Callable[[], None]) -> None:
        self.loop = loop
        self.on_synced, self.on_failed, self.on_lost = on_synced, on_failed, on_lost
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.proc = subprocess.Popen([sys.executable, "-I", __file__, str(theirs.fileno())],
                                         pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL, process_group=0)
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        ours.setblocking(False)
        self.sock = ours
        self.pid = self.proc.pid
        self.in_flight = 0  # ticket of the request sent (0: none)
        self.next: tuple[int, dict[tuple[int, int], int]] | None = None  # merged requests made meanwhile:
        #                                            (highest ticket, {(st_dev, st_ino): our dup of a fd of that file})
        self.closed = False
        loop.add_reader(ours.fileno(), self._readable)

    def request(self, ticket: int, fds: list[int]) -> None:
        if self.closed:
            raise OSError("the journal's sync process is gone")
        if not self.in_flight:
            self._send(ticket, fds)
            return
        top, dups = self.next if self.next is not None else (0, {})
        for fd in fds:  # one descriptor per file, however many requests merge (a slow disk: thousands)
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino) not in dups:
                dups[st.st_dev, st.st_ino] = os.dup(fd)
        self.next = (max(ticket, top), dups)

    def _send(self, ticket: int, fds: list[int]) -> None:
        try:
            socket.send_fds(self.sock, [REQUEST.pack(ticket)], fds)
        except OSError:
            self._lost()
            return
        self.in_flight = ticket

    def _readable(self, _mask: int) -> None:
        try:
            data = self.sock.recv(REPLY.size)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if len(data) != REPLY.size:  # EOF: the process is gone
            self._lost()
            return
        ticket, err = REPLY.unpack(data)
        self.in_flight = 0
        nxt, self.next = self.next, None
        if nxt is not None:  # before the report: what it releases may close descriptors the next request names
            fds = list(nxt[1].values())
            self._send(nxt[0], fds)
            for fd in fds:
                os.close(fd)
        if err:
            self.on_failed(ticket, OSError(err, os.strerror(err)))
        else:
            self.on_synced(ticket)

    def _lost(self) -> None:
        if self.closed:
            return
        self.stop()
        self.on_lost()

    def stop(self) -> None:
        """Close our end: the process exits once any sync it is in has returned."""
        if self.closed:
            return
        self.closed = True
        self.loop.remove_reader(self.sock.fileno())
        self.sock.close()
        if self.next is not None:
            for fd in self.next[1].values():
                os.close(fd)
            self.next = None

    def join(self, timeout: float | None = None) -> None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout)


def main(fd: int) -> None:
    """The process: sync what each request names, reply, until the broker's end is closed."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    sock = socket.socket(fileno=fd)
    while True:
        try:
            msg, fds, flags, _addr = socket.recv_fds(sock, REQUEST.size, MAX_FDS)
        except OSError:
            return
        if len(msg) != REQUEST.size:
            return  # EOF (or a request we cannot read: the broker's end is not ours)
        (ticket,) = REQUEST.unpack(msg)
        err = errno.EMSGSIZE if flags & socket.MSG_CTRUNC else 0  # descriptors were dropped: do not claim them
        try:
            for f in fds if not err else ():
                os.fdatasync(f)
        except OSError as e:
            err = e.errno or errno.EIO
        finally:
            for f in fds:
                os.close(f)
        try:
            sock.send(REPLY.pack(ticket, err))
        except OSError:
            return


if __name__ == "__main__":
    main(int(sys.argv[1]))
