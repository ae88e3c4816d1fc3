"""RabbitMQ 3.10 (Debian `rabbitmq-server`) as the comparison target: one node, or a cluster of three, on 127.0.0.1
with the AMQP 1.0 plugin.

Each node gets its own RABBITMQ_* directories and ports; the epmd is private (ERL_EPMD_PORT on a free port, shared by
the nodes of one cluster, so the epmd we stop is ours and nobody else's). Queues are declared over AMQP 0-9-1 with
pika (the only way to ask for a quorum queue) and addressed over AMQP 1.0 as `/amq/queue/NAME`.

`rabbit-quorum-3` (and `rabbit-quorum-3-durable`, the same cluster sent durable messages): three nodes
(`benchPIDn1..3@localhost`, same Erlang cookie written into each node's HOME),
nodes 2 and 3 joined to node 1 with `rabbitmqctl stop_app / join_cluster / start_app`; the quorum queue is declared
on node 1 with `x-quorum-initial-group-size: 3` (its leader is then on node 1) and every client connects to node 1.
Broker CPU is the three nodes' process trees (roles node-1, node-2, node-3).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from bench import procstat
from bench.targets import ClientSpec, Target, TargetInfo, free_port

RABBIT_HOME = Path("/usr/lib/rabbitmq/lib")
USER, PASSWORD = "guest", "guest"  # the default user, allowed from loopback only


def rabbit_sbin() -> Path:
    found = sorted(RABBIT_HOME.glob("rabbitmq_server-3.*/sbin/rabbitmq-server"))
    if not found:
        raise RuntimeError("RabbitMQ is not installed: apt-get install rabbitmq-server (Debian 3.10)")
    return found[-1]


class RabbitNode:
    """One RabbitMQ node process tree (the rabbitmq-server shell, erl/beam.smp, helpers) plus its epmd."""

    def __init__(self, workdir: Path, name: str = "bench", epmd_port: int | None = None,
                 cookie: str | None = None, nodename: str | None = None) -> None:
        self.workdir = workdir / f"rabbit-{name}"
        self.nodename = nodename or f"{name}{os.getpid()}@localhost"
        self.port = free_port()
        self.dist_port = free_port()
        self.epmd_port = epmd_port or free_port()
        self.cookie = cookie
        self.proc: subprocess.Popen[bytes] | None = None
        self.epmd_pid: int | None = None

    def env(self) -> dict[str, str]:
        w = self.workdir
        plugins = w / "enabled_plugins"
        plugins.write_text("[rabbitmq_amqp1_0].\n")
        conf = w / "rabbitmq.conf"
        conf.write_text("loopback_users = none\n" "log.console = false\n" "log.file.level = warning\n")
        env = dict(os.environ)
        env.update(
            HOME=str(w / "home"),
            RABBITMQ_NODENAME=self.nodename,
            RABBITMQ_NODE_IP_ADDRESS="127.0.0.1",
            RABBITMQ_NODE_PORT=str(self.port),
            RABBITMQ_DIST_PORT=str(self.dist_port),
            RABBITMQ_MNESIA_BASE=str(w / "mnesia"),
            RABBITMQ_LOG_BASE=str(w / "log"),
            RABBITMQ_ENABLED_PLUGINS_FILE=str(plugins),
            RABBITMQ_CONFIG_FILE=str(conf),
            RABBITMQ_CONF_ENV_FILE=str(w / "rabbitmq-env.conf"),  # absent: ignore /etc/rabbitmq's
            RABBITMQ_ADVANCED_CONFIG_FILE=str(w / "advanced.config"),
            ERL_EPMD_ADDRESS="127.0.0.1",
            ERL_EPMD_PORT=str(self.epmd_port),
        )
        return env

    def start(self, timeout: float = 90.0) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        (self.workdir / "home").mkdir(exist_ok=True)
        if self.cookie is not None:  # nodes of one cluster share the cookie
            f = self.workdir / "home" / ".erlang.cookie"
            f.write_text(self.cookie)
            f.chmod(0o400)
        env = self.env()
        log = open(self.workdir / "stdout.log", "ab")  # noqa: SIM115 - owned by the child
        self.proc = subprocess.Popen([str(rabbit_sbin())], env=env, stdout=log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()
        deadline = time.monotonic() + timeout
        while not self._accepts_amqp091():
            if self.proc.poll() is not None:
                raise RuntimeError(f"rabbitmq-server exited with {self.proc.returncode}; see {self.workdir}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"rabbitmq-server not ready after {timeout}s; see {self.workdir}")
            time.sleep(0.5)
        self.epmd_pid = self._find_epmd()

    def _accepts_amqp091(self) -> bool:
        import pika

        try:
            conn = pika.BlockingConnection(self.pika_params())
        except Exception:
            return False
        conn.close()
        return True

    def pika_params(self) -> Any:
        import pika

        return pika.ConnectionParameters("127.0.0.1", self.port, credentials=pika.PlainCredentials(USER, PASSWORD),
                                         connection_attempts=1, socket_timeout=2)

    def _find_epmd(self) -> int | None:
        for s in procstat.all_stats():
            if s.comm == "epmd" and procstat.environ(s.pid).get("ERL_EPMD_PORT") == str(self.epmd_port):
                return s.pid
        return None

    def ctl(self, *args: str, timeout: float = 120.0) -> str:
        """rabbitmqctl against this node (same HOME/cookie and epmd); raises with its output on failure."""
        cmd = [str(rabbit_sbin().parent / "rabbitmqctl"), "-n", self.nodename, *args]
        r = subprocess.run(cmd, env=self.env(), capture_output=True, text=True, timeout=timeout,
                           stdin=subprocess.DEVNULL)
        if r.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed ({r.returncode}): {(r.stdout + r.stderr)[-2000:]}")
        return r.stdout

    def pids(self) -> list[int]:
        if self.proc is None or self.proc.poll() is not None:
            return []
        return procstat.descendants(self.proc.pid)

    def beam_pids(self) -> list[int]:
        return [p for p in self.pids() if (s := procstat.read_stat(p)) is not None and s.comm.startswith("beam")]

    def stop(self, timeout: float = 30.0, stop_epmd: bool = True) -> None:
        if self.proc is not None and self.proc.poll() is None:
            # SIGTERM to the VM stops it cleanly (init:stop); the wrapper shell then exits on its own.
            for p in self.beam_pids():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p, signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        if not stop_epmd:
            return
        if self.epmd_pid is None:
            self.epmd_pid = self._find_epmd()
        if self.epmd_pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.epmd_pid, signal.SIGTERM)
            self.epmd_pid = None

    def version(self) -> str:
        return rabbit_sbin().parent.parent.name.split("-", 1)[-1]


class RabbitTarget(Target):
    """A single RabbitMQ node; `queue_type` is "classic" or "quorum" (declared via AMQP 0-9-1)."""

    def __init__(self, queue_type: str) -> None:
        self.queue_type = queue_type
        self.name = f"rabbit-{queue_type}"
        self.node: RabbitNode | None = None

    def start(self, workdir: Path) -> None:
        self.node = RabbitNode(workdir, name=self.name.replace("-", ""))
        try:
            self.node.start()
        except Exception:
            self.node.stop()
            raise

    def stop(self) -> None:
        if self.node is not None:
            self.node.stop()

    def _node(self) -> RabbitNode:
        if self.node is None:
            raise RuntimeError(f"{self.name} is not started")
        return self.node

    def client(self) -> ClientSpec:
        return ClientSpec(url=f"127.0.0.1:{self._node().port}", user=USER, password=PASSWORD)

    def address(self, queue: str) -> str:
        return f"/amq/queue/{queue}"

    def _channel_do(self, fn: Any) -> None:
        import pika

        conn = pika.BlockingConnection(self._node().pika_params())
        try:
            fn(conn.channel())
        finally:
            conn.close()

    def create_queue(self, queue: str) -> None:
        args = {"x-queue-type": self.queue_type}
        self._channel_do(lambda ch: ch.queue_declare(queue, durable=True, arguments=args))

    def delete_queue(self, queue: str, timeout: float = 5.0) -> None:
        self._channel_do(lambda ch: ch.queue_delete(queue))

    def pid_groups(self) -> dict[str, list[int]]:
        return {"node": self._node().pids()}

    def info(self) -> TargetInfo:
        return TargetInfo(kind="rabbitmq", details={"version": self._node().version(), "queue_type": self.queue_type,
                                                    "nodes": 1, "protocol": "AMQP 1.0 (rabbitmq_amqp1_0)"})


class RabbitCluster(Target):
    """Three RabbitMQ nodes clustered on loopback, one quorum queue replicated on all three (clients on node 1)."""

    def __init__(self, size: int = 3, queue_type: str = "quorum", durable_messages: bool = False) -> None:
        self.size = size
        self.queue_type = queue_type
        self.durable_messages = durable_messages  # phases send durable messages (header durable=true)
        self.name = f"rabbit-{queue_type}-{size}" + ("-durable" if durable_messages else "")
        self.nodes: list[RabbitNode] = []

    def start(self, workdir: Path) -> None:
        epmd_port, cookie = free_port(), secrets.token_hex(16).upper()
        self.nodes = [RabbitNode(workdir / self.name, name=f"node{i + 1}", epmd_port=epmd_port, cookie=cookie,
                                 nodename=f"rabbit{i + 1}x{os.getpid()}@localhost") for i in range(self.size)]
        try:
            for n in self.nodes:
                n.start()
            first = self.nodes[0]
            for n in self.nodes[1:]:
                n.ctl("stop_app")
                n.ctl("join_cluster", first.nodename)
                n.ctl("start_app")
            for n in self.nodes[1:]:
                n.ctl("await_startup", timeout=120.0)
            running = first.ctl("eval", "length(rabbit_nodes:all_running()).").strip()
            if running != str(self.size):
                raise RuntimeError(f"{self.name}: {running} nodes running in the cluster, expected {self.size}")
        except Exception:
            self.stop()
            raise

    def stop(self) -> None:
        for n in reversed(self.nodes):
            with contextlib.suppress(Exception):
                n.stop(stop_epmd=False)
        if self.nodes:
            self.nodes[0].stop()  # the shared epmd, found by its ERL_EPMD_PORT and stopped by its pid

    def _first(self) -> RabbitNode:
        if not self.nodes:
            raise RuntimeError(f"{self.name} is not started")
        return self.nodes[0]

    def client(self) -> ClientSpec:
        return ClientSpec(url=f"127.0.0.1:{self._first().port}", user=USER, password=PASSWORD)

    def address(self, queue: str) -> str:
        return f"/amq/queue/{queue}"

    def _channel_do(self, fn: Any) -> None:
        import pika

        conn = pika.BlockingConnection(self._first().pika_params())
        try:
            fn(conn.channel())
        finally:
            conn.close()

    def create_queue(self, queue: str) -> None:
        args = {"x-queue-type": self.queue_type, "x-quorum-initial-group-size": self.size}
        self._channel_do(lambda ch: ch.queue_declare(queue, durable=True, arguments=args))

    def delete_queue(self, queue: str, timeout: float = 5.0) -> None:
        self._channel_do(lambda ch: ch.queue_delete(queue))

    def pid_groups(self) -> dict[str, list[int]]:
        return {f"node-{i + 1}": n.pids() for i, n in enumerate(self.nodes)}

    def info(self) -> TargetInfo:
        return TargetInfo(kind="rabbitmq", details={"version": self._first().version(), "queue_type": self.queue_type,
                                                    "nodes": self.size, "replicas": self.size,
                                                    "durable_messages": self.durable_messages,
                                                    "protocol": "AMQP 1.0 (rabbitmq_amqp1_0)",
                                                    "clients_on": self._first().nodename})
