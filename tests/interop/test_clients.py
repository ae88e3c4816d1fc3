"""rhea (Node.js) and cli-proton-python send and receive through the broker, and meet our proton clients.

rhea lives in tests/interop/node_modules (`npm ci` in tests/interop, from package.json / package-lock.json);
cli-proton-python is a PyPI package in the virtualenv. A missing client skips its tests with the command to install it.
"""

from __future__ import annotations

import ast
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.support.amqp import connect, drain, receive, send
from tests.support.procs import BIN, BrokerProcess

pytestmark = pytest.mark.interop

HERE = Path(__file__).resolve().parent
NODE = shutil.which("node")
RHEA_SCRIPT = HERE / "rhea_client.js"
CLI_SENDER = BIN / "cli-proton-python-sender"
CLI_RECEIVER = BIN / "cli-proton-python-receiver"

needs_rhea = pytest.mark.skipif(
    NODE is None or not (HERE / "node_modules" / "rhea").is_dir(),
    reason="rhea not installed: run `npm ci` in tests/interop (needs node and npm)",
)
needs_cli = pytest.mark.skipif(
    not CLI_SENDER.exists(), reason="cli-proton-python not installed: .venv/bin/pip install cli-proton-python==1.0.5"
)


def rhea(mode: str, b: BrokerProcess, address: str, count: int) -> subprocess.CompletedProcess[str]:
    assert NODE is not None and b.port is not None
    return subprocess.run([NODE, str(RHEA_SCRIPT), mode, "127.0.0.1", str(b.port), address, str(count)],
                          capture_output=True, text=True, timeout=60, cwd=HERE)


@needs_rhea
def test_rhea_sends_and_receives(shared_broker: BrokerProcess, qname: str) -> None:
    sent = rhea("send", shared_broker, qname, 50)
    assert sent.returncode == 0, sent.stderr
    got = rhea("recv", shared_broker, qname, 50)
    assert got.returncode == 0, got.stderr
    rows = [json.loads(line) for line in got.stdout.splitlines()]
    assert rows == [{"body": f"rhea-{i}", "subject": "interop", "n": i} for i in range(50)]
    assert drain(shared_broker.url, qname) == []  # rhea accepted every message


@needs_rhea
def test_rhea_and_proton_meet(shared_broker: BrokerProcess, qname: str) -> None:
    assert rhea("send", shared_broker, qname + "-a", 5).returncode == 0
    assert receive(shared_broker.url, qname + "-a", 5) == [f"rhea-{i}" for i in range(5)]
    send(shared_broker.url, qname + "-b", ["from-proton-1", "from-proton-2"], subject="s")
    got = rhea("recv", shared_broker, qname + "-b", 2)
    assert got.returncode == 0, got.stderr
    assert [json.loads(line)["body"] for line in got.stdout.splitlines()] == ["from-proton-1", "from-proton-2"]


@needs_rhea
def test_rhea_gets_not_found_for_an_unknown_address(broker: BrokerProcess) -> None:
    r = rhea("send", broker, "no-such-queue", 1)
    assert r.returncode == 1
    assert "amqp:not-found" in r.stderr


def rhea_txn(mode: str, b: BrokerProcess, source: str, target: str, count: int) -> dict[str, Any]:
    """tests/interop/rhea_txn.js: take `count` from `source` and send `count` to `target` in one transaction."""
    assert NODE is not None and b.port is not None
    r = subprocess.run([NODE, str(HERE / "rhea_txn.js"), mode, "127.0.0.1", str(b.port), source, target, str(count)],
                       capture_output=True, text=True, timeout=60, cwd=HERE)
    assert r.returncode == 0, r.stderr
    return dict(json.loads(r.stdout.splitlines()[-1]))


@needs_rhea
def test_rhea_commits_a_transaction_of_sends_and_accepts(shared_broker: BrokerProcess, qname: str) -> None:
    url = shared_broker.url
    send(url, qname + "-in", ["a", "b", "c"])
    got = rhea_txn("commit", shared_broker, qname + "-in", qname + "-out", 2)
    # transfers answered with transactional-state (0x34), the commit accepted (0x24)
    assert got == {"declared": True, "sent": [0x34, 0x34], "discharge": 0x24, "condition": None}
    assert drain(url, qname + "-out") == ["rhea-txn-0", "rhea-txn-1"]
    assert drain(url, qname + "-in") == ["c"]


@needs_rhea
def test_rhea_rolls_back_a_transaction_of_sends_and_accepts(shared_broker: BrokerProcess, qname: str) -> None:
    url = shared_broker.url
    send(url, qname + "-in", ["a", "b"])
    got = rhea_txn("rollback", shared_broker, qname + "-in", qname + "-out", 2)
    assert got["discharge"] == 0x24
    assert drain(url, qname + "-out") == []
    c = connect(url)
    r = c.create_receiver(qname + "-in", credit=2)
    again = [r.receive(5) for _ in range(2)]
    assert [(m.body, m.delivery_count) for m in again] == [("a", 1), ("b", 1)]  # released as failed deliveries
    c.close()


def cli(tool: Path, b: BrokerProcess, address: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(tool), "--broker-url", f"127.0.0.1:{b.port}/{address}", "--log-msgs", "dict", *args],
                          capture_output=True, text=True, timeout=60)


@needs_cli
def test_cli_proton_python_sends_and_receives(shared_broker: BrokerProcess, qname: str) -> None:
    sent = cli(CLI_SENDER, shared_broker, qname, "--count", "20", "--msg-content", "cli-%d",
               "--msg-subject", "interop", "--msg-property", "origin~cli")
    assert sent.returncode == 0, sent.stderr
    got = cli(CLI_RECEIVER, shared_broker, qname, "--count", "20")
    assert got.returncode == 0, got.stderr
    msgs = [ast.literal_eval(line) for line in got.stdout.splitlines()]
    assert [m["content"] for m in msgs] == [f"cli-{i}" for i in range(20)]
    assert {m["subject"] for m in msgs} == {"interop"}
    assert {m["properties"]["origin"] for m in msgs} == {"cli"}
    assert drain(shared_broker.url, qname) == []


@needs_cli
@needs_rhea
def test_cli_proton_python_to_rhea(shared_broker: BrokerProcess, qname: str) -> None:
    sent = cli(CLI_SENDER, shared_broker, qname, "--count", "3", "--msg-content", "to-rhea-%d")
    assert sent.returncode == 0, sent.stderr
    got = rhea("recv", shared_broker, qname, 3)
    assert got.returncode == 0, got.stderr
    assert [json.loads(line)["body"] for line in got.stdout.splitlines()] == [f"to-rhea-{i}" for i in range(3)]
