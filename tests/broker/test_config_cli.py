"""`ha-broker` configuration and lifecycle: --validate-config, config files, SIGTERM, the kept broker id."""

from __future__ import annotations

import contextlib
import signal
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner
from proton import Message
from proton.utils import ConnectionClosed, LinkDetached

from broker.cli import make_command
from tests.support.amqp import connect, mgmt, receive, send
from tests.support.procs import BIN, BrokerFactory, BrokerProcess, read_events, wait_for

HA_BROKER = str(BIN / "ha-broker")


def validate(*args: str) -> subprocess.CompletedProcess[str]:
    """The installed console script, in its own process."""
    return subprocess.run([HA_BROKER, *args, "--validate-config"], capture_output=True, text=True, timeout=60)


def validate_in_process(*args: str) -> subprocess.CompletedProcess[str]:
    """The same command object in this process (a process start costs a second or two on a loaded machine)."""
    r = CliRunner().invoke(make_command([]), [*args, "--validate-config"])
    return subprocess.CompletedProcess(args, r.exit_code, r.stdout, r.stderr)


GOOD_TOML = """
host = "127.0.0.1"
port = 5799
log-level = "warning"
auto-create-queues = true
max-message-size = 65536
sasl-mechanisms = "ANONYMOUS PLAIN"
credit-window = 100
ha-replicate = "configuration"
"""


def test_good_flags_and_good_file_validate(tmp_path: Path) -> None:
    r = validate("--port", "5799", "--log-level", "debug", "--max-message-size", "2048", "--auto-create-queues",
                 "--sasl-mechanisms", "ANONYMOUS", "--name", "b-1.x@y", "--data-dir", str(tmp_path / "d"))
    assert (r.returncode, r.stdout.strip()) == (0, "configuration OK"), r.stderr
    cfg = tmp_path / "broker.toml"
    cfg.write_text(GOOD_TOML)
    r = validate("--config", str(cfg))
    assert (r.returncode, r.stdout.strip()) == (0, "configuration OK"), r.stderr
    assert not (tmp_path / "d").exists()  # validation changes nothing on disk


@pytest.mark.parametrize(
    ("args", "toml", "flag", "reason"),
    [
        (["--port", "70000"], None, "--port", "65535"),
        (["--port", "-1"], None, "--port", "greater than or equal to 0"),
        (["--log-level", "loud"], None, "--log-level", "must be one of"),
        (["--max-message-size", "10"], None, "--max-message-size", "512"),
        (["--sasl-mechanisms", "GSSAPI"], None, "--sasl-mechanisms", "unsupported mechanism 'GSSAPI'"),
        (["--sasl-mechanisms", "PLAIN"], None, "--sasl-mechanisms", "needs --users-file"),
        (["--name", "bad name!"], None, "--name", "pattern"),
        (["--ha-cluster"], None, "--ha-brokers-url", "--ha-cluster needs"),
        (["--ha-cluster", "--ha-brokers-url", "nohost"], None, "--ha-brokers-url", "not host:port"),
        (["--ha-brokers-url", "h:99999"], None, "--ha-brokers-url", "out of range"),
        (["--ha-replicate", "sometimes"], None, "--ha-replicate", "'all', 'configuration' or 'none'"),
        (["--ha-coordinator", "zookeeper"], None, "--zk-hosts", "needs --zk-hosts"),
        (["--ha-username", "u"], None, "--ha-password", "go together"),
        (["--credit-window", "0"], None, "--credit-window", "greater than or equal to 1"),
        ([], "bogus = 1\n", "--bogus", "unknown setting"),
        ([], "port = \"x\"\n", "--port", "valid integer"),
        ([], "log-level = 3\n", "--log-level", "string"),
        ([], "port = \n", "--config", "not valid TOML"),
        (["--users-file", "/nonexistent/users.toml"], None, "--users-file", "no such file"),
        (["--users-file", "@users"], None, "--users-file", "needs a non-empty password"),
    ],
)
def test_bad_value_exits_2_naming_the_flag(
    tmp_path: Path, args: list[str], toml: str | None, flag: str, reason: str
) -> None:
    users = tmp_path / "users.toml"
    users.write_text('[users.alice]\npassword = ""\n')
    args = [str(users) if a == "@users" else a for a in args]
    if toml is not None:
        cfg = tmp_path / "broker.toml"
        cfg.write_text(toml)
        args = [*args, "--config", str(cfg)]
    r = validate_in_process(*args)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert flag in r.stderr and reason in r.stderr, r.stderr
    assert "configuration OK" not in r.stdout


