"""Broker tests: assertion rewriting for the shared helpers (their asserts explain failures); a small disk, a disk
that can be frozen."""

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.disks import FreezableDisk, mounted_freezable_disk

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
    """A loop-mounted ext4 file system the test can freeze (root only)."""
    with mounted_freezable_disk(tmp_path) as disk:
        yield disk
