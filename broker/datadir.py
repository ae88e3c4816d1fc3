"""Can a directory hold a broker's data (`ha-broker --data-dir`, `understudy-cluster --data-dir`)? Checked at start,
so that a bad one is one precise line instead of a traceback or a misleading error later."""

from __future__ import annotations

import os
from pathlib import Path


def data_dir_problem(path: Path) -> str | None:
    """Why `path` cannot be a data directory (it is made if missing), or None."""
    if path.exists() and not path.is_dir():
        return "not a directory"
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        return f"cannot create it: {e.strerror or e}"
    if not os.access(path, os.W_OK | os.X_OK):
        return "not writable" + (" (a read-only file system)" if _read_only(path) else "")
    return None


def _read_only(path: Path) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False
