"""Run the OCF agent the way Pacemaker's executor does: an action name and OCF_RESKEY_* variables."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path

AGENT = Path(__file__).resolve().parents[2] / "resource_agents" / "understudy"
VENV_BIN = Path(__file__).resolve().parents[2] / ".venv" / "bin"
OCF_PY = Path("/usr/lib/ocf/lib/heartbeat/ocf.py")
RA_DTD = Path("/usr/share/resource-agents/ra-api-1.dtd")


def run_agent(
    action: str, params: Mapping[str, str], meta: Mapping[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OCF_")}
    env["OCF_ROOT"] = "/usr/lib/ocf"
    env.update({f"OCF_RESKEY_{k}": v for k, v in params.items()})
    env.update({f"OCF_RESKEY_CRM_meta_{k}": v for k, v in (meta or {}).items()})
    return subprocess.run([str(AGENT), action], env=env, capture_output=True, text=True, timeout=timeout)


def ha_admin_supports(*commands: str) -> bool:
    """Whether the installed ha-admin offers these subcommands (the HA broker has landed)."""
    exe = VENV_BIN / "ha-admin"
    if not exe.exists():
        return False
    proc = subprocess.run([str(exe), "--help"], capture_output=True, text=True, timeout=30)
    return proc.returncode == 0 and all(c in proc.stdout for c in commands)


def agent_prerequisites() -> str | None:
    if not OCF_PY.exists():
        return "resource-agents (ocf.py) not installed"
    if shutil.which("xmllint") is None:
        return "xmllint (libxml2-utils) not installed"
    return None
