"""Our broker (`ha-broker`) as benchmark targets: standalone, or replicated (primary + N backups); each also as a
durable variant (`durable=True`): its queues are created with the queue argument `{"durable": true}` (journaled under
`--data-dir`) and every phase sends it messages with the AMQP durable header.

Readiness is read from the broker's JSON event log (`broker.started` carries the listening address), so a broker
started with `--port 0` is found without guessing ports. The log is appended to across restarts of the same broker:
`log_size()` before a restart and `wait_event(..., after=offset)` find the new process's events only.
"""

from __future__ import annotations

import contextlib
import functools
import json
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from bench import procstat
from bench.targets import ClientSpec, Target, TargetInfo, free_port

BIN = Path(sys.executable).parent


class BrokerProc:
    """One `ha-broker` process with its own data dir and event log under `workdir`."""

    def __init__(self, workdir: Path, name: str, port: int, extra: list[str] | None = None) -> None:
        self.name = name
        self.port = port
        self.data_dir = workdir / name
        self.log_file = workdir / f"{name}.log"
        self.stderr_file = workdir / f"{name}.stderr"
        self.extra = list(extra or [])
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        cmd = [str(BIN / "ha-broker"), "--host", "127.0.0.1", "--port", str(self.port), "--name", self.name,
               "--data-dir", str(self.data_dir), "--log-file", str(self.log_file), *self.extra]
        with open(self.stderr_file, "ab") as err:
            self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)

    def log_size(self) -> int:
        """Bytes in the event log so far (events of a later start come after this offset)."""
        return self.log_file.stat().st_size if self.log_file.exists() else 0

    def wait_event(self, event: str, timeout: float = 30.0, after: int = 0) -> dict[str, object]:
        """The first `event` in the log after byte offset `after`; raises if the broker exits or after `timeout`."""
        deadline = time.monotonic() + timeout
        while True:
            if self.proc is None or self.proc.poll() is not None:
                tail = self.stderr_file.read_text()[-2000:] if self.stderr_file.exists() else ""
                raise RuntimeError(f"ha-broker {self.name} exited: {tail}")
            if self.log_file.exists():
                with open(self.log_file, "rb") as f:
                    f.seek(after)
                    text = f.read().decode("utf-8", "replace")
                for line in text.splitlines():
                    if line.startswith("{") and f'"{event}"' in line:
                        with contextlib.suppress(json.JSONDecodeError):
                            ev = json.loads(line)
                            if ev.get("event") == event:
                                return dict(ev)
            if time.monotonic() > deadline:
                raise RuntimeError(f"ha-broker {self.name}: no {event} after {timeout}s")
            time.sleep(0.05)

    def pids(self) -> list[int]:
        if self.proc is None or self.proc.poll() is not None:
            return []
        return procstat.descendants(self.proc.pid)

    def kill(self) -> None:
        """SIGKILL (no clean shutdown: the journal is what a crash leaves) and reap."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.kill()
        self.proc.wait(30)

    def stop(self, timeout: float = 15.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


def durable_name(name: str, durable: bool) -> str:
    return f"{name}-durable" if durable else name


class OursStandalone(Target):
    """One `ha-broker`, no replication (`durable`: durable queues and durable messages)."""

    name = "ours"
    broker_parts = True

    def __init__(self, extra_args: list[str] | None = None, durable: bool = False) -> None:
        self.extra_args = list(extra_args or [])
        self.broker: BrokerProc | None = None
        self.durable = durable
        self.durable_messages = durable
        self.name = durable_name("ours", durable)

    def start(self, workdir: Path) -> None:
        self.broker = BrokerProc(workdir / self.name, f"bench-{self.name}", free_port(), self.extra_args)
        self.broker.start()
        try:
            self.broker.wait_event("broker.started")
        except Exception:
            self.broker.stop()
            raise

    def restart(self, kill: bool = False, wipe: bool = False, extra: list[str] | None = None) -> int:
        """Stop the broker (SIGKILL when `kill`, else SIGTERM), optionally wipe its data dir, start it again on the
        same port with `extra` flags added to the target's (None: the flags of the last start). Returns at once with
        the log offset of the new process's events (`BrokerProc.wait_event(after=...)`)."""
        if self.broker is None:
            raise RuntimeError(f"{self.name} is not started")
        b = self.broker
        if kill:
            b.kill()
        else:
            b.stop()
        if wipe:
            shutil.rmtree(b.data_dir, ignore_errors=True)
        if extra is not None:
            b.extra = [*self.extra_args, *extra]
        offset = b.log_size()
        b.start()
        return offset

    def stop(self) -> None:
        if self.broker is not None:
            self.broker.stop()

    def _url(self) -> str:
        if self.broker is None:
            raise RuntimeError(f"{self.name} is not started")
        return self.broker.url

    def client(self) -> ClientSpec:
        return ClientSpec(url=self._url())

    def address(self, queue: str) -> str:
        return queue

    def create_queue(self, queue: str) -> None:
        from broker.client import ManagementClient

        with ManagementClient(self._url()) as m:
            m.call("CREATE", "queue", queue, {"durable": True} if self.durable else {})

    def queue_depth(self, queue: str, timeout: float = 5.0) -> int:
        from broker.client import ManagementClient

        with ManagementClient(self._url(), timeout=timeout) as m:
            return int(m.call("READ", "queue", queue).body["depth"])

    def delete_queue(self, queue: str, timeout: float = 5.0) -> None:
        from broker.client import ManagementClient

        with ManagementClient(self._url(), timeout=timeout) as m:
            m.call("DELETE", "queue", queue)

    def pid_groups(self) -> dict[str, list[int]]:
        return {"broker": self.broker.pids() if self.broker else []}

    def info(self) -> TargetInfo:
        from broker import __version__

        return TargetInfo(kind="understudy", details={"version": __version__, "replication": "none",
                                                      "durable": self.durable, "python": sys.version.split()[0]})


