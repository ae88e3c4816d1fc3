"""The broker's data directory (`ha-broker --data-dir`, `understudy-cluster --data-dir`): checked at start, so that
a bad one is one precise line instead of a traceback or a misleading error later, and held by one broker at a time.

The hold is an exclusive `flock` on DATA_DIR/lock for the life of the process (the kernel drops it when the process
ends, SIGKILL included: no stale lock to clean up), as Artemis' `server.lock` and qpidd's data-directory lock do:
two brokers writing one journal would corrupt it. The file holds the holder's pid, for the message of the next."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
from pathlib import Path

LOCK_FILE = "lock"


class DataDirInUse(Exception):
    """Another process holds the data directory's lock; `holder` is the pid it wrote there (or '?')."""

    def __init__(self, path: Path, holder: str) -> None:
        super().__init__(f"in use by another process, pid {holder} (it holds {path / LOCK_FILE}: a broker, or "
                         "ha-admin journal cut): two brokers on one data directory would corrupt its journal")
        self.holder = holder


def data_dir_problem(path: Path, create: bool = True) -> str | None:
    """Why `path` cannot be a data directory, or None. A missing one is made (`create`); without `create` (what
    `--validate-config` asks, changing nothing on disk) its nearest existing parent must be a directory it could be
    made in, and the answer is the one the making would give."""
    if path.exists() and not path.is_dir():
        return "not a directory"
    if not path.exists():
        if not create:
            return _could_not_make(path)
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            return f"cannot create it: {e.strerror or e}"
    return _not_writable(path)


def _not_writable(path: Path) -> str | None:
    if not os.access(path, os.W_OK | os.X_OK):
        return "not writable" + (" (a read-only file system)" if _read_only(path) else "")
    return None


def _could_not_make(path: Path) -> str | None:
    """What `mkdir -p path` would fail with, without trying: the nearest existing parent decides."""
    parent = _nearest_existing(path)
    if not parent.is_dir():
        code = errno.ENOTDIR
    elif _read_only(parent):
        code = errno.EROFS
    elif not os.access(parent, os.W_OK | os.X_OK):
        code = errno.EACCES
    else:
        return None
    return f"cannot create it: {os.strerror(code)}"


def _nearest_existing(path: Path) -> Path:
    """`path` if it exists, else its nearest existing parent (where `mkdir -p path` would start)."""
    return next((p for p in (path.absolute(), *path.absolute().parents) if p.exists()), Path("/"))


def disk_free_problem(path: Path, min_free: int) -> str | None:
    """Why `--min-disk-free min_free` cannot work for a data directory at `path` (judged on the file system of its
    nearest existing parent), or None: a bound the whole file system does not reach refuses every durable message."""
    if not min_free:
        return None
    try:
        st = os.statvfs(_nearest_existing(path))
    except OSError:
        return None  # cannot tell: the broker looks again every second
    total = st.f_blocks * st.f_frsize
    if min_free >= total:
        return (f"more than the whole file system of --data-dir ({total} bytes): durable "
                "messages would never be taken")
    return None


def file_problem(path: Path) -> str | None:
    """Why the broker could not write the file `path` (--log-file, --pid-file; its directory is made if missing),
    judged without writing anything, or None."""
    if path.is_dir():
        return "is a directory"
    if path.exists():
        return None if os.access(path, os.W_OK) else "not writable"
    problem = data_dir_problem(path.parent, create=False)
    return None if problem is None else f"its directory {path.parent}: {problem}"


def lock_data_dir(path: Path) -> int:
    """Take DATA_DIR/lock for the life of this process and write our pid into it; returns the descriptor, which
    must stay open (not inherited: close-on-exec). Raises DataDirInUse when another process holds it, OSError when
    the file cannot be made."""
    fd = os.open(path / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise DataDirInUse(path, holder) from None
    except OSError:
        os.close(fd)
        raise
    with contextlib.suppress(OSError):  # the pid is for the message of the next; a full disk must not stop a start
        os.pwrite(fd, f"{os.getpid():<10}\n".encode(), 0)  # one width, in place: no truncation, no new block
    return fd


def _read_only(path: Path) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False
