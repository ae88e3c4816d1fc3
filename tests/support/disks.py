"""A disk a test can make hang: a loop-mounted ext4 file system frozen with `fsfreeze` (root only)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


class FreezableDisk:
    """An ext4 file system on a loop device that the test can freeze (`fsfreeze`): a write into it then blocks
    until it is thawed, as on a hung disk."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def freeze(self) -> None:
        subprocess.run(["fsfreeze", "--freeze", str(self.path)], check=True, timeout=30)

    def thaw(self) -> None:
        subprocess.run(["fsfreeze", "--unfreeze", str(self.path)], check=False, timeout=30, capture_output=True)


@contextmanager
def mounted_freezable_disk(directory: Path) -> Iterator[FreezableDisk]:
    """A 128 MiB ext4 file system in an image under `directory`, loop-mounted; thawed and unmounted afterwards
    (lazily: a broker may still have files open on it). Skips the test unless run as root."""
    if os.geteuid() != 0:
        pytest.skip("mounting a loop device needs root")
    image, mnt = directory / "disk.img", directory / "frozen"
    mnt.mkdir()
    with open(image, "wb") as f:
        f.truncate(128 * 1024 * 1024)
    subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], check=True, timeout=60)
    subprocess.run(["mount", "-o", "loop", str(image), str(mnt)], check=True, timeout=30)
    disk = FreezableDisk(mnt)
    try:
        yield disk
    finally:
        disk.thaw()
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def fill_up(disk: Path, name: str = "ballast") -> Path:
    """Write a ballast file until the disk has no room left; returns it (the operator frees it later)."""
    ballast = disk / name
    chunk = b"\0" * 65536
    with ballast.open("wb", buffering=0) as f:
        while True:
            try:
                f.write(chunk)
            except OSError:
                if len(chunk) == 1:
                    return ballast
                chunk = chunk[: len(chunk) // 2]
