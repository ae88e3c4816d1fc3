"""`ha-broker`: command-line flags (generated from broker.config.BrokerConfig), environment variables and a TOML
config file -> a running broker.

The command is built by `make_command(plugins)`: a plugin is called with the server before it starts, which is how
the HA layer attaches itself without broker/ knowing about it.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import os
import resource
import signal
import sys
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from broker import acl as bacl
from broker import log as blog
from broker.admin_socket import AdminSocket, AdminSocketError
from broker.auth import ANONYMOUS, SaslSetup, User, UsersFileError, load_users
from broker.config import (
    ENV_PREFIX,
    BrokerConfig,
    ConfigError,
    env_name,
    env_near_misses,
    flag_specs,
    load_config,
)
from broker.datadir import DataDirInUse, data_dir_problem, disk_free_problem, file_problem, lock_data_dir
from broker.server import Server
from broker.store.records import JournalError
from broker.tls import TlsError, config_problems

Plugin = Callable[[Server], None]

_CLICK_TYPES: dict[str, click.ParamType] = {"INTEGER": click.INT, "FLOAT": click.FLOAT}


def setting_options() -> list[click.Option]:
    """One click option per BrokerConfig field, from the model (broker.config.flag_specs): booleans as `--x/--no-x`,
    numbers checked by click as before, paths as paths; everything else (choices included) is checked by the model, so
    a bad value reads the same from a flag, a variable or the file. Every default is None: not given on the command
    line, so the environment, the file or the model's default decides."""
    options = []
    for spec in flag_specs():
        if spec.boolean:
            decl = f"{spec.flag}/--no-{spec.flag.removeprefix('--')}"
            options.append(click.Option([spec.field, decl], default=None, help=spec.help))
            continue
        kind: click.ParamType = (click.Path(path_type=Path) if spec.is_path
                                 else _CLICK_TYPES.get(spec.metavar, click.STRING))
        options.append(click.Option([spec.field, spec.flag], type=kind, metavar=spec.metavar, help=spec.help))
    return options


EPILOG = (f"Every setting can also be given as an environment variable, {ENV_PREFIX} and the flag's name in capitals "
          f"with underscores ({env_name('ha_brokers_url')}=...), or as a key of the --config file (ha-brokers-url = "
          "...). A flag wins over the environment, the environment over the file, the file over the default.")


def broker_id(cfg: BrokerConfig) -> str:
    """--name, else the id kept in the data dir (created on first start; the directory exists: `run` made it),
    else a fresh one."""
    if cfg.name:
        return cfg.name
    if cfg.data_dir is not None:
        f = cfg.data_dir / "broker-id"
        if f.exists():
            return f.read_text().strip()
        new = f"broker-{uuid.uuid4().hex[:8]}"
        f.write_text(new + "\n")
        return new
    return f"broker-{uuid.uuid4().hex[:8]}"


def path_problems(cfg: BrokerConfig, data_dir: bool = True) -> list[str]:
    """What is wrong with the files (and, with `data_dir`, the data directory) the broker would write, judged
    without writing anything."""
    return [f"{flag} {path}: {problem}" for flag, path, problem in (
        ("--data-dir", cfg.data_dir, data_dir and cfg.data_dir and data_dir_problem(cfg.data_dir, create=False)),
        ("--log-file", cfg.log_file, cfg.log_file and file_problem(cfg.log_file)),
        ("--pid-file", cfg.pid_file, cfg.pid_file and file_problem(cfg.pid_file)),
        ("--min-disk-free", cfg.min_disk_free,
         cfg.data_dir and disk_free_problem(cfg.data_dir, cfg.min_disk_free))) if problem]


