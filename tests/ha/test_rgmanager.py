"""The rgmanager integration (docs/rgmanager.md): the `<script>` wrapper around the OCF agent, driven the way
rgmanager drives it (start/stop/status, no Pacemaker tools on the PATH), on two brokers of one machine; the
cluster.conf example is well-formed and the page shows the shipped files as they are."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support.cluster import free_ports
from tests.support.procs import BIN, ROOT, wait_for

RGM = ROOT / "resource_agents" / "rgmanager"
AGENT = ROOT / "resource_agents" / "understudy"
OCF_PY = Path("/usr/lib/ocf/lib/heartbeat/ocf.py")

pytestmark = pytest.mark.skipif(not OCF_PY.exists(), reason="resource-agents (ocf.py) not installed")


def test_the_page_shows_the_shipped_files_and_cluster_conf_is_well_formed() -> None:
    page = (ROOT / "docs" / "rgmanager.md").read_text()
    for name in ("understudy-rgmanager", "cluster.conf", "rgmanager.conf"):
        assert (RGM / name).read_text().strip() in page, f"docs/rgmanager.md does not show {name} as shipped"
    if shutil.which("xmllint"):
        r = subprocess.run(["xmllint", "--noout", str(RGM / "cluster.conf")], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr


def test_broker_and_primary_services_start_promote_relocate_and_stop(tmp_path: Path) -> None:
    ports = free_ports(2)
    brokers_url = ",".join(f"127.0.0.1:{p}" for p in ports)
    bindir = tmp_path / "sbin"
    bindir.mkdir()
    for role in ("understudy-broker", "understudy-primary"):
        (bindir / role).symlink_to(RGM / "understudy-rgmanager")

    def node(i: int) -> dict[str, str]:
        conf = tmp_path / f"n{i}.conf"
        conf.write_text(f"OCF_RESKEY_brokers_url={brokers_url}\nOCF_RESKEY_name=n{i}\nOCF_RESKEY_host=127.0.0.1\n"
                        f"OCF_RESKEY_port={ports[i - 1]}\nOCF_RESKEY_data_dir={tmp_path / f'n{i}'}\n"
                        f"OCF_RESKEY_bindir={BIN}\nOCF_RESKEY_options='--ha-heartbeat 1'\n")
        env = {k: v for k, v in os.environ.items() if not k.startswith("OCF_")}
        # rgmanager's world: no crm_attribute or attrd_updater (they live in /usr/sbin)
        env.update(PATH="/usr/bin:/bin", UNDERSTUDY_RGMANAGER_CONF=str(conf), UNDERSTUDY_AGENT=str(AGENT))
        return env

    envs = {1: node(1), 2: node(2)}

    def rgm(role: str, action: str, i: int) -> int:
        r = subprocess.run([str(bindir / f"understudy-{role}"), action], env=envs[i], capture_output=True,
                           text=True, timeout=120)
        return r.returncode

    def is_primary(i: int) -> bool:
        r = subprocess.run([str(BIN / "ha-status"), "--broker", f"127.0.0.1:{ports[i - 1]}", "--is-primary"],
                           capture_output=True, text=True, timeout=30)
        return r.returncode == 0

    def expect(i: int, state: str) -> bool:
        r = subprocess.run([str(BIN / "ha-status"), "--broker", f"127.0.0.1:{ports[i - 1]}", "--expect", state],
                           capture_output=True, text=True, timeout=30)
        return r.returncode == 0

    try:
        assert rgm("broker", "status", 1) == 3  # not running
        assert rgm("broker", "start", 1) == 0 and rgm("broker", "start", 2) == 0
        assert rgm("broker", "status", 1) == 0 and rgm("broker", "status", 2) == 0
        assert rgm("primary", "status", 1) == 3  # a backup: the primary service does not run here

        assert rgm("primary", "start", 1) == 0  # brand-new cluster: n1 bootstraps it
        assert is_primary(1) and rgm("primary", "status", 1) == 0 and rgm("broker", "status", 1) == 0
        wait_for(lambda: expect(2, "ready"), 30, 0.3, "n2 ready")

        # rgmanager relocates the primary service: stop (demote) on n1, start (promote) on n2.
        assert rgm("primary", "stop", 1) == 0
        wait_for(lambda: not is_primary(1), 20, 0.3, "n1 demoted")
        assert rgm("primary", "status", 1) == 3
        assert rgm("primary", "start", 2) == 0
        assert is_primary(2) and rgm("primary", "status", 2) == 0
        wait_for(lambda: expect(1, "ready"), 30, 0.3, "n1 ready again, as a backup")
    finally:
        for i in (1, 2):
            assert rgm("broker", "stop", i) == 0
    assert rgm("broker", "status", 1) == 3 and rgm("broker", "status", 2) == 3


def test_wrapper_refuses_a_wrong_name_or_a_missing_config(tmp_path: Path) -> None:
    wrong = tmp_path / "understudy-other"
    wrong.symlink_to(RGM / "understudy-rgmanager")
    conf = tmp_path / "empty.conf"
    conf.write_text("")
    env = {**os.environ, "UNDERSTUDY_RGMANAGER_CONF": str(conf)}
    r = subprocess.run([str(wrong), "start"], env=env, capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "usage: understudy-broker|understudy-primary" in r.stderr
    env["UNDERSTUDY_RGMANAGER_CONF"] = str(tmp_path / "missing.conf")
    r = subprocess.run([str(RGM / "understudy-rgmanager"), "status"], env=env, capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 6 and "cannot read" in r.stderr
