"""An older release of the broker, unpacked from this clone's git history, for mixed-release (rolling upgrade) tests:
`BrokerFactory(..., source=unpack(...))` runs `ha-broker` from it."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NOT_IN_CLONE = "is not in this clone"  # the skip's reason; the one skip CI allows (conftest.py)


def unpack(commit: str, tmp_path_factory: pytest.TempPathFactory, what: str) -> Path:
    """The tree of `commit`, extracted under a temporary directory (the test is skipped where the history is not
    there, e.g. a shallow clone). `what` names the release in the directory."""
    found = subprocess.run(["git", "-C", str(ROOT), "cat-file", "-e", f"{commit}^{{commit}}"], capture_output=True)
    if found.returncode != 0:
        pytest.skip(f"commit {commit} ({what}) {NOT_IN_CLONE}")
    dest = tmp_path_factory.mktemp(what)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", commit],
                             capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return dest
