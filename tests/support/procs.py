"""Real broker processes for tests: start on a free port, learn the port from the event log, stop or kill."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def wait_for(pred: Callable[[], Any], timeout: float = 10.0, interval: float = 0.02, what: str = "condition") -> Any:
    """Poll `pred` until it returns something truthy; fail with `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def parse_events(text: str) -> list[dict[str, Any]]:
    """Event-log lines as dicts; a line the broker is still writing (cut short) is skipped."""
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{"):
            with contextlib.suppress(json.JSONDecodeError):
                out.append(json.loads(line))
    return out


def read_events(path: Path) -> list[dict[str, Any]]:
    return parse_events(path.read_text()) if path.exists() else []


class BrokerProcess:
    """One `ha-broker` process. `args` are extra flags."""

    def __init__(self, workdir: Path, name: str, args: list[str] | None = None, port: int = 0,
                 command: str = "ha-broker", source: Path | None = None) -> None:
        self.workdir = workdir
        self.name = name
        self.args = list(args or [])
        self.requested_port = port
        self.command = command
        self.source = source  # run `ha-broker` from this checkout instead (an older release, for upgrade tests)
        self.data_dir = workdir / name
        self.log_file = workdir / f"{name}.log"
        self.stderr_file = workdir / f"{name}.stderr"
        self.proc: subprocess.Popen[bytes] | None = None
        self.port: int | None = None

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, wait: bool = True) -> BrokerProcess:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        program = [str(BIN / self.command)]
        if self.source is not None:
            program = [str(BIN / "python"), "-c",
                       f"import sys; sys.path.insert(0, {str(self.source)!r}); from ha.main import main; main()"]
        cmd = [*program, "--host", "127.0.0.1", "--port", str(self.requested_port),
               "--name", self.name, "--data-dir", str(self.data_dir), "--log-file", str(self.log_file),
               *self.args]
        self._log_offset = self.log_file.stat().st_size if self.log_file.exists() else 0
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=open(self.stderr_file, "ab"),  # noqa: SIM115
                                     start_new_session=True)
        if wait:
            self.wait_started()
        return self

    def wait_started(self, timeout: float = 20.0) -> None:
        def started() -> int | None:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"broker {self.name} exited with {self.proc.returncode}: "
                                     f"{self.stderr_file.read_text()[-2000:]}")
            for ev in self.events(since_start=True):
                if ev.get("event") == "broker.started":
                    return int(ev["address"].rsplit(":", 1)[1])
            return None

        self.port = wait_for(started, timeout, what=f"broker {self.name} to start")
        if self.requested_port == 0:
            self.requested_port = self.port  # restart on the same port

    def events(self, since_start: bool = False) -> list[dict[str, Any]]:
        evs = read_events(self.log_file)
        if since_start and getattr(self, "_log_offset", 0):
            text = self.log_file.read_text()[self._log_offset:]
            evs = parse_events(text)
        return evs

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, sig)

    def stop(self, timeout: float = 10.0) -> int | None:
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else None
        try:
            os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.terminate()
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            return None

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


class BrokerFactory:
    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.brokers: list[BrokerProcess] = []
        self.count = 0

    def __call__(self, *args: str, name: str | None = None, start: bool = True, port: int = 0,
                 command: str = "ha-broker", source: Path | None = None) -> BrokerProcess:
        self.count += 1
        b = BrokerProcess(self.workdir, name or f"b{self.count}", list(args), port, command, source)
        self.brokers.append(b)
        if start:
            b.start()
        return b

    def cleanup(self) -> Iterator[str]:
        for b in self.brokers:
            b.kill() if b.alive else None
            yield b.name
