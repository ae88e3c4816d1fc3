"""The Vagrantfile is valid Vagrant configuration (no provider or box needed) and provisions with deploy/."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.pacemaker
REPO = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(shutil.which("vagrant") is None, reason="vagrant not installed")
def test_vagrant_validate(tmp_path: Path) -> None:
    env = {**os.environ, "VAGRANT_CHECKPOINT_DISABLE": "1", "VAGRANT_HOME": str(tmp_path / "vagrant-home")}
    proc = subprocess.run(
        ["vagrant", "validate", "--ignore-provider"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Vagrantfile validated successfully" in proc.stdout


def test_vagrant_provisioning_uses_the_shared_deploy_code() -> None:
    vagrantfile = (REPO / "Vagrantfile").read_text()
    assert 'path: "deploy/provision.sh"' in vagrantfile
    provision = (REPO / "deploy" / "provision.sh").read_text()
    assert "python3 -m deploy.clusterconf corosync" in provision
    assert "python3 -m deploy.clusterconf cib" in provision
    assert "-m ha.pacemaker" in provision
    check = subprocess.run(
        ["bash", "-n", str(REPO / "deploy" / "provision.sh")], capture_output=True, text=True
    )
    assert check.returncode == 0, check.stderr
