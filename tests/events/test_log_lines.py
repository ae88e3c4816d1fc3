"""Every line of the event log is a catalogued JSON event, including what libraries write through stdlib `logging`.

Both tests run real processes (the logging configuration is process-wide): a small Python program that logs through
every path of broker/log.py, and an `ha-broker` whose kazoo client cannot reach ZooKeeper (kazoo then warns through
stdlib logging several times a second), rotated with SIGHUP.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

from broker import events
from tests.support.procs import BrokerProcess, wait_for

ROOT = Path(__file__).resolve().parents[2]


def strict_lines(path: Path) -> list[dict[str, Any]]:
    """Every line of `path` as a catalogued event; fails on the first line that is not one."""
    out = []
    text = path.read_text()
    assert text.endswith("\n"), f"{path.name}: last line cut short: {text[-200:]!r}"
    for n, line in enumerate(text.splitlines(), 1):
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            raise AssertionError(f"{path.name}:{n} is not JSON: {line!r}") from None
        assert isinstance(record, dict), f"{path.name}:{n}: {line!r}"
        assert events.check(record) == [], f"{path.name}:{n}: {events.check(record)}: {line!r}"
        out.append(record)
    return out


PROGRAM = textwrap.dedent("""
    import logging, sys, warnings
    from pathlib import Path
    from broker import log

    log.configure("p1", "info", Path(sys.argv[1]))
    kazoo = logging.getLogger("kazoo.client")
    kazoo.warning("Connection dropped: %s", "socket connection error: Connection refused")
    try:
        1 / 0
    except ZeroDivisionError:
        kazoo.exception("callback failed")
    chatty = logging.getLogger("chatty")
    chatty.setLevel(logging.DEBUG)
    chatty.info("below warning: not logged")  # a library logger with its own lower level
    chatty.log(35, "a custom level")
    chatty.critical("stack", stack_info=True)
    chatty.error("bad format %d", "not a number")
    warnings.warn("a deprecation", DeprecationWarning, stacklevel=1)
    warnings.simplefilter("always")
    warnings.warn("a user warning", UserWarning, stacklevel=1)
    log.get_logger("broker").info("broker.stopped")
    log.fast.info("queue.expired", {"queue": "q", "count": 2})
    log.fast.flush()
""")


def test_stdlib_logging_becomes_catalogued_python_log_events(tmp_path: Path) -> None:
    path = tmp_path / "p1.log"
    done = subprocess.run([sys.executable, "-c", PROGRAM, str(path)], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stderr == "", "nothing may bypass the log: " + done.stderr
    lines = strict_lines(path)
    library = [r for r in lines if r["event"] == "python.log"]
    by_message = {r["message"]: r for r in library}
    dropped = by_message["Connection dropped: socket connection error: Connection refused"]
    assert (dropped["level"], dropped["logger"], dropped["broker"]) == ("warning", "kazoo.client", "p1")
    failed = by_message["callback failed"]
    assert failed["level"] == "error" and "ZeroDivisionError" in failed["exception"]
    assert by_message["a custom level"]["level"] == "warning"
    assert by_message["stack"]["level"] == "critical" and "Stack (most recent call last)" in by_message["stack"]["exception"]
    assert [m for m in by_message if m.startswith("unformattable log record 'bad format %d'")], by_message
    assert [r["logger"] for r in library if "a user warning" in r["message"]] == ["py.warnings"]
    assert not [m for m in by_message if "below warning" in m]
    assert [r["event"] for r in lines if r["event"] != "python.log"] == ["broker.stopped", "queue.expired"]


def test_a_broker_with_kazoo_warning_writes_only_json_events_and_reopens_its_log_on_sighup(tmp_path: Path) -> None:
    # ZooKeeper at a closed port: kazoo warns ("Connection dropped") on every retry, from its own thread.
    broker = BrokerProcess(tmp_path, "z1", ["--ha-cluster", "--ha-brokers-url", "127.0.0.1:1",
                                           "--ha-coordinator", "zookeeper", "--zk-hosts", "127.0.0.1:1"])
    broker.start()
    try:
        def kazoo_lines(path: Path) -> int:
            return sum('"logger": "kazoo.client"' in line for line in path.read_text().splitlines())

        wait_for(lambda: kazoo_lines(broker.log_file) >= 2, 10, what="kazoo's warnings in the log")
        rotated = tmp_path / "z1.log.1"
        os.rename(broker.log_file, rotated)
        broker.signal(signal.SIGHUP)
        wait_for(broker.log_file.exists, 5, what="the log file reopened after SIGHUP")
        wait_for(lambda: kazoo_lines(broker.log_file) >= 1, 10, what="kazoo's warnings in the new log")
        assert broker.alive, "SIGHUP must not stop the broker"
    finally:
        assert broker.stop() == 0
    old, new = strict_lines(rotated), strict_lines(broker.log_file)
    assert old[0]["event"] == "journal.recovered" and "broker.started" in [r["event"] for r in old]
    assert new[0]["event"] == "broker.log.reopened" and new[0]["path"] == str(broker.log_file)
    assert new[-1]["event"] == "broker.stopped"
    kazoo = [r for r in old + new if r["event"] == "python.log"]
    assert {(r["level"], r["logger"]) for r in kazoo} == {("warning", "kazoo.client")}
    assert (tmp_path / "z1.stderr").read_text() == ""
