"""A real Pacemaker + Corosync cluster of N nodes on one machine, each node in its own namespaces.

Layout (subnet 10.77.0.0/24 exists only inside these namespaces, never in the root namespace):

    netns uspm-sw : bridge br0 and one veth end per node (p1, p2, ..., pc)
    netns uspm-n1 : eth0 10.77.0.11 -- node1   (plus a private mount + UTS namespace, see below)
    netns uspm-n2 : eth0 10.77.0.12 -- node2
    ...
    netns uspm-c  : eth0 10.77.0.50 -- the client

Each node runs under a *holder* process (``sleep infinity`` after setup) started with
``ip netns exec uspm-nN unshare -m -u``: it gets its own hostname and private bind mounts of /etc/corosync,
/var/lib/pacemaker, /var/lib/corosync, /var/lib/understudy and the log directories, plus tmpfs on /run and
/dev/shm. Commands run inside a node with ``nsenter -t HOLDER -n -m -u``.

Every namespace name starts with ``uspm-``; :meth:`Cluster.cleanup` (and :func:`cleanup_stale` at start) kill
every process inside those namespaces and delete them, so nothing outlives a test run.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shlex
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO, TypeVar

from deploy.clusterconf import BootstrapProperties, ClusterNode, ClusterSpec, bootstrap_cib, corosync_conf
from tests.pacemaker.crm_status import ClusterStatus, parse_crm_mon

PREFIX = "uspm-"
SWITCH_NS = PREFIX + "sw"
CLIENT_NS = PREFIX + "c"
SUBNET = "10.77.0"
CLIENT_ADDRESS = f"{SUBNET}.50"
NETMASK = 24

# Directories a node gets privately: mount point on the host -> name of the per-node copy.
PRIVATE_DIRS = {
    "/etc/corosync": "etc-corosync",
    "/var/lib/pacemaker": "var-lib-pacemaker",
    "/var/lib/corosync": "var-lib-corosync",
    "/var/lib/understudy": "var-lib-understudy",
    "/var/log/pacemaker": "var-log-pacemaker",
    "/var/log/corosync": "var-log-corosync",
}

T = TypeVar("T")


def sh(cmd: Sequence[str], *, check: bool = True, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    """Run a command, capture its output; on failure raise with stdout/stderr in the message."""
    proc = subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise RuntimeError(
            f"{shlex.join(cmd)} -> exit {proc.returncode}\nstdout: {proc.stdout.strip()}\nstderr: {proc.stderr.strip()}"
        )
    return proc


def wait_for(what: str, probe: Callable[[], T | None], timeout: float, interval: float = 0.2) -> T:
    """Poll ``probe`` until it returns something truthy; raise TimeoutError naming ``what`` otherwise."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while True:
        try:
            value = probe()
            if value:
                return value
        except (RuntimeError, subprocess.TimeoutExpired) as exc:
            last_error = exc
        if time.monotonic() >= deadline:
            raise TimeoutError(
                f"timed out after {timeout:.0f}s waiting for {what} (last error: {last_error})"
            )
        time.sleep(interval)


def netns_pids(ns: str) -> list[int]:
    proc = sh(["ip", "netns", "pids", ns], check=False)
    return [int(p) for p in proc.stdout.split()]


def kill_netns_processes(ns: str) -> None:
    """SIGKILL every process in ``ns`` until none is left (processes may fork while we kill)."""
    for _ in range(20):
        pids = netns_pids(ns)
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)


def our_namespaces() -> list[str]:
    out = sh(["ip", "netns", "list"], check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.startswith(PREFIX)]


LOCK_FILE = Path("/run/lock/understudy-pcmk-netns.lock")


@contextlib.contextmanager
def netns_lock(timeout: float = 1800.0) -> Iterator[None]:
    """Only one namespaced cluster per machine: the names, subnet and /tmp log dir are fixed. A second test run
    (another checkout, another engineer) waits here instead of tearing down the first one's cluster."""
    LOCK_FILE.parent.mkdir(parents=True, exist_ok=True)
    with LOCK_FILE.open("w") as f:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise TimeoutError(
                        f"another namespaced cluster held {LOCK_FILE} for {timeout:.0f}s"
                    ) from None
                time.sleep(1.0)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def cleanup_stale() -> None:
    """Remove namespaces (and their processes) left by an earlier, killed run. Call only under netns_lock."""
    for ns in our_namespaces():
        kill_netns_processes(ns)
        sh(["ip", "netns", "del", ns], check=False)


