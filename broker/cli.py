"""`ha-broker`: command-line flags (or a TOML config file) -> a running broker.

The command is built by `make_command(plugins)`: a plugin is called with the server before it starts, which is how
the HA layer attaches itself without broker/ knowing about it.
"""

from __future__ import annotations

import gc
import importlib
import os
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
from broker.config import BrokerConfig, ConfigError, load_config
from broker.metrics import MetricsError, MetricsServer
from broker.server import Server
from broker.store.records import JournalError
from broker.tls import TlsError, config_problems

Plugin = Callable[[Server], None]

_FLAGS: list[tuple[str, dict[str, Any]]] = [
    ("--host", {"help": "address to listen on [127.0.0.1]"}),
    ("--port", {"type": int, "help": "port to listen on (0 = any free port) [5672]"}),
    ("--name", {"help": "broker id (default: generated once and kept in the data dir)"}),
    ("--data-dir", {"type": click.Path(path_type=Path), "help": "directory for the broker id and state"}),
    ("--log-file", {"type": click.Path(path_type=Path), "help": "JSON-lines event log (default stderr)"}),
    ("--log-level", {"help": "debug|info|warning|error|critical [info]"}),
    ("--pid-file", {"type": click.Path(path_type=Path), "help": "write the process id here"}),
    ("--admin-socket", {"type": click.Path(path_type=Path), "help": "serve management on this Unix socket (0600)"}),
    ("--auto-create-queues/--no-auto-create-queues", {"default": None, "help": "create queues on attach"}),
    ("--journal/--no-journal", {"default": None, "help": "journal durable queues and messages under --data-dir [on]"}),
    ("--journal-segment-bytes", {"type": int, "help": "size at which the journal starts a new segment [64 MiB]"}),
    ("--max-memory", {"help": "memory queued messages may take (bytes, or 512M, 2G); beyond it durable queues page to "
                              "disk and what cannot is refused [no bound]"}),
    ("--max-message-size", {"type": int, "help": "largest accepted message in bytes [10 MiB]"}),
    ("--sasl-mechanisms", {"help": "space or comma separated: ANONYMOUS PLAIN"}),
    ("--users-file", {"type": click.Path(path_type=Path), "help": "TOML users file for PLAIN (see docs)"}),
    ("--acl-file", {"type": click.Path(path_type=Path), "help": "TOML access rules; reloaded on SIGHUP (see "
                                                               "docs/access-control.md) [everything allowed]"}),
    ("--credit-window", {"type": int, "help": "credit given to each publisher link [500]"}),
    ("--metrics-port", {"type": int, "help": "serve Prometheus metrics over HTTP on --host at this port (0 = any "
                                             "free port; see docs/metrics.md) [off]"}),
    ("--ssl-cert", {"type": click.Path(path_type=Path), "help": "PEM certificate of the listener: clients and other "
                                                               "brokers connect over TLS (docs/tls.md) [off]"}),
    ("--ssl-key", {"type": click.Path(path_type=Path), "help": "PEM private key of --ssl-cert (unencrypted, 0600)"}),
    ("--ssl-ca", {"type": click.Path(path_type=Path), "help": "PEM CA certificate(s) trusted for the other brokers' "
                                                             "and for client certificates"}),
    ("--ssl-require-client-cert/--no-ssl-require-client-cert", {"default": None, "help": "refuse a client without "
                                                                "a certificate signed by --ssl-ca [off]"}),
    ("--ssl-allow-plain/--no-ssl-allow-plain", {"default": None, "help": "accept plain (non-TLS) connections on the "
                                                "same port too [off: TLS only]"}),
    ("--ssl-verify-hostname/--no-ssl-verify-hostname", {"default": None, "help": "a backup checks that the "
                                                        "primary's certificate names the host it dialled [on]"}),
    ("--ha-cluster/--no-ha-cluster", {"default": None, "help": "join an HA cluster (starts as a backup)"}),
    ("--ha-brokers-url", {"help": "comma list of every broker's own host:port (never the VIP)"}),
    ("--ha-public-url", {"help": "what clients use (e.g. the VIP host:port)"}),
    ("--ha-replicate", {"help": "default replication of new objects: all|configuration|none [all]"}),
    ("--ha-backup-timeout", {"type": float, "help": "seconds a new primary waits for expected backups [10]"}),
    ("--ha-min-ready-backups", {"type": int, "help": "the primary settles clients' messages and accepts only while "
                                                     "at least this many backups are ready; held meanwhile [0]"}),
    ("--ha-flow-messages", {"type": int, "help": "replication credit in messages per queue [1000]"}),
    ("--ha-flow-bytes", {"type": int, "help": "replication credit in bytes [16 MiB]"}),
    ("--ha-heartbeat", {"type": float, "help": "heartbeat seconds; a peer silent for 2 is dead [2]"}),
    ("--ha-username", {"help": "the replication user: brokers log in to each other as it, and only it may act as a "
                               "backup (in --users-file if one is set; see docs/replication.md)"}),
    ("--ha-password", {"help": "the replication user's password"}),
    ("--ha-lag-sample-max", {"type": int, "help": "log every ack as ha.lag below this rate per second [1000]"}),
    ("--ha-batched-acks/--no-ha-batched-acks", {"default": None, "help": "acknowledge replication in batches [on]"}),
    ("--ha-batch-bytes", {"type": int, "help": "replication batch size in bytes; 0 = one transfer per message [256 KiB]"}),
    ("--ha-coordinator", {"help": "external (Pacemaker/operator) | zookeeper [external]"}),
    ("--zk-hosts", {"help": "ZooKeeper host:port,..."}),
    ("--zk-path", {"help": "ZooKeeper path of this cluster [/understudy/default]"}),
    ("--zk-session-timeout", {"type": float, "help": "ZooKeeper session timeout seconds [6]"}),
]


