"""The OCF agent as a program: meta-data, validate-all, probe and stop without any cluster or broker, and
``ocf-tester`` once the HA broker exists."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from tests.pacemaker.agent import AGENT, RA_DTD, VENV_BIN, agent_prerequisites, ha_admin_supports, run_agent

_missing = agent_prerequisites()
pytestmark = [pytest.mark.pacemaker, pytest.mark.skipif(_missing is not None, reason=_missing or "")]

NEEDS_HA_BROKER = pytest.mark.skipif(
    not ha_admin_supports("promote", "query", "demote", "ping"),
    reason="needs HA broker: ha-admin ping/query/promote/demote not available yet",
)


@pytest.fixture
def params(tmp_path: Path) -> dict[str, str]:
    return {
        "brokers_url": "127.0.0.1:25672",
        "port": "25672",
        "host": "127.0.0.1",
        "data_dir": str(tmp_path / "data"),
        "bindir": str(VENV_BIN),
        "monitor_timeout": "3",
    }


def test_meta_data_is_ocf_1_0_valid_against_the_dtd(tmp_path: Path) -> None:
    proc = run_agent("meta-data", {})
    assert proc.returncode == 0
    assert '<!DOCTYPE resource-agent SYSTEM "ra-api-1.dtd">' in proc.stdout
    xml = tmp_path / "understudy.xml"
    xml.write_text(proc.stdout)
    lint = subprocess.run(
        ["xmllint", "--noout", "--dtdvalid", str(RA_DTD), str(xml)], capture_output=True, text=True
    )
    assert lint.returncode == 0, lint.stderr
    for name in ("brokers_url", "public_url", "data_dir", "port", "config", "user", "monitor_timeout"):
        assert f'<parameter name="{name}"' in proc.stdout
    for action in ("start", "stop", "promote", "demote", "notify", "monitor", "validate-all"):
        assert f'<action name="{action}"' in proc.stdout


def test_validate_all_reports_missing_programs_as_not_installed(
    params: dict[str, str], tmp_path: Path
) -> None:
    proc = run_agent("validate-all", {**params, "bindir": str(tmp_path / "nowhere")})
    assert proc.returncode == 5  # OCF_ERR_INSTALLED
    assert "ha-broker not found" in proc.stderr


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"port": "70000"}, "port: expected 1..65535"),
        ({"brokers_url": "just-a-host"}, "brokers_url: 'just-a-host' is not host:port"),
        ({"public_url": "10.0.0.1"}, "public_url"),
        ({"monitor_timeout": "0"}, "monitor_timeout"),
    ],
)
def test_validate_all_reports_bad_values_as_misconfigured(
    params: dict[str, str], change: dict[str, str], message: str
) -> None:
    proc = run_agent("validate-all", {**params, **change})
    assert proc.returncode == 6  # OCF_ERR_CONFIGURED
    assert f"ocf-exit-reason:{message}" in proc.stderr


def test_validate_all_reports_a_data_dir_that_is_a_file_as_not_installed(
    params: dict[str, str], tmp_path: Path
) -> None:
    Path(params["data_dir"]).write_text("")
    proc = run_agent("validate-all", params)
    assert proc.returncode == 5  # OCF_ERR_INSTALLED: this node's problem, the resource may run elsewhere
    assert f"ocf-exit-reason:data_dir: {params['data_dir']} is not a directory" in proc.stderr


def test_a_broker_that_refuses_to_start_gives_its_reason_as_the_exit_reason(params: dict[str, str]) -> None:
    blocker = Path(params["data_dir"]) / "journal" / "00000001.jnl"
    blocker.mkdir(parents=True)  # a directory where the first segment should be: ha-broker exits 2
    proc = run_agent("start", params)
    assert proc.returncode == 1  # OCF_ERR_GENERIC
    assert (f"ocf-exit-reason:ha-broker exited with 2: ha-broker: journal: {blocker}: Is a directory; see "
            f"{params['data_dir']}/broker.out") in proc.stderr
    assert run_agent("monitor", params).returncode == 7  # not running


def test_missing_required_parameter_is_misconfigured(params: dict[str, str]) -> None:
    del params["brokers_url"]
    proc = run_agent("monitor", params)
    assert proc.returncode == 6
    assert "brokers_url" in proc.stderr


def test_probe_and_stop_of_a_stopped_broker(params: dict[str, str]) -> None:
    assert run_agent("monitor", params, meta={"interval": "0"}).returncode == 7
    assert run_agent("stop", params).returncode == 0
    assert run_agent("stop", params).returncode == 0


@NEEDS_HA_BROKER
def test_ocf_tester_passes(params: dict[str, str]) -> None:
    if shutil.which("ocf-tester") is None:
        pytest.skip("ocf-tester not installed")
    args = ["ocf-tester", "-n", "understudy"]
    for key, value in params.items():
        args += ["-o", f"{key}={value}"]
    proc = subprocess.run([*args, str(AGENT)], capture_output=True, text=True, timeout=600)
    try:
        assert proc.returncode == 0, proc.stdout + proc.stderr
    finally:
        run_agent("stop", params)


@NEEDS_HA_BROKER
def test_hung_broker_fails_monitor_and_stop_still_works(params: dict[str, str]) -> None:
    assert run_agent("start", params).returncode == 0
    try:
        assert run_agent("monitor", params).returncode == 0
        pid = int(Path(params["data_dir"], "broker.pid").read_text())
        os.kill(pid, signal.SIGSTOP)
        hung = run_agent("monitor", params)
        assert hung.returncode == 1, hung.stderr
        assert "does not answer" in hung.stderr
        hung_promoted = run_agent("monitor", params, meta={"role": "Promoted", "interval": "3000"})
        assert hung_promoted.returncode == 9
    finally:
        assert run_agent("stop", params, meta={"timeout": "20000"}).returncode == 0
    assert run_agent("monitor", params).returncode == 7
