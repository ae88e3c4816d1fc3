"""`proton-c-broker`: the proton-C example broker (Debian `libqpid-proton11-dev-examples`) as the engine-limit baseline.

Compiled unchanged by the bench (bench.native) from examples/c/broker.c + thread.h. What it is, from its source:
one process, 4 proactor threads; a queue per address, created on first use by a link's target or source address
(so the clients' address is the bare queue name and `create_queue` has nothing to do); messages are held in
memory as the received bytes; every incoming transfer is accepted and settled at once, with receiver credit 5 per
publisher link topped up after each message; messages go out pre-settled (at most once), one per link per credit
or wake-up; SASL ANONYMOUS only; no management, so queues are never deleted (each phase uses a fresh name and the
broker is stopped at the end of the target). Its process's CPU is the broker CPU.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import time
from pathlib import Path

from bench import native
from bench.targets import ClientSpec, Target, TargetInfo


class ProtonCBroker(Target):
    name = "proton-c-broker"

    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0
        self.workdir: Path | None = None

    def start(self, workdir: Path) -> None:
        binary = native.c_broker()
        self.workdir = workdir / self.name
        self.workdir.mkdir(parents=True, exist_ok=True)
        out = self.workdir / "stdout.log"
        with open(out, "wb") as f:
            # port 0: the broker prints "listening on PORT"; cwd has no ssl-certs/, so it says it cannot load
            # them and serves plain AMQP (the bench never uses TLS)
            self.proc = subprocess.Popen([str(binary), "127.0.0.1", "0"], cwd=self.workdir, stdout=f,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 30
        while True:
            port = listening_port(out.read_text(errors="replace"))
            if port:
                self.port = port
                return
            if self.proc.poll() is not None or time.monotonic() > deadline:
                text = out.read_text(errors="replace")[-2000:]
                self.stop()
                raise RuntimeError(f"proton-c-broker did not start: {text}")
            time.sleep(0.05)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    self.proc.kill()
                self.proc.wait(10)

    def client(self) -> ClientSpec:
        if not self.port:
            raise RuntimeError(f"{self.name} is not started")
        return ClientSpec(url=f"127.0.0.1:{self.port}")

    def address(self, queue: str) -> str:
        return queue

    def create_queue(self, queue: str) -> None:
        pass  # created by the first link that names it

    def delete_queue(self, queue: str, timeout: float = 5.0) -> None:
        pass  # no management: messages left in a queue stay until the broker stops

    def pid_groups(self) -> dict[str, list[int]]:
        alive = self.proc is not None and self.proc.poll() is None
        return {"broker": [self.proc.pid] if alive and self.proc else []}

    def info(self) -> TargetInfo:
        return TargetInfo(kind="proton-c", details={"version": native.proton_version(),
                                                    "source": str(native.example_dir() / "broker.c"),
                                                    "threads": 4, "delivery": "pre-settled to consumers"})


def listening_port(text: str) -> int:
    """The port from the broker's "listening on PORT" line, 0 if not there yet (pure)."""
    for line in text.splitlines():
        if line.startswith("listening on "):
            tail = line.split()[-1]
            if tail.isdigit():
                return int(tail)
    return 0