def _field(flag: str) -> str:
    return flag.split("/")[0].lstrip("-").replace("-", "_")


def broker_id(cfg: BrokerConfig) -> str:
    """--name, else the id kept in the data dir (created on first start), else a fresh one."""
    if cfg.name:
        return cfg.name
    if cfg.data_dir is not None:
        f = cfg.data_dir / "broker-id"
        if f.exists():
            return f.read_text().strip()
        cfg.data_dir.mkdir(parents=True, exist_ok=True)
        new = f"broker-{uuid.uuid4().hex[:8]}"
        f.write_text(new + "\n")
        return new
    return f"broker-{uuid.uuid4().hex[:8]}"


def run(cfg: BrokerConfig, plugins: list[Plugin]) -> int:
    bid = broker_id(cfg)
    blog.configure(bid, cfg.log_level, cfg.log_file)
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
    metrics = MetricsServer(cfg.host, cfg.metrics_port, server) if cfg.metrics_port is not None else None
    if metrics is not None:
        try:
            metrics.open()
        except MetricsError as e:
            blog.get_logger("broker").error("metrics.refused", description=str(e))
            click.echo(f"ha-broker: --metrics-port: {e}", err=True)
            if admin is not None:
                admin.close()
            return 2
    if cfg.pid_file is not None:
        cfg.pid_file.parent.mkdir(parents=True, exist_ok=True)
        cfg.pid_file.write_text(f"{os.getpid()}\n")
    signal.signal(signal.SIGTERM, lambda *_: server.shutdown("sigterm"))
    signal.signal(signal.SIGINT, lambda *_: server.shutdown("sigint"))
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
    """With --acl-file: reopen the log file (logrotate) and read the rules again, on the loop thread."""
    blog.request_reopen()
    server.call_soon_threadsafe(server.access.reload)


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


def make_command(plugins: list[Plugin], validators: list[Validator] | None = None) -> click.Command:
    def cmd(config: Path | None, validate_config: bool, plugin: tuple[str, ...], **values: Any) -> None:
        vals = {_field(k): v for k, v in values.items()}
        extra: list[Plugin] = []
        for spec in plugin:
            mod, _, fn = spec.partition(":")
            try:
                extra.append(getattr(importlib.import_module(mod), fn))
            except (ImportError, AttributeError) as e:
                click.echo(f"ha-broker: --plugin {spec}: {e}", err=True)
                sys.exit(2)
        try:
            cfg = load_config(vals, config)
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
            click.echo("configuration OK")
            sys.exit(0)
        sys.exit(run(cfg, plugins + extra))

    params: list[click.Parameter] = [
        click.Option(["--config"], type=click.Path(path_type=Path), help="TOML file with the same settings"),
        click.Option(["--plugin"], multiple=True, hidden=True,
                     help="MODULE:FUNCTION called with the server before start (extensions, tests)"),
        click.Option(["--validate-config"], is_flag=True, help="check the configuration and exit (0 ok, 2 bad)"),
    ]
    for flag, kw in _FLAGS:
        params.append(click.Option([flag], **kw))
    return click.Command("ha-broker", callback=cmd, params=params, help="Understudy AMQP 1.0 broker.")


def main() -> None:
    make_command([])()
