"""The harness leaves nothing behind when a test fails inside a running cluster."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.pacemaker.conftest import _missing_prerequisite
from tests.pacemaker.netns import Cluster, netns_lock, netns_pids, our_namespaces

pytestmark = pytest.mark.pacemaker


def test_failure_inside_a_running_cluster_leaves_no_namespace_process_or_mount(tmp_path: Path) -> None:
    reason = _missing_prerequisite()
    if reason:
        pytest.skip(reason)
    with netns_lock():
        pids: list[int] = []
        with pytest.raises(RuntimeError, match="test failed here"), Cluster(tmp_path, size=1) as c:
            pids = netns_pids(c.nodes[0].ns)
            mounts = c.run(c.nodes[0], ["cat", "/proc/self/mounts"]).stdout
            assert " /var/lib/pacemaker " in mounts  # the node really had its private mounts
            raise RuntimeError("test failed here")
        assert pids, "the node was running (corosync, pacemakerd, holder)"
        assert our_namespaces() == []
        assert [p for p in pids if _running(p)] == []
        assert str(tmp_path) not in Path("/proc/self/mounts").read_text()


def _running(pid: int) -> bool:
    """Alive and not a zombie (a killed daemon whose new parent has not reaped it yet is gone for our purpose)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"