@dataclass
class Node:
    index: int
    name: str
    address: str
    ns: str
    base: Path
    holder: subprocess.Popen[bytes] | None = None

    @property
    def alive(self) -> bool:
        return self.holder is not None and self.holder.poll() is None

    def path(self, host_dir: str) -> Path:
        """Where the node's private copy of ``host_dir`` lives on the host (readable after the node died)."""
        return self.base / PRIVATE_DIRS[host_dir]


class Cluster:
    """Build, drive and tear down the namespaced cluster. Use as a context manager, inside :func:`netns_lock`."""

    def __init__(self, workdir: Path, size: int = 3, cluster_name: str = "understudy-test") -> None:
        self.workdir = workdir
        self.nodes = [
            Node(
                index=i,
                name=f"node{i}",
                address=f"{SUBNET}.{10 + i}",
                ns=f"{PREFIX}n{i}",
                base=workdir / f"n{i}",
            )
            for i in range(1, size + 1)
        ]
        self.spec = ClusterSpec(
            name=cluster_name,
            nodes=tuple(ClusterNode(name=n.name, address=n.address, nodeid=n.index) for n in self.nodes),
            token_ms=1000,
        )

    # ---- lifecycle -------------------------------------------------------------------------------------------

    def __enter__(self) -> Cluster:
        cleanup_stale()
        try:
            self.net_up()
            for node in self.nodes:
                self.prepare_node(node)
                self.start_node(node)
            self.wait_online([n.name for n in self.nodes])
        except BaseException:
            self.cleanup()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.cleanup()

    def net_up(self) -> None:
        sh(["ip", "netns", "add", SWITCH_NS])
        sh(["ip", "-n", SWITCH_NS, "link", "add", "br0", "type", "bridge"])
        sh(["ip", "-n", SWITCH_NS, "link", "set", "br0", "up"])
        for ns, port, address in [
            *((n.ns, f"p{n.index}", n.address) for n in self.nodes),
            (CLIENT_NS, "pc", CLIENT_ADDRESS),
        ]:
            sh(["ip", "netns", "add", ns])
            sh(
                [
                    "ip",
                    "-n",
                    SWITCH_NS,
                    "link",
                    "add",
                    port,
                    "type",
                    "veth",
                    "peer",
                    "name",
                    "eth0",
                    "netns",
                    ns,
                ]
            )
            sh(["ip", "-n", SWITCH_NS, "link", "set", port, "master", "br0", "up"])
            sh(["ip", "-n", ns, "link", "set", "lo", "up"])
            sh(["ip", "-n", ns, "addr", "add", f"{address}/{NETMASK}", "dev", "eth0"])
            sh(["ip", "-n", ns, "link", "set", "eth0", "up"])

    def prepare_node(self, node: Node) -> None:
        """Fresh per-node state: corosync.conf, bootstrap CIB (dc-deadtime 2s, no stonith), empty dirs."""
        if node.base.exists():
            shutil.rmtree(node.base)
        node.base.mkdir(parents=True)
        os.chmod(self.workdir, 0o755)
        shutil.copytree("/etc/corosync", node.path("/etc/corosync"), symlinks=True)
        for host_dir in PRIVATE_DIRS:
            node.path(host_dir).mkdir(exist_ok=True)
        (node.path("/etc/corosync") / "corosync.conf").write_text(corosync_conf(self.spec))
        pcmk = node.path("/var/lib/pacemaker")
        for sub in ("cib", "pengine", "blackbox", "cores"):
            (pcmk / sub).mkdir()
        cib = pcmk / "cib" / "cib.xml"
        cib.write_text(bootstrap_cib(BootstrapProperties(dc_deadtime="2s", stonith_enabled=False)))
        cib.chmod(0o600)
        sh(["chown", "-R", "hacluster:haclient", str(pcmk), str(node.path("/var/log/pacemaker"))])
        sh(
            [
                "chmod",
                "750",
                str(node.path("/var/log/pacemaker")),
                *(str(pcmk / s) for s in ("cib", "pengine")),
            ]
        )

    def _node_script(self, node: Node) -> str:
        mounts = "\n".join(f"mount --bind {node.path(d)} {d}" for d in PRIVATE_DIRS)
        return f"""set -e
hostname {node.name}
{mounts}
mount -t tmpfs -o mode=755 tmpfs /run
mount -t tmpfs -o mode=1777 tmpfs /dev/shm
install -d -o hacluster -g haclient -m 750 /run/crm
install -d -m 1755 /run/resource-agents
corosync
setsid /usr/sbin/pacemakerd >{node.base}/pacemakerd.out 2>&1 </dev/null &
exec sleep infinity
"""

    def start_node(self, node: Node) -> None:
        for d in PRIVATE_DIRS:
            Path(d).mkdir(parents=True, exist_ok=True)  # mount points must exist on the host
        sh(["ip", "-n", node.ns, "link", "set", "eth0", "up"])
        node.holder = subprocess.Popen(
            [
                "ip",
                "netns",
                "exec",
                node.ns,
                "unshare",
                "-m",
                "-u",
                "--propagation",
                "private",
                "bash",
                "-c",
                self._node_script(node),
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=(node.base / "holder.err").open("ab"),
            start_new_session=True,
        )
        wait_for(f"{node.name} pacemakerd", lambda: self._pacemakerd_up(node), timeout=30)

    def _pacemakerd_up(self, node: Node) -> bool:
        if not node.alive:
            err = (node.base / "holder.err").read_text()
            raise AssertionError(f"{node.name} failed to start: {err}")
        return any(_comm(p) == "pacemakerd" for p in netns_pids(node.ns))

    def stop_node(self, node: Node, timeout: float = 60) -> None:
        """Clean stop: pacemaker first (stops resources), then corosync, then the holder."""
        if node.alive:
            self.run(node, ["pacemakerd", "--shutdown"], check=False, timeout=timeout)
            with contextlib.suppress(TimeoutError):
                wait_for(
                    f"{node.name} pacemaker stop",
                    lambda: not [p for p in netns_pids(node.ns) if _comm(p).startswith("pacemaker")],
                    timeout=timeout,
                )
            self.run(node, ["corosync-cfgtool", "-H", "--force"], check=False)
            with contextlib.suppress(TimeoutError):
                wait_for(
                    f"{node.name} corosync stop",
                    lambda: "corosync" not in {_comm(p) for p in netns_pids(node.ns)},
                    timeout=10,
                )
        self._reap(node)

    def kill_node(self, node: Node) -> None:
        """Hard crash: link down first (a dead namespace would still answer for the VIP), then SIGKILL all."""
        sh(["ip", "-n", node.ns, "link", "set", "eth0", "down"])
        self._reap(node)

    def _reap(self, node: Node) -> None:
        kill_netns_processes(node.ns)
        if node.holder is not None:
            with contextlib.suppress(ProcessLookupError):
                node.holder.kill()
            node.holder.wait(timeout=10)

    def restart_node(self, node: Node) -> None:
        """Bring a killed/stopped node back with its previous state (CIB, data dir)."""
        self.start_node(node)

    def cleanup(self) -> None:
        """Always safe to call: kills every process in our namespaces and deletes them."""
        for node in self.nodes:
            with contextlib.suppress(Exception):
                self._reap(node)
        cleanup_stale()

    # ---- network faults -------------------------------------------------------------------------------------

    def partition(self, node: Node) -> None:
        """Cut ``node`` off from the other cluster nodes (the client can still reach it)."""
        for peer in self.nodes:
            if peer is not node:
                self.netns_exec(node.ns, ["iptables", "-A", "INPUT", "-s", peer.address, "-j", "DROP"])
                self.netns_exec(node.ns, ["iptables", "-A", "OUTPUT", "-d", peer.address, "-j", "DROP"])

    def heal(self, node: Node) -> None:
        self.netns_exec(node.ns, ["iptables", "-F"])

    # ---- running things -------------------------------------------------------------------------------------

    def node(self, name: str) -> Node:
        return next(n for n in self.nodes if n.name == name)

    def run(
        self, node: Node, cmd: Sequence[str], *, check: bool = True, timeout: float = 60.0
    ) -> subprocess.CompletedProcess[str]:
        """Run ``cmd`` inside ``node`` (its network, mounts and hostname)."""
        if node.holder is None:
            raise RuntimeError(f"{node.name} is not running")
        return sh(
            ["nsenter", "-t", str(node.holder.pid), "-n", "-m", "-u", *cmd], check=check, timeout=timeout
        )

    def netns_exec(
        self, ns: str, cmd: Sequence[str], *, check: bool = True, timeout: float = 60.0
    ) -> subprocess.CompletedProcess[str]:
        return sh(["ip", "netns", "exec", ns, *cmd], check=check, timeout=timeout)

    def client(
        self, cmd: Sequence[str], *, check: bool = True, timeout: float = 60.0
    ) -> subprocess.CompletedProcess[str]:
        return self.netns_exec(CLIENT_NS, cmd, check=check, timeout=timeout)

    def client_popen(self, cmd: Sequence[str], log: Path) -> subprocess.Popen[bytes]:
        """A long-running process in the client namespace (killed by :meth:`cleanup` at the latest)."""
        return subprocess.Popen(
            ["ip", "netns", "exec", CLIENT_NS, *cmd],
            stdin=subprocess.DEVNULL,
            stdout=log.open("ab"),
            stderr=subprocess.STDOUT,
        )

    def alive_nodes(self) -> list[Node]:
        return [n for n in self.nodes if n.alive]

    def status(self, via: Node | None = None) -> ClusterStatus:
        node = via or self.alive_nodes()[0]
        return parse_crm_mon(self.run(node, ["crm_mon", "-1", "--output-as=xml"], timeout=30).stdout)

    def wait_online(self, names: Sequence[str], timeout: float = 90) -> ClusterStatus:
        want = frozenset(names)
        return wait_for(
            f"nodes {sorted(want)} online",
            lambda: s if (s := self.status()).online == want and s.quorum else None,
            timeout,
        )

    def wait_status(
        self, what: str, ok: Callable[[ClusterStatus], bool], timeout: float = 60, via: Node | None = None
    ) -> ClusterStatus:
        return wait_for(what, lambda: s if ok(s := self.status(via)) else None, timeout, interval=0.1)

    def pcs_apply(self, commands: Sequence[Sequence[str]], via: Node | None = None) -> None:
        """Run pcs commands inside a node, from a scratch directory (``pcs -f FILE`` writes relative files)."""
        node = via or self.alive_nodes()[0]
        workdir = "/run/pcs-setup"
        self.run(node, ["mkdir", "-p", workdir])
        for cmd in commands:
            self.run(node, ["sh", "-c", f"cd {workdir} && {shlex.join(cmd)}"])

    # ---- diagnostics ---------------------------------------------------------------------------------------

    def log_files(self) -> Iterator[Path]:
        for node in self.nodes:
            yield node.base / "pacemakerd.out"
            yield node.base / "holder.err"
            for d in ("/var/log/pacemaker", "/var/log/corosync", "/var/lib/understudy"):
                yield from sorted(p for p in node.path(d).rglob("*.log") if p.is_file())

    def dump_logs(self, out: TextIO, tail: int = 80) -> None:
        """Print cluster status and the tail of every log, for a failed test."""
        for node in self.alive_nodes():
            with contextlib.suppress(Exception):
                out.write(f"==== crm_mon via {node.name}\n")
                out.write(self.run(node, ["crm_mon", "-1", "-A"], check=False, timeout=15).stdout)
                break
        for path in self.log_files():
            if path.exists() and path.stat().st_size:
                lines = path.read_text(errors="replace").splitlines()[-tail:]
                out.write(f"==== {path.relative_to(self.workdir)} (last {len(lines)} lines)\n")
                out.write("\n".join(lines) + "\n")


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""
