"""`understudy-cluster`: a primary and backups on this machine, with an embedded manager.

The manager is the simplest external coordinator: it promotes the first broker of a brand-new cluster, watches the
primary, and when it dies promotes the most current *ready* backup (highest epoch, then position), then restarts the
dead broker as a backup. It needs no Pacemaker and no ZooKeeper; it is for development and demos on one host.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click
from rich.console import Console

from broker.client import ManagementClient, ManagementError
from ha import protocol as P
from ha.core.epoch import Rank, best_candidate
from ha.status_cli import collect, render

BIN = Path(sys.executable).parent


@dataclass
class Member:
    name: str
    port: int
    data_dir: Path
    args: list[str]
    proc: subprocess.Popen[bytes] | None = None
    status: dict[str, Any] | None = field(default=None)

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.data_dir / "broker.log", "ab")  # noqa: SIM115 - the child keeps it
        self.proc = subprocess.Popen(
            [str(BIN / "ha-broker"), "--host", "127.0.0.1", "--port", str(self.port), "--name", self.name,
             "--data-dir", str(self.data_dir), "--log-file", str(self.data_dir / "events.log"),
             "--pid-file", str(self.data_dir / "broker.pid"), *self.args],
            stdout=log, stderr=log, start_new_session=True)

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def poll_status(self, timeout: float) -> dict[str, Any] | None:
        if not self.alive:
            self.status = None
            return None
        try:
            with ManagementClient(self.url, timeout=timeout) as c:
                r = c.request("STATUS", P.MGMT_TYPE)
                self.status = r.body if r.ok else None
        except (ManagementError, OSError):
            self.status = None
        return self.status

    def stop(self) -> None:
        if self.alive:
            assert self.proc is not None
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()


class Manager:
    def __init__(self, members: list[Member], echo: bool = True) -> None:
        self.members = members
        self.echo = echo

    def say(self, text: str) -> None:
        if self.echo:
            click.echo(f"[manager] {text}", err=True)

    def step(self, timeout: float = 1.0) -> None:
        """One turn: look at every member, promote if there is no primary, restart the dead."""
        for m in self.members:
            m.poll_status(timeout)
        if any(m.status and m.status["role"] == "primary" for m in self.members):
            self._restart_dead()
            return
        ready = [(m.name, Rank(m.status["epoch"], m.status["position"])) for m in self.members
                 if m.status and m.status["state"] == "ready"]
        fresh = [m for m in self.members if m.status and m.status["epoch"] == 0 and m.status["state"] == "joining"]
        name = best_candidate(ready)
        force = False
        if name is None and len(fresh) == len(self.members):
            name = fresh[0].name  # brand-new cluster: nobody holds anything yet
        elif name is None and all(m.status and m.status["state"] == "joining" for m in self.members):
            # Every broker restarted (./run.sh again): all answer, none is ready. The most current one holds
            # everything any of them holds (the runbook's total-outage recovery, done for the local cluster).
            name = best_candidate([(m.name, Rank(m.status["epoch"], m.status["position"]))
                                   for m in self.members if m.status])
            force = True
        if name is None:
            return
        target = next(m for m in self.members if m.name == name)
        try:
            with ManagementClient(target.url, timeout=5) as c:
                r = c.request("PROMOTE", P.MGMT_TYPE, body={"force": True} if force else {})
            self.say(f"promoted {name}: {r.description}" if r.ok else f"promotion of {name} refused: {r.description}")
        except ManagementError as e:
            self.say(f"promotion of {name} failed: {e}")

    def _restart_dead(self) -> None:
        for m in self.members:
            if not m.alive:
                self.say(f"{m.name} is down: restarting it as a backup")
                m.start()


@click.command()
@click.option("--brokers", "-n", default=3, show_default=True, help="how many brokers (1 primary + backups)")
@click.option("--base-port", default=5672, show_default=True, help="first broker's port; the others follow")
@click.option("--data-dir", type=click.Path(path_type=Path), default=Path(".understudy"), show_default=True)
@click.option("--heartbeat", default=1.0, show_default=True, help="HA heartbeat seconds")
@click.option("--status-every", default=10.0, show_default=True, help="print ha-status every SECONDS (0: never)")
@click.option("--once", is_flag=True, help="start, wait until every backup is ready, print status, stop")
def main(brokers: int, base_port: int, data_dir: Path, heartbeat: float, status_every: float, once: bool) -> None:
    """Run a local Understudy cluster on 127.0.0.1 until Ctrl-C."""
    ports = [base_port + i for i in range(brokers)]
    url = ",".join(f"127.0.0.1:{p}" for p in ports)
    # Auto-created queues: a demo client can send to any address (see the README's quickstart).
    args = ["--ha-cluster", "--ha-brokers-url", url, "--ha-heartbeat", str(heartbeat), "--ha-public-url", url,
            "--auto-create-queues"]
    members = [Member(f"broker{i + 1}", p, data_dir / f"broker{i + 1}", args) for i, p in enumerate(ports)]
    for m in members:
        m.start()
    mgr = Manager(members)
    stopping = False

    def stop(*_: Any) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    click.echo(f"Understudy cluster starting: clients connect to {url}", err=True)
    click.echo(f"  event logs: {data_dir}/broker*/events.log;  pids: {data_dir}/broker*/broker.pid;  "
               f"status: ha-status --broker {members[0].url} -w 1", err=True)
    last_status = 0.0
    announced = False
    deadline = time.monotonic() + 60
    try:
        while not stopping:
            mgr.step()
            all_ready = all(m.status and m.status["state"] in ("active", "ready") for m in members)
            if all_ready and not announced:
                announced = True
                click.echo(f"\nREADY: clients use the URL list {url}\n", err=True)
            now = time.monotonic()
            if (all_ready and status_every and now - last_status >= status_every) or (all_ready and once):
                last_status = now
                primary = next((m for m in members if m.status and m.status["role"] == "primary"), members[0])
                try:
                    Console(stderr=True, width=120).print(render(collect(primary.url, False, 5.0, None, None)))
                except ManagementError as e:
                    click.echo(f"ha-status: {e}", err=True)
            if once and (all_ready or now > deadline):
                if not all_ready:
                    click.echo("cluster did not become ready within 60 s", err=True)
                    sys.exit(1)
                break
            time.sleep(0.5)
    finally:
        click.echo("stopping brokers", err=True)
        for m in members:
            m.stop()