def run(cfg: BrokerConfig, plugins: list[Plugin]) -> int:
    files = path_problems(cfg, data_dir=False)  # the data directory is made (or refused) below
    if files:
        for line in files:
            click.echo(f"ha-broker: {line}", err=True)
        return 2
    problem = data_dir_problem(cfg.data_dir) if cfg.data_dir is not None else None
    if problem is None:
        try:
            if cfg.data_dir is not None:
                lock_data_dir(cfg.data_dir)  # a bare descriptor: nothing closes it, held until the process ends
            bid = broker_id(cfg)
        except DataDirInUse as e:
            problem = str(e)
        except OSError as e:  # the lock or id file cannot be made or read
            problem = f"{e.filename}: {e.strerror or e}" if e.filename else str(e.strerror or e)
    if problem is not None:
        click.echo(f"ha-broker: --data-dir {cfg.data_dir}: {problem}", err=True)
        return 2
    try:
        blog.configure(bid, cfg.log_level, cfg.log_file)
    except OSError as e:
        click.echo(f"ha-broker: --log-file {cfg.log_file}: cannot open it: {e.strerror or e}", err=True)
        return 2
    users = {}
    if cfg.users_file is not None:
        try:
            users = load_users(cfg.users_file)
        except UsersFileError as e:
            click.echo(f"ha-broker: {e}", err=True)
            return 2
    try:
        server = Server(cfg, bid, users)
    except TlsError as e:
        click.echo(f"ha-broker: {e}", err=True)
        return 2
    logins = sasl_logins(cfg, users)
    if logins:
        base = cfg.data_dir if cfg.data_dir is not None else Path(tempfile.mkdtemp(prefix="understudy-sasl-"))
        setup = SaslSetup(base / "sasl", logins, cfg.sasl_mechanisms)
        try:
            setup.write()
        except (UsersFileError, OSError) as e:
            click.echo(f"ha-broker: {e}", err=True)
            return 2
        server.sasl_dir = setup.directory
    if cfg.acl_file is not None:
        try:
            server.access.install(bacl.load(cfg.acl_file), "start")
        except bacl.AclError as e:
            click.echo(f"ha-broker: {e}", err=True)
            return 2
    # Always: reopen the log (logrotate), rules and certificates again; never SIGHUP's default (terminate)
    signal.signal(signal.SIGHUP, lambda *_: _on_sighup(server))
    for p in plugins:
        p(server)
    admin = AdminSocket(cfg.admin_socket, server) if cfg.admin_socket is not None else None
    if admin is not None:
        try:
            admin.open()
        except AdminSocketError as e:
            click.echo(f"ha-broker: --admin-socket: {e}", err=True)
            return 1
    metrics = None
    if cfg.metrics_port is not None:
        # prometheus_client only when asked for (a broker's start is mostly imports)
        from broker.metrics import MetricsError, MetricsServer

        metrics = MetricsServer(cfg.host, cfg.metrics_port, server)
        try:
            metrics.open()
        except MetricsError as e:
            blog.get_logger("broker").error("metrics.refused", description=str(e))
            click.echo(f"ha-broker: --metrics-port: {e}", err=True)
            if admin is not None:
                admin.close()
            return 2
    if cfg.pid_file is not None:
        try:
            cfg.pid_file.parent.mkdir(parents=True, exist_ok=True)
            cfg.pid_file.write_text(f"{os.getpid()}\n")
        except OSError as e:
            click.echo(f"ha-broker: --pid-file {cfg.pid_file}: cannot write it: {e.strerror or e}", err=True)
            for opened in (metrics, admin):
                if opened is not None:
                    opened.close()
            return 2
    signal.signal(signal.SIGTERM, lambda *_: server.shutdown("sigterm"))
    signal.signal(signal.SIGINT, lambda *_: server.shutdown("sigint"))
    raise_open_files()
    # Queues keep many long-lived objects: collect the young generation less often and keep start-up objects out
    # of every collection (the recipes measured GC as a large share of CPU with deep queues).
    gc.freeze()
    gc.set_threshold(50_000, 20, 100)
    try:
        server.run()
    except JournalError as e:
        blog.get_logger("broker").error("journal.refused", description=e.description)
        click.echo(f"ha-broker: {e.description}", err=True)
        return 2
    except OSError as e:
        click.echo(f"ha-broker: cannot listen on {cfg.host}:{cfg.port}: {e.strerror or e}", err=True)
        return 1
    finally:
        if metrics is not None:
            metrics.close()
        if admin is not None:
            admin.close()
        if cfg.pid_file is not None:
            cfg.pid_file.unlink(missing_ok=True)
    blog.fast.flush()
    blog.get_logger("broker").info("broker.stopped")
    return 0


def _on_sighup(server: Server) -> None:
    """Reopen the log file (logrotate); on the loop thread, read the access rules (--acl-file) and the TLS files
    again."""
    blog.request_reopen()
    server.call_soon_threadsafe(server.access.reload)
    server.call_soon_threadsafe(server.reload_tls)