def test_installed_command_exits_2_for_a_bad_value(tmp_path: Path) -> None:
    r = validate("--config", str(tmp_path / "absent.toml"))
    assert r.returncode == 2
    assert "--config" in r.stderr and "No such file" in r.stderr
    r = validate("--port", "70000", "--log-level", "loud")
    assert r.returncode == 2
    assert [line.split(":")[1].strip() for line in r.stderr.splitlines()] == ["--port", "--log-level"]


def test_config_file_settings_apply_and_flags_override_them(brokers: BrokerFactory, tmp_path: Path) -> None:
    cfg = tmp_path / "broker.toml"
    cfg.write_text("auto-create-queues = true\nmax_message_size = 2048\n")
    b = brokers("--config", str(cfg))
    send(b.url, "from-file", ["auto-created"])  # auto-create came from the file
    assert receive(b.url, "from-file", 1) == ["auto-created"]
    c = connect(b.url)
    try:
        with pytest.raises(LinkDetached) as exc:
            c.create_sender("from-file").send(Message(body=b"z" * 4000))
        cond = exc.value.link.remote_condition
        assert cond is not None and cond.name == "amqp:link:message-size-exceeded"
    finally:
        c.close()
    overridden = brokers("--config", str(cfg), "--no-auto-create-queues")
    c = connect(overridden.url)
    try:
        with pytest.raises(LinkDetached) as exc:
            c.create_sender("from-file")
        cond = exc.value.link.remote_condition
        assert cond is not None and cond.name == "amqp:not-found"
    finally:
        c.close()


def test_sigterm_stops_cleanly(broker: BrokerProcess) -> None:
    c = connect(broker.url, timeout=2)  # a client still connected does not hold the broker up
    c.create_receiver("$events")
    broker.signal(signal.SIGTERM)
    assert broker.proc is not None
    assert broker.proc.wait(20) == 0
    events = [e["event"] for e in broker.events()]
    assert events[-2:] == ["broker.stopping", "broker.stopped"]
    stopping = [e for e in broker.events() if e["event"] == "broker.stopping"]
    assert stopping[0]["reason"] == "sigterm"
    # The client was told (connection close with amqp:connection:forced), not left with a dropped socket.
    with pytest.raises(ConnectionClosed) as exc:
        c.wait(lambda: False, timeout=10, msg="the broker's close")
    cond = exc.value.connection.remote_condition
    assert cond is not None and cond.name == "amqp:connection:forced"
    with contextlib.suppress(Exception):
        c.close()


def _start_unnamed(data_dir: Path, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    p = subprocess.Popen([HA_BROKER, "--port", "0", "--data-dir", str(data_dir), "--log-file", str(log)],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)

    def started() -> str | None:
        assert p.poll() is None, "broker exited"
        ev = [e for e in read_events(log) if e["event"] == "broker.started"]
        return str(ev[-1]["broker"]) if len(ev) == started.count + 1 else None  # type: ignore[attr-defined]

    started.count = len([e for e in read_events(log) if e["event"] == "broker.started"])  # type: ignore[attr-defined]
    try:
        return p, wait_for(started, 20, what="broker to start")
    except BaseException:
        p.kill()
        p.wait(10)
        raise


def test_generated_broker_id_is_kept_in_the_data_dir(tmp_path: Path) -> None:
    data, log = tmp_path / "data", tmp_path / "broker.log"
    p, first = _start_unnamed(data, log)
    try:
        p.send_signal(signal.SIGTERM)
        assert p.wait(20) == 0
    finally:
        p.kill()
    assert first.startswith("broker-")
    assert (data / "broker-id").read_text().strip() == first
    p, second = _start_unnamed(data, log)
    try:
        port = next(e for e in reversed(read_events(log)) if e["event"] == "broker.started")["address"]
        with mgmt(port) as m:
            assert m.call("READ", "broker").body["name"] == first
        p.send_signal(signal.SIGTERM)
        assert p.wait(20) == 0
    finally:
        p.kill()
    assert second == first
    _, other = _start_unnamed_elsewhere(tmp_path)
    assert other != first


def _start_unnamed_elsewhere(tmp_path: Path) -> tuple[int, str]:
    p, bid = _start_unnamed(tmp_path / "other", tmp_path / "other.log")
    p.send_signal(signal.SIGTERM)
    return p.wait(20), bid
