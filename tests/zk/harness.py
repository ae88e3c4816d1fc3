"""A real ZooKeeper server for the tests (one per test session), and a TCP proxy to cut or black-hole one client.

The server is the Debian package ``zookeeper`` (3.8) run directly with java, with tickTime=500 so that sessions
as short as 1 s are granted.  Readiness is probed with the ``srvr`` four-letter word.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

ZOOKEEPER_JAR = Path("/usr/share/java/zookeeper.jar")
CLASSPATH = f"{ZOOKEEPER_JAR}:/usr/share/java/slf4j-simple.jar"
MAIN_CLASS = "org.apache.zookeeper.server.ZooKeeperServerMain"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def wait_until(predicate: Callable[[], bool], timeout: float, what: str, interval: float = 0.02) -> float:
    """Poll ``predicate`` until it holds; returns the seconds it took.  Fails the test after ``timeout``."""
    start = time.monotonic()
    deadline = start + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)
    return time.monotonic() - start


def ensure_installed() -> None:
    if ZOOKEEPER_JAR.exists():
        return
    subprocess.run(["apt-get", "install", "-y", "-q", "zookeeper"], check=True, capture_output=True)


class ZooKeeperServer:
    """One standalone ZooKeeper server on 127.0.0.1, data kept across `restart`."""

    def __init__(self, workdir: Path, port: int | None = None) -> None:
        self.workdir = workdir
        self.port = port or free_port()
        self.process: subprocess.Popen[bytes] | None = None
        self.log_path = workdir / "zookeeper.log"

    @property
    def hosts(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def _write_config(self) -> Path:
        data_dir = self.workdir / "data"
        data_dir.mkdir(parents=True, exist_ok=True)
        config = self.workdir / "zoo.cfg"
        config.write_text(
            "\n".join(
                [
                    "tickTime=500",
                    "minSessionTimeout=1000",
                    "maxSessionTimeout=60000",
                    f"dataDir={data_dir}",
                    f"clientPort={self.port}",
                    "clientPortAddress=127.0.0.1",
                    "admin.enableServer=false",
                    "4lw.commands.whitelist=srvr",
                    "",
                ]
            )
        )
        return config

    def start(self, timeout: float = 30.0) -> None:
        config = self._write_config()
        log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            ["java", "-Xmx256m", "-cp", CLASSPATH, MAIN_CLASS, str(config)],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=self.workdir,
            start_new_session=True,
        )
        log.close()
        wait_until(self.answers_srvr, timeout, f"ZooKeeper to answer srvr on {self.hosts}", interval=0.1)

    def answers_srvr(self) -> bool:
        if not self.running:
            raise AssertionError(f"ZooKeeper exited; log tail:\n{self.log_tail()}")
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                s.sendall(b"srvr")
                reply = s.recv(4096)
        except OSError:
            return False
        return b"Mode: standalone" in reply

    def stop(self) -> None:
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def log_tail(self, lines: int = 40) -> str:
        if not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def remove_data(self) -> None:
        shutil.rmtree(self.workdir / "data", ignore_errors=True)


class TcpProxy:
    """Forwards 127.0.0.1:<port> to the server, so a test can cut one client's connection or black-hole it.

    - `cut()`: close every forwarded connection (as when a process dies: the peer sees the socket close).
    - `blackhole()`: keep connections open but drop every byte, and refuse new ones (a network partition:
      nobody learns anything until timeouts fire).  `heal()` ends both.
    """

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._blocked = threading.Event()
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while not self._closed:
            try:
                downstream, _ = self._listener.accept()
            except OSError:
                return
            if self._blocked.is_set():
                downstream.close()
                continue
            try:
                upstream = socket.create_connection(("127.0.0.1", self.upstream_port), timeout=2)
            except OSError:
                downstream.close()
                continue
            with self._lock:
                self._sockets += [downstream, upstream]
            for src, dst in ((downstream, upstream), (upstream, downstream)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                if not self._blocked.is_set():
                    dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.close()

    def cut(self) -> None:
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for s in sockets:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                s.close()

    def blackhole(self) -> None:
        self._blocked.set()

    def heal(self) -> None:
        self._blocked.clear()

    def close(self) -> None:
        self._closed = True
        self.cut()
        with contextlib.suppress(OSError):
            self._listener.close()


def java_available() -> bool:
    return shutil.which("java") is not None and os.access(shutil.which("java") or "", os.X_OK)
