"""Broker tests: assertion rewriting for the shared helpers (their asserts explain failures); a small disk, a disk
that can be frozen."""

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.disks import FreezableDisk

pytest.register_assert_rewrite("tests.broker.helpers")


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """An 8 MiB tmpfs: a disk that fills up (root only)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mnt = tmp_path / "small"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mnt)], check=True)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


@pytest.fixture
def freezable_disk(tmp_path: Path) -> Iterator[FreezableDisk]:
    """A 128 MiB loop-mounted ext4 file system, thawed and unmounted afterwards (root only)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a loop device needs root")
    image, mnt = tmp_path / "disk.img", tmp_path / "frozen"
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
