"""The README's quickstart, run as written (ports and the data directory moved out of the way): a local cluster from
`understudy-cluster`, 100 messages sent with cli-proton-python, the primary killed, the 100 read from its successor."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from tests.support.cluster import free_port_run
from tests.support.procs import BIN, ROOT, wait_for


def quickstart_commands() -> list[str]:
    """The shell lines of the README's quickstart section (comments dropped, `. .venv/bin/activate` skipped)."""
    text = (ROOT / "README.md").read_text()
    section = text.split("### Quickstart", 1)[1].split("\n## ", 1)[0]
    lines = []
    for block in re.findall(r"```sh\n(.*?)```", section, re.S):
        for line in block.splitlines():
            line = re.sub(r"\s+#.*$", "", line).strip()
            if line and not line.startswith(". .venv/bin/activate"):
                lines.append(line)
    return lines


def test_readme_quickstart_messages_survive_the_primary(tmp_path: Path) -> None:
    base = free_port_run(3)
    data = tmp_path / "cluster"

    def local(line: str) -> str:
        for port in (5674, 5673, 5672):
            line = line.replace(f"127.0.0.1:{port}", f"127.0.0.1:{base + port - 5672}")
        return line.replace(".understudy/", f"{data}/")

    commands = [local(c) for c in quickstart_commands()]
    watch, send, kill, receive = commands  # the README's four commands, in order
    assert watch == "ha-status -w 1" and send.startswith("cli-proton-python-sender") and kill.startswith("kill -9")
    assert receive.startswith("cli-proton-python-receiver")
    env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}"}
    log = (tmp_path / "cluster.err").open("wb")
    cluster = subprocess.Popen([str(BIN / "understudy-cluster"), "--base-port", str(base), "--data-dir", str(data),
                                "--status-every", "0"], stdout=log, stderr=subprocess.STDOUT)

    def sh(line: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["bash", "-c", line], capture_output=True, text=True, timeout=timeout, env=env)

    watcher: subprocess.Popen[bytes] | None = None
    try:
        wait_for(lambda: b"READY" in (tmp_path / "cluster.err").read_bytes(), 90, 0.2, "the cluster is ready")
        seen = tmp_path / "watch.out"
        watcher = subprocess.Popen(["bash", "-c", f"exec {watch} --broker 127.0.0.1:{base}"],
                                   stdout=seen.open("wb"), stderr=subprocess.STDOUT, env=env)
        wait_for(lambda: "primary broker1" in seen.read_text(), 30, 0.2, "the watch shows broker1 primary")
        r = sh(send)
        assert r.returncode == 0 and "ERROR" not in r.stdout + r.stderr, r.stdout + r.stderr
        r = sh(kill)
        assert r.returncode == 0, r.stderr
        wait_for(lambda: sh(f"ha-status --broker 127.0.0.1:{base + 1} --is-primary").returncode == 0, 30, 0.3,
                 "broker2 promoted")
        r = sh(receive)
        assert r.returncode == 0, r.stderr
        assert r.stdout.split("\n")[:100] == [f"order {n}" for n in range(100)], r.stdout[-2000:]
        # The watch showed broker1 primary, then (asking another broker once broker1 was gone) broker2.
        wait_for(lambda: "primary broker2" in seen.read_text(), 20, 0.2, "the watch shows broker2 primary")
    finally:
        if watcher is not None:
            watcher.terminate()
            watcher.wait(10)
        cluster.terminate()
        try:
            cluster.wait(30)
        except subprocess.TimeoutExpired:
            cluster.kill()
        log.close()
