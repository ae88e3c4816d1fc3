"""The highest epoch this broker has seen, kept in ``<data-dir>/epoch`` so that it survives restarts.

A backup refuses replication from a primary with a lower epoch, so this number must never go down: `raise_to`
ignores lower values, and the file is replaced atomically (write a temporary file, fsync it, rename it over the
old one, fsync the directory), so a crash leaves either the old or the new value, never a torn one.

Usage::

    store = EpochStore(Path("/var/lib/understudy"))
    store.load()          # 0 for a brand-new data dir
    store.raise_to(7)     # True: persisted
    store.raise_to(5)     # False: never lowers
"""

from __future__ import annotations

import os
from pathlib import Path

FILE_NAME = "epoch"


class EpochStoreError(Exception):
    """The epoch file exists but cannot be read as a non-negative integer."""


class EpochStore:
    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / FILE_NAME
        self._cached: int | None = None

    def load(self) -> int:
        """The persisted epoch; 0 when the file does not exist yet."""
        try:
            text = self.path.read_text(encoding="ascii").strip()
        except FileNotFoundError:
            self._cached = 0
            return 0
        try:
            value = int(text)
        except ValueError as exc:
            raise EpochStoreError(f"{self.path}: not an epoch number: {text!r}") from exc
        if value < 0:
            raise EpochStoreError(f"{self.path}: negative epoch {value}")
        self._cached = value
        return value

    @property
    def current(self) -> int:
        return self.load() if self._cached is None else self._cached

    def raise_to(self, epoch: int) -> bool:
        """Persist ``epoch`` if it is higher than the stored one.  Returns True when the file changed."""
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0, got {epoch}")
        if epoch <= self.current:
            return False
        self._write_atomically(epoch)
        self._cached = epoch
        return True

    def _write_atomically(self, epoch: int) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{FILE_NAME}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, f"{epoch}\n".encode("ascii"))
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.path)
        dir_fd = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
