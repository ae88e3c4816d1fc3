"""`ha-broker` configuration and lifecycle: --validate-config, flags generated from the model, config files,
environment variables and their precedence, SIGTERM, the kept broker id."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from pathlib import Path

import click
import pytest
from click.testing import CliRunner
from proton import Message
from proton.utils import ConnectionClosed, LinkDetached

from broker.cli import make_command
from broker.config import BrokerConfig, flag_name
from tests.support.amqp import connect, mgmt, receive, send
from tests.support.procs import BIN, BrokerFactory, BrokerProcess, read_events, wait_for

HA_BROKER = str(BIN / "ha-broker")


def validate(*args: str) -> subprocess.CompletedProcess[str]:
    """The installed console script, in its own process."""
    return subprocess.run([HA_BROKER, *args, "--validate-config"], capture_output=True, text=True, timeout=60)


def validate_in_process(*args: str, env: dict[str, str] | None = None,
                        seen: list[BrokerConfig] | None = None) -> subprocess.CompletedProcess[str]:
    """The same command object in this process (a process start costs a second or two on a loaded machine); `env`
    is added to the environment for the call, `seen` gets the configuration the command settled on."""
    def keep(cfg: BrokerConfig) -> list[str]:
        if seen is not None:
            seen.append(cfg)
        return []

    r = CliRunner().invoke(make_command([], [keep]), [*args, "--validate-config"], env=env)
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
        (["--zk-hosts", "127.0.0.1:notaport"], None, "--zk-hosts", "port 'notaport' is not a number"),  # traceback
        (["--zk-hosts", " , "], None, "--zk-hosts", "empty list of ZooKeeper servers"),
        (["--zk-path", "understudy"], None, "--zk-path", "'understudy' must start with '/'"),
        (["--zk-path", "/a//b"], None, "--zk-path", "'/a//b' has an empty part"),
        (["--zk-path", "/a/../b"], None, "--zk-path", "has a '.' or '..' part"),
        (["--ha-username", "u"], None, "--ha-password", "needs --ha-password, or"),
        (["--credit-window", "0"], None, "--credit-window", "greater than or equal to 1"),
        ([], "bogus = 1\n", "--bogus", "unknown setting"),
        ([], "port = \"x\"\n", "--port", "valid integer"),
        ([], "log-level = 3\n", "--log-level", "string"),
        ([], "port = \n", "--config", "not valid TOML"),
        (["--users-file", "/nonexistent/users.toml"], None, "--users-file", "no such file"),
        (["--users-file", "@users"], None, "--users-file", "needs a non-empty password"),
        (["--min-disk-free", "lots"], None, "--min-disk-free", "'lots' is not a size"),
        (["--min-disk-free", "1G"], None, "--min-disk-free", "needs --data-dir and the journal"),
        (["--min-disk-free", "1G", "--data-dir", "/tmp/d", "--no-journal"], None, "--min-disk-free", "the journal"),
        (["--min-disk-free", "1000T", "--data-dir", "/tmp/never-made-by-validate"], None, "--min-disk-free",
         "more than the whole file system of --data-dir"),
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


# The flags that the README, docs/, the OCF agent, understudy-cluster and the tests pass: renaming or dropping one
# breaks them, so this list changes only on purpose.
PUBLIC_FLAGS = [
    "--host", "--port", "--name", "--data-dir", "--log-file", "--log-level", "--pid-file", "--admin-socket",
    "--auto-create-queues", "--journal", "--journal-segment-bytes", "--max-memory", "--max-message-size",
    "--sasl-mechanisms", "--users-file", "--acl-file", "--credit-window", "--metrics-port", "--ssl-cert",
    "--ssl-key", "--ssl-ca", "--ssl-require-client-cert", "--ssl-allow-plain", "--ssl-verify-hostname",
    "--ha-cluster", "--ha-brokers-url", "--ha-public-url", "--ha-replicate", "--ha-backup-timeout",
    "--ha-min-ready-backups", "--ha-flow-messages", "--ha-flow-bytes", "--ha-heartbeat", "--ha-username",
    "--ha-password", "--ha-lag-sample-max", "--ha-batched-acks", "--ha-batch-bytes", "--ha-coordinator",
    "--zk-hosts", "--zk-path", "--zk-session-timeout",
]
SWITCHES = {"--auto-create-queues", "--journal", "--ssl-require-client-cert", "--ssl-allow-plain",
            "--ssl-verify-hostname", "--ha-cluster", "--ha-batched-acks"}
NUMBERS = {"--port": click.INT, "--journal-segment-bytes": click.INT, "--max-message-size": click.INT,
           "--credit-window": click.INT, "--metrics-port": click.INT, "--ha-backup-timeout": click.FLOAT,
           "--ha-min-ready-backups": click.INT, "--ha-flow-messages": click.INT, "--ha-flow-bytes": click.INT,
           "--ha-heartbeat": click.FLOAT, "--ha-lag-sample-max": click.INT, "--ha-batch-bytes": click.INT,
           "--zk-session-timeout": click.FLOAT}


def test_every_setting_of_the_model_is_one_flag_with_its_help_and_no_default() -> None:
    options = {p.opts[0]: p for p in make_command([]).params if isinstance(p, click.Option)}
    own = {"--config", "--plugin", "--validate-config"}
    fields = BrokerConfig.model_fields
    assert sorted(set(options) - own) == sorted(flag_name(f) for f in fields)
    for field, info in fields.items():
        opt = options[flag_name(field)]
        assert opt.name == field
        assert info.description and opt.help == info.description, field
        if info.annotation is bool:
            assert opt.secondary_opts == [f"--no-{flag_name(field)[2:]}"], field
    assert set(PUBLIC_FLAGS) <= set(options), "a flag that callers pass is gone"
    assert {f for f, o in options.items() if o.secondary_opts} >= SWITCHES
    assert NUMBERS.items() <= {f: o.type for f, o in options.items()}.items()
    assert options["--ha-replicate"].metavar == "[all|configuration|none]"
    assert isinstance(options["--data-dir"].type, click.Path)


def test_help_lists_every_flag_and_says_how_the_environment_is_named() -> None:
    r = CliRunner().invoke(make_command([]), ["--help"], terminal_width=200)
    assert r.exit_code == 0
    for flag in PUBLIC_FLAGS:
        assert f"  {flag}" in r.stdout, flag
    assert "--no-ha-batched-acks" in r.stdout and "[all|configuration|none]" in r.stdout
    assert "UNDERSTUDY_HA_BROKERS_URL" in r.stdout and "UNDERSTUDY_CONFIG" in r.stdout


def test_flag_beats_environment_beats_file_beats_default(tmp_path: Path) -> None:
    cfg = tmp_path / "broker.toml"
    cfg.write_text('port = 1111\nauto-create-queues = true\nha_replicate = "none"\nzk-path = "/from/file"\n')
    seen: list[BrokerConfig] = []
    env = {"UNDERSTUDY_PORT": "2222", "UNDERSTUDY_AUTO_CREATE_QUEUES": "false", "UNDERSTUDY_LOG_LEVEL": "warning",
           "UNDERSTUDY_DATA_DIR": str(tmp_path / "d")}
    for args, e in ((["--config", str(cfg)], None), (["--config", str(cfg)], env),
                    (["--config", str(cfg), "--port", "3333", "--auto-create-queues", "--log-level", "error"], env),
                    ([], env)):
        r = validate_in_process(*args, env=e, seen=seen)
        assert r.returncode == 0, r.stderr
    from_file, from_env, from_flags, env_only = seen
    assert (from_file.port, from_file.auto_create_queues, from_file.log_level) == (1111, True, "info")
    assert (from_env.port, from_env.auto_create_queues, from_env.log_level) == (2222, False, "warning")
    assert (from_flags.port, from_flags.auto_create_queues, from_flags.log_level) == (3333, True, "error")
    assert (env_only.port, env_only.auto_create_queues, env_only.zk_path) == (2222, False, "/understudy/default")
    for c in (from_file, from_env, from_flags):  # what only the file sets stays set under the others
        assert (c.ha_replicate, c.zk_path) == ("none", "/from/file")
    assert from_env.data_dir == tmp_path / "d" and from_file.data_dir is None


def test_environment_names_are_the_flags_in_capitals_with_the_prefix(tmp_path: Path) -> None:
    (tmp_path / "users.toml").write_text('[users.alice]\npassword = "pw"\n')
    seen: list[BrokerConfig] = []
    env = {"UNDERSTUDY_HA_CLUSTER": "1", "UNDERSTUDY_HA_BROKERS_URL": "a:1, b:2", "UNDERSTUDY_HA_USERNAME": "alice",
           "UNDERSTUDY_HA_PASSWORD": "pw", "UNDERSTUDY_SASL_MECHANISMS": "plain", "UNDERSTUDY_MAX_MEMORY": "512M",
           "UNDERSTUDY_USERS_FILE": str(tmp_path / "users.toml"), "understudy_ha_heartbeat": "0.5",
           "UNDERSTUDY_HA_COORDINATOR": "external", "UNDERSTUDY_HA_BATCHED_ACKS": "off",
           "UNDERSTUDY_CONFIG": "", "UNDERSTUDY_CHAOS_SEED": "7"}  # another tool's variable: not a setting, no word
    r = validate_in_process(env=env, seen=seen)
    assert (r.returncode, r.stderr) == (0, "")
    c = seen[0]
    assert (c.ha_cluster, c.ha_brokers_url, c.ha_username, c.ha_password) == (True, "a:1,b:2", "alice", "pw")
    assert (c.sasl_mechanisms, c.max_memory, c.ha_heartbeat, c.ha_batched_acks) == (("PLAIN",), 512 << 20, 0.5, False)
    assert c.users_file == tmp_path / "users.toml"


def test_config_file_can_come_from_the_environment(tmp_path: Path) -> None:
    cfg = tmp_path / "broker.toml"
    cfg.write_text("credit-window = 7\n")
    seen: list[BrokerConfig] = []
    assert validate_in_process(env={"UNDERSTUDY_CONFIG": str(cfg)}, seen=seen).returncode == 0
    assert seen[0].credit_window == 7
    r = validate_in_process(env={"UNDERSTUDY_CONFIG": str(tmp_path / "absent.toml")})
    assert r.returncode == 2 and f"--config {tmp_path / 'absent.toml'}: No such file" in r.stderr


@pytest.mark.parametrize(
    ("env", "toml", "line"),
    [
        ({"UNDERSTUDY_PORT": "70000"}, None,
         "--port (from environment variable UNDERSTUDY_PORT): Input should be less than or equal to 65535 "
         "(got '70000')"),
        ({"UNDERSTUDY_PORT": "x"}, None, "--port (from environment variable UNDERSTUDY_PORT): Input should be a "
                                         "valid integer"),
        ({"UNDERSTUDY_JOURNAL": "maybe"}, None,
         "--journal (from environment variable UNDERSTUDY_JOURNAL): Input should be a valid boolean"),
        ({"UNDERSTUDY_HA_REPLICATE": "some"}, None,
         "--ha-replicate (from environment variable UNDERSTUDY_HA_REPLICATE): Input should be 'all', "
         "'configuration' or 'none' (got 'some')"),
        ({"UNDERSTUDY_NAME": ""}, None, "--name (from environment variable UNDERSTUDY_NAME): String should have at "
                                        "least 1 character"),
        ({"UNDERSTUDY_HA_CLUSTER": "true"}, None,
         "--ha-cluster needs --ha-brokers-url (the brokers' own addresses) [--ha-cluster from environment variable "
         "UNDERSTUDY_HA_CLUSTER]"),
        ({}, "port = 70000\n", "--port (from @file, key 'port'): Input should be less than or equal to 65535"),
        ({}, "max-mesage-size = 1\n", "--max-mesage-size (from @file, key 'max-mesage-size'): unknown setting"),
        ({}, "_env_file = \"/etc/passwd\"\n", "---env-file (from @file, key '_env_file'): unknown setting"),
        ({}, "max-message-size = 1024\nmax_message_size = 2048\n",
         "--config @file: keys 'max-message-size' and 'max_message_size' are the same setting (--max-message-size)"),
        ({"UNDERSTUDY_HA_COORDINATOR": "zookeeper"}, "ha-cluster = true\nha-brokers-url = \"a:1\"\n",
         "--ha-coordinator zookeeper needs --zk-hosts [--ha-coordinator from environment variable "
         "UNDERSTUDY_HA_COORDINATOR]"),
    ],
)
def test_bad_value_from_the_environment_or_the_file_exits_2_naming_where_it_came_from(
    tmp_path: Path, env: dict[str, str], toml: str | None, line: str
) -> None:
    args = []
    cfg = tmp_path / "broker.toml"
    if toml is not None:
        cfg.write_text(toml)
        args = ["--config", str(cfg)]
    r = validate_in_process(*args, env=env)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert f"ha-broker: {line.replace('@file', str(cfg))}" in r.stderr, r.stderr


def test_a_flag_hides_a_bad_value_underneath_it() -> None:
    r = validate_in_process("--port", "5999", env={"UNDERSTUDY_PORT": "70000"})
    assert (r.returncode, r.stdout.strip()) == (0, "configuration OK"), r.stderr


def test_a_misspelt_variable_is_warned_about_and_ignored() -> None:
    r = validate_in_process(env={"UNDERSTUDY_HA_BROKER_URL": "a:1", "UNDERSTUDY_NO_STONITH": "1"})
    assert r.returncode == 0
    assert r.stderr.splitlines() == ["ha-broker: warning: UNDERSTUDY_HA_BROKER_URL is not a setting (did you mean "
                                     "UNDERSTUDY_HA_BROKERS_URL?): ignored"]


def test_installed_command_reads_the_environment(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("UNDERSTUDY_")}
    r = subprocess.run([HA_BROKER, "--validate-config"], capture_output=True, text=True, timeout=60,
                       env={**env, "UNDERSTUDY_PORT": "70000", "UNDERSTUDY_LOG_LEVEL": "loud"})
    assert r.returncode == 2
    assert [line.split(" (from ")[0] for line in r.stderr.splitlines()] == ["ha-broker: --port", "ha-broker: --log-level"]


def test_a_broker_configured_by_environment_applies_it_under_the_flags(
    brokers: BrokerFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = tmp_path / "broker.toml"
    cfg.write_text("auto-create-queues = false\nmax-message-size = 65536\n")
    monkeypatch.setenv("UNDERSTUDY_CONFIG", str(cfg))
    monkeypatch.setenv("UNDERSTUDY_AUTO_CREATE_QUEUES", "true")  # over the file
    monkeypatch.setenv("UNDERSTUDY_MAX_MESSAGE_SIZE", "2048")
    b = brokers()
    send(b.url, "from-env", ["auto-created"])
    assert receive(b.url, "from-env", 1) == ["auto-created"]
    c = connect(b.url)
    try:
        with pytest.raises(LinkDetached) as exc:
            c.create_sender("from-env").send(Message(body=b"z" * 4000))
        cond = exc.value.link.remote_condition
        assert cond is not None and cond.name == "amqp:link:message-size-exceeded"
    finally:
        c.close()
    overridden = brokers("--no-auto-create-queues")  # the flag over the environment
    c = connect(overridden.url)
    try:
        with pytest.raises(LinkDetached) as exc:
            c.create_sender("from-env")
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