def sasl_logins(cfg: BrokerConfig, users: dict[str, User]) -> dict[str, User]:
    """Who can log in with PLAIN: the users file, else the replication user alone (the brokers' own credentials)."""
    if users:
        return users
    if cfg.ha_username is not None and cfg.ha_password is not None:
        return {cfg.ha_username: User(cfg.ha_username, cfg.ha_password, admin=True)}
    return {}


def users_problems(cfg: BrokerConfig, users: dict[str, User]) -> list[str]:
    """The replication user against the users file: backups must be able to log in as it."""
    name = cfg.ha_username
    if name is None:
        return []
    if name.lower() == ANONYMOUS:
        return [f"--ha-username: {name!r} is reserved (it is how an ANONYMOUS login is reported)"]
    if not users:
        return []
    if name not in users:
        return [f"--ha-username {name!r} is not in --users-file {cfg.users_file}: backups could not log in"]
    return []


Validator = Callable[[BrokerConfig], list[str]]


def raise_open_files() -> None:
    """A broker holds a descriptor per connection: the soft limit of open files goes up to the hard one (systemd
    and login shells give 1024 soft against 524288 hard), as servers that hold many sockets do. The limit in force
    is in `broker.started`; out of descriptors, the listener rests (`connection.accept_failed`)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if soft != resource.RLIM_INFINITY and soft < target:
        with contextlib.suppress(ValueError, OSError):  # kept as it is: `broker.started` says which
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


def make_command(plugins: list[Plugin], validators: list[Validator] | None = None) -> click.Command:
    def cmd(config: Path | None, validate_config: bool, plugin: tuple[str, ...], **values: Any) -> None:
        for line in env_near_misses(os.environ):
            click.echo(f"ha-broker: warning: {line}", err=True)
        extra: list[Plugin] = []
        for spec in plugin:
            mod, _, fn = spec.partition(":")
            try:
                extra.append(getattr(importlib.import_module(mod), fn))
            except (ImportError, AttributeError) as e:
                click.echo(f"ha-broker: --plugin {spec}: {e}", err=True)
                sys.exit(2)
        try:
            cfg = load_config(values, config, from_env=True)
        except ConfigError as e:
            for line in e.lines:
                click.echo(f"ha-broker: {line}", err=True)
            sys.exit(2)
        problems = [p for v in validators or [] for p in v(cfg)]
        if problems:
            for line in problems:
                click.echo(f"ha-broker: {line}", err=True)
            sys.exit(2)
        users: dict[str, User] = {}
        if cfg.users_file is not None:
            try:
                users = load_users(cfg.users_file)  # a bad users file is a configuration error too
            except UsersFileError as e:
                click.echo(f"ha-broker: {e}", err=True)
                sys.exit(2)
        if cfg.acl_file is not None:
            try:
                bacl.load(cfg.acl_file)  # a bad rules file is a configuration error too
            except bacl.AclError as e:
                click.echo(f"ha-broker: {e}", err=True)
                sys.exit(2)
        problems = users_problems(cfg, users) + config_problems(cfg)
        if problems:
            for line in problems:
                click.echo(f"ha-broker: {line}", err=True)
            sys.exit(2)
        if validate_config:
            problems = path_problems(cfg)
            if problems:
                for line in problems:
                    click.echo(f"ha-broker: {line}", err=True)
                sys.exit(2)
            click.echo("configuration OK")
            sys.exit(0)
        sys.exit(run(cfg, plugins + extra))

    params: list[click.Parameter] = [
        click.Option(["--config"], type=click.Path(path_type=Path), envvar=f"{ENV_PREFIX}CONFIG", show_envvar=True,
                     help="TOML file with the same settings"),
        click.Option(["--plugin"], multiple=True, hidden=True,
                     help="MODULE:FUNCTION called with the server before start (extensions, tests)"),
        click.Option(["--validate-config"], is_flag=True, help="check the configuration and exit (0 ok, 2 bad)"),
    ]
    params += setting_options()
    return click.Command("ha-broker", callback=cmd, params=params, help="Understudy AMQP 1.0 broker.", epilog=EPILOG)


def main() -> None:
    make_command([])()
