"""Fixtures for tests against a real Pacemaker + Corosync cluster in network namespaces (root only)."""

from __future__ import annotations

import atexit
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.pacemaker.netns import Cluster, netns_lock

REPO = Path(__file__).resolve().parents[2]
AGENT = REPO / "resource_agents" / "understudy"
OCF_PROVIDER_DIR = Path("/usr/lib/ocf/resource.d/understudy")
REQUIRED_TOOLS = ("corosync", "pacemakerd", "pcs", "crm_mon", "iptables", "nsenter", "unshare", "ip")


def _missing_prerequisite() -> str | None:
    if os.geteuid() != 0:
        return "needs root (network and mount namespaces)"
    missing = [t for t in REQUIRED_TOOLS if shutil.which(t) is None]
    return f"missing tools: {', '.join(missing)}" if missing else None


def install_agent() -> None:
    """What scripts/setup.sh does: make our OCF agent visible to Pacemaker as ocf:understudy:understudy."""
    OCF_PROVIDER_DIR.mkdir(parents=True, exist_ok=True)
    link = OCF_PROVIDER_DIR / AGENT.name
    if not (link.is_symlink() and link.resolve() == AGENT.resolve()):
        link.unlink(missing_ok=True)
        link.symlink_to(AGENT)


LOG_ROOT = Path(os.environ.get("UNDERSTUDY_PCMK_LOGS", "/tmp/understudy-pcmk"))


@pytest.fixture(scope="module")
def cluster(request: pytest.FixtureRequest) -> Iterator[Cluster]:
    """A 3-node cluster, built once per test module and always torn down (even on failure or Ctrl-C).

    Node state and logs stay in $UNDERSTUDY_PCMK_LOGS/<module> (default /tmp/understudy-pcmk) until the module
    runs again, for post-mortems.
    """
    reason = _missing_prerequisite()
    if reason:
        pytest.skip(reason)
    install_agent()
    with netns_lock():  # SIGTERM tears this down too, as Ctrl-C does (conftest.py at the top)
        workdir = LOG_ROOT / request.module.__name__.rsplit(".", 1)[-1]
        if workdir.exists():
            shutil.rmtree(workdir)
        workdir.mkdir(parents=True)
        c = Cluster(workdir)
        atexit.register(c.cleanup)
        try:
            with c:
                yield c
        finally:
            atexit.unregister(c.cleanup)


@pytest.fixture(autouse=True)
def _dump_cluster_logs_on_failure(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    if "cluster" not in request.fixturenames:
        return
    failed = any(
        getattr(request.node, f"rep_{when}", None) is not None and getattr(request.node, f"rep_{when}").failed
        for when in ("setup", "call")
    )
    if failed:
        c: Cluster = request.getfixturevalue("cluster")
        sys.stdout.write(f"\n######## cluster logs after failure of {request.node.nodeid}\n")
        c.dump_logs(sys.stdout)
