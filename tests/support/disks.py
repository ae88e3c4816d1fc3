"""A disk a test can make hang: a loop-mounted ext4 file system frozen with `fsfreeze` (root only)."""

from __future__ import annotations

import subprocess
from pathlib import Path


class FreezableDisk:
    """An ext4 file system on a loop device that the test can freeze (`fsfreeze`): a write into it then blocks
    until it is thawed, as on a hung disk."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def freeze(self) -> None:
        subprocess.run(["fsfreeze", "--freeze", str(self.path)], check=True, timeout=30)

    def thaw(self) -> None:
        subprocess.run(["fsfreeze", "--unfreeze", str(self.path)], check=False, timeout=30, capture_output=True)
