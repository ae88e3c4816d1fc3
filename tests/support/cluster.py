"""A local HA cluster of real `ha-broker` processes on loopback, for tests."""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
from pathlib import Path
from typing import Any

from broker.client import ManagementClient, ManagementError
from tests.support.procs import BIN, BrokerFactory, BrokerProcess, wait_for


def free_ports(n: int) -> list[int]:
    socks = []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def free_port_run(n: int) -> int:
    """The first of `n` consecutive ports free now, below the kernel's ephemeral range: there no outgoing connection
    takes one of them before a broker listens on it (picking one free port there and assuming the next ones free
    failed when an outgoing connection held the second: "Address already in use")."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    rng = random.Random()
    for _ in range(200):
        base = rng.randrange(10000, low - n)
        socks: list[socket.socket] = []
        try:
            for port in range(base, base + n):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError(f"no {n} consecutive free ports below {low}")


class Cluster:
    @classmethod
    def of(cls, brokers: list[BrokerProcess]) -> Cluster:
        """The helpers of a cluster over brokers made elsewhere (e.g. some from an older release)."""
        c = cls.__new__(cls)
        c.brokers = list(brokers)
        return c

    def __init__(self, factory: BrokerFactory, n: int, extra: list[str], heartbeat: float = 1.0) -> None:
        self.factory = factory
        self.ports = free_ports(n)
        self.brokers_url = ",".join(f"127.0.0.1:{p}" for p in self.ports)
        self.extra = extra
        self.heartbeat = heartbeat
        self.brokers: list[BrokerProcess] = []
        for i, p in enumerate(self.ports):
            self.brokers.append(factory(*self.args(), name=f"b{i + 1}", port=p, start=False))

    def args(self) -> list[str]:
        return ["--ha-cluster", "--ha-brokers-url", self.brokers_url, "--ha-heartbeat", str(self.heartbeat),
                "--ha-backup-timeout", "5", *self.extra]

    def start(self, *which: int) -> None:
        for i in which or range(len(self.brokers)):
            self.brokers[i].start()

    def kill_all_at_once(self) -> None:
        """SIGKILL every running broker in one tight loop (no broker sees another go first), then reap them."""
        pids = [b.proc.pid for b in self.brokers if b.proc is not None and b.alive]
        for pid in pids:
            os.killpg(pid, signal.SIGKILL)
        for b in self.brokers:
            if b.proc is not None:
                b.proc.wait(10)

    def __getitem__(self, i: int) -> BrokerProcess:
        return self.brokers[i]

    @property
    def urls(self) -> list[str]:
        return [b.url for b in self.brokers]

    @staticmethod
    def status(b: BrokerProcess, timeout: float = 5.0) -> dict[str, Any]:
        with ManagementClient(b.url, timeout=timeout) as m:
            body: dict[str, Any] = m.call("STATUS", "ha-broker").body
            return body

    @staticmethod
    def try_status(b: BrokerProcess) -> dict[str, Any] | None:
        try:
            return Cluster.status(b, timeout=2.0)
        except (ManagementError, OSError):
            return None

    @staticmethod
    def admin(b: BrokerProcess, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(BIN / "ha-admin"), "--broker", b.url, *args], capture_output=True, text=True,
                              timeout=30)

    def promote(self, i: int, *args: str) -> None:
        r = self.admin(self.brokers[i], "promote", *args)
        assert r.returncode == 0, r.stderr

    def wait_state(self, i: int, *states: str, timeout: float = 20.0) -> dict[str, Any]:
        def check() -> dict[str, Any] | None:
            st = self.try_status(self.brokers[i])
            return st if st is not None and st["state"] in states else None

        result: dict[str, Any] = wait_for(check, timeout, 0.05, what=f"b{i + 1} in {states}")
        return result

    def start_with_primary(self, primary: int = 0) -> None:
        """Start every broker, promote one, wait until all others are ready."""
        self.start()
        self.promote(primary)
        self.wait_state(primary, "active")
        for i in range(len(self.brokers)):
            if i != primary:
                self.wait_state(i, "ready")

    def queue_bodies(self, i: int, queue: str) -> list[Any]:
        """Bodies on a queue of any broker (backups included), in position order, without consuming."""
        return [b for _, b in self.queue_entries(i, queue)]

    def queue_entries(self, i: int, queue: str) -> list[tuple[int, Any]]:
        return browse(self.brokers[i].url, queue)


def browse(url: str, queue: str) -> list[tuple[int, Any]]:
    """(position, body) of every message on `queue` of any broker (backups included), oldest first, page by page
    through the `ha-broker` BROWSE operation; [] if there is no such queue."""
    out: list[tuple[int, Any]] = []
    after = 0
    with ManagementClient(url, timeout=60) as m:
        while True:
            r = m.request("BROWSE", "ha-broker", queue, {"after": after})
            if r.status == 404:
                return []
            assert r.ok, r.description
            out.extend(zip(r.body["positions"], r.body["bodies"], strict=True))
            if not r.body["more"]:
                return out
            after = out[-1][0]


def kill(b: BrokerProcess) -> None:
    b.kill()


def path_of(b: BrokerProcess) -> Path:
    return b.data_dir