class OursReplicated(OursStandalone):
    """A primary plus `backups` ready backups (`--ha-cluster`), clients on the primary.

    Broker CPU is reported per role ("primary", "backup-1", ...) and summed: the per-message figure is the cost of
    the whole replicated set. A queue is created on the primary and the phase starts only once every backup has it.
    """

    def __init__(self, backups: int, extra_args: list[str] | None = None, durable: bool = False) -> None:
        super().__init__(extra_args, durable)
        self.backups = backups
        self.name = durable_name(f"ours-replicated-{backups}", durable)
        self.members: list[BrokerProc] = []

    def start(self, workdir: Path) -> None:
        ports = [free_port() for _ in range(self.backups + 1)]
        flags = ["--ha-cluster", "--ha-brokers-url", ",".join(f"127.0.0.1:{p}" for p in ports), *self.extra_args]
        self.members = [BrokerProc(workdir / self.name, f"{self.name}-b{i}", p, flags) for i, p in enumerate(ports)]
        self.broker = self.members[0]
        try:
            for b in self.members:
                b.start()
            for b in self.members:
                b.wait_event("broker.started")
            subprocess.run([str(BIN / "ha-admin"), "--broker", self.members[0].url, "promote"], check=True,
                           capture_output=True, timeout=60)
            _wait_state(self.members[0].url, "active")
            for b in self.members[1:]:
                _wait_state(b.url, "ready")
        except Exception:
            self.stop()
            raise

    def stop(self) -> None:
        for b in reversed(self.members):
            b.stop()

    def create_queue(self, queue: str) -> None:
        super().create_queue(queue)
        for b in self.members[1:]:
            if b.pids():  # a stopped backup (catch-up phase) gets the queue when it rejoins
                _wait_until(functools.partial(_has_queue, b.url, queue), f"{queue} on backup {b.name}")

    def pid_groups(self) -> dict[str, list[int]]:
        return {("primary" if i == 0 else f"backup-{i}"): b.pids() for i, b in enumerate(self.members)}

    def stop_backup(self, i: int) -> None:
        """Stop backup `i` (1-based) and wipe its data: its next start is a new, empty backup (full catch-up)."""
        b = self.members[i]
        b.stop()
        shutil.rmtree(b.data_dir, ignore_errors=True)

    def start_backup(self, i: int) -> BrokerProc:
        """Start backup `i` again (same name and port); returns at once, the caller watches its state."""
        b = self.members[i]
        b.start()
        return b

    def info(self) -> TargetInfo:
        i = super().info()
        i.details["replication"] = f"primary + {self.backups} backup(s)"
        return i


def _wait_until(pred: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


def _ha_state(url: str) -> str | None:
    from broker.client import ManagementClient, ManagementError

    try:
        with ManagementClient(url, timeout=5.0) as m:
            return str(m.call("STATUS", "ha-broker").body["state"])
    except (ManagementError, OSError, KeyError):
        return None


def _wait_state(url: str, state: str) -> None:
    _wait_until(lambda: _ha_state(url) == state, f"{url} to be {state}")


def _has_queue(url: str, queue: str) -> bool:
    from broker.client import ManagementClient, ManagementError

    try:
        with ManagementClient(url, timeout=5.0) as m:
            return m.request("READ", "queue", queue).status == 200
    except (ManagementError, OSError):
        return False
