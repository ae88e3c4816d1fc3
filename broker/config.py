"""The broker's configuration: one validated model, fed by a TOML file and command-line flags.

Every field maps to a flag (`--max-message-size` <-> `max_message_size`). A bad value is reported with the flag that
carries it and the reason, so an operator can fix the command line or the file without reading code.
"""

from __future__ import annotations

import os
import tomllib
from enum import StrEnum
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

VALID_MECHS = ("ANONYMOUS", "PLAIN")
UNIX_SOCKET_PATH_MAX = 107  # bytes: sockaddr_un.sun_path is 108 including the terminating NUL


class ReplicateLevel(StrEnum):
    """`qpid.replicate` levels: what a backup copies of an object."""

    ALL = "all"
    CONFIGURATION = "configuration"
    NONE = "none"


class Coordinator(StrEnum):
    EXTERNAL = "external"
    ZOOKEEPER = "zookeeper"


def parse_address(text: str) -> tuple[str, int]:
    """`host:port` (or `amqp://host:port`) -> (host, port); raises ValueError with a readable reason."""
    t = text.strip()
    if "://" in t:
        t = t.split("://", 1)[1]
    t = t.rsplit("@", 1)[-1].split("/", 1)[0]
    host, sep, port = t.rpartition(":")
    if not sep or not host:
        raise ValueError(f"{text!r} is not host:port")
    try:
        p = int(port)
    except ValueError:
        raise ValueError(f"{text!r}: port {port!r} is not a number") from None
    if not 0 < p < 65536:
        raise ValueError(f"{text!r}: port {p} out of range 1-65535")
    return host.strip("[]"), p


_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(text: str) -> int:
    """`1048576`, `512M`, `2G`, `1.5GiB` -> bytes (binary units); ValueError with the reason."""
    t = text.strip().upper().removesuffix("B").removesuffix("I")
    unit = t[-1:] if t[-1:] in _UNITS and t[-1:] else ""
    number = t[: len(t) - len(unit)].strip()
    try:
        value = float(number)
    except ValueError:
        raise ValueError(f"{text!r} is not a size (bytes, or a number with K, M, G or T)") from None
    if value < 0:
        raise ValueError(f"{text!r}: a size cannot be negative")
    return int(value * _UNITS[unit])


class BrokerConfig(BaseModel):
    """All settings of one `ha-broker` process."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    host: str = "127.0.0.1"
    port: int = Field(5672, ge=0, le=65535)
    name: str | None = Field(None, min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.@-]+$")
    data_dir: Path | None = None
    log_file: Path | None = None
    log_level: str = "info"
    pid_file: Path | None = None
    admin_socket: Path | None = None
    auto_create_queues: bool = False
    # The durable store: a journal under --data-dir for durable queues and messages (off: everything in memory).
    journal: bool = True
    journal_segment_bytes: int = Field(64 * 1024 * 1024, ge=64 * 1024, le=1 << 31)
    # Flow to disk: bytes queued messages may take in memory (0 = no bound). See broker/memory.py.
    max_memory: int = Field(0, ge=0)
    max_message_size: int = Field(10 * 1024 * 1024, ge=512, le=1024 * 1024 * 1024)
    sasl_mechanisms: tuple[str, ...] = ("ANONYMOUS", "PLAIN")
    users_file: Path | None = None
    # Access control rules (broker/acl.py, docs/access-control.md); reloaded on SIGHUP. None: no rules.
    acl_file: Path | None = None
    credit_window: int = Field(500, ge=1, le=100_000)
    # Prometheus endpoint (broker/metrics.py) on --host; None = off, 0 = any free port (logged as metrics.started).
    metrics_port: int | None = Field(None, ge=0, le=65535)
    # TLS (broker/tls.py, docs/tls.md): the listener, and this broker's links to the others when it is a backup.
    ssl_cert: Path | None = None
    ssl_key: Path | None = None
    ssl_ca: Path | None = None
    ssl_require_client_cert: bool = False
    ssl_allow_plain: bool = False
    ssl_verify_hostname: bool = True

    # HA
    ha_cluster: bool = False
    ha_brokers_url: str | None = None
    ha_public_url: str | None = None
    ha_replicate: ReplicateLevel = ReplicateLevel.ALL
    ha_backup_timeout: float = Field(10.0, ge=0, le=3600)
    # The primary settles clients' messages and accepts only while at least this many backups are ready.
    ha_min_ready_backups: int = Field(0, ge=0, le=64)
    ha_flow_messages: int = Field(1000, ge=1, le=1_000_000)
    ha_flow_bytes: int = Field(16 * 1024 * 1024, ge=1024)
    ha_heartbeat: float = Field(2.0, gt=0, le=600)
    # The replication user: backups log in as it, and only it may replicate (or, with a users file, is an admin
    # besides its own entry). Without a users file it is the brokers' own PLAIN login (see broker.auth).
    ha_username: str | None = Field(None, min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.@-]+$")
    ha_password: str | None = None
    ha_lag_sample_max: int = Field(1000, ge=1)
    ha_batched_acks: bool = True
    # Replication batches: bytes of records per transfer; 0 = one transfer per message (the older format).
    ha_batch_bytes: int = Field(256 * 1024, ge=0, le=64 * 1024 * 1024)
    ha_coordinator: Coordinator = Coordinator.EXTERNAL
    zk_hosts: str | None = None
    zk_path: str = "/understudy/default"
    zk_session_timeout: float = Field(6.0, gt=0, le=600)

    @field_validator("max_memory", mode="before")
    @classmethod
    def _size(cls, v: Any) -> Any:
        return parse_size(v) if isinstance(v, str) else v

    @field_validator("log_level")
    @classmethod
    def _level(cls, v: str) -> str:
        lv = v.lower()
        if lv not in ("debug", "info", "warning", "error", "critical"):
            raise ValueError("must be one of debug, info, warning, error, critical")
        return lv

    @field_validator("admin_socket")
    @classmethod
    def _admin_socket(cls, v: Path | None) -> Path | None:
        if v is not None and len(os.fsencode(v)) > UNIX_SOCKET_PATH_MAX:
            raise ValueError(f"longer than {UNIX_SOCKET_PATH_MAX} bytes (the limit of a Unix socket path)")
        return v

    @field_validator("sasl_mechanisms", mode="before")
    @classmethod
    def _mechs(cls, v: Any) -> Any:
        if isinstance(v, str):
            v = [m for m in v.replace(",", " ").split() if m]
        if isinstance(v, list | tuple):
            out = []
            for m in v:
                mu = str(m).upper()
                if mu not in VALID_MECHS:
                    raise ValueError(f"unsupported mechanism {m!r} (supported: {', '.join(VALID_MECHS)})")
                out.append(mu)
            if not out:
                raise ValueError("at least one mechanism is needed")
            return tuple(out)
        return v

    @field_validator("ha_brokers_url")
    @classmethod
    def _brokers(cls, v: str | None) -> str | None:
        if v is None:
            return v
        parts = [p for p in v.split(",") if p.strip()]
        if not parts:
            raise ValueError("empty list of brokers")
        for p in parts:
            parse_address(p)
        return ",".join(p.strip() for p in parts)

    @field_validator("ha_public_url")
    @classmethod
    def _public(cls, v: str | None) -> str | None:
        if v is not None:
            for p in v.split(","):
                parse_address(p)
        return v

    @model_validator(mode="after")
    def _cross(self) -> BrokerConfig:
        if self.sasl_mechanisms == ("PLAIN",) and self.users_file is None and self.ha_username is None:
            raise ValueError("--sasl-mechanisms PLAIN needs --users-file (or --ha-username/--ha-password: then "
                             "the replication user is the only login)")
        if self.users_file is not None and not self.users_file.is_file():
            raise ValueError(f"--users-file {self.users_file}: no such file")
        if self.ha_cluster and not self.ha_brokers_url:
            raise ValueError("--ha-cluster needs --ha-brokers-url (the brokers' own addresses)")
        if self.ha_min_ready_backups and not self.ha_cluster:
            raise ValueError("--ha-min-ready-backups needs --ha-cluster")
        others = len((self.ha_brokers_url or "").split(",")) - 1
        if self.ha_min_ready_backups > others:
            raise ValueError(f"--ha-min-ready-backups {self.ha_min_ready_backups} can never be met: --ha-brokers-url "
                             f"names {others} other broker{'s' if others != 1 else ''}")
        if self.ha_coordinator == Coordinator.ZOOKEEPER and not self.zk_hosts:
            raise ValueError("--ha-coordinator zookeeper needs --zk-hosts")
        if (self.ha_username is None) != (self.ha_password is None):
            raise ValueError("--ha-username and --ha-password go together")
        # Who may replicate is who logs in as --ha-username (broker.auth.admit): with a users file, nobody else.
        if self.ha_username is not None and "PLAIN" not in self.sasl_mechanisms:
            raise ValueError("--ha-username needs PLAIN in --sasl-mechanisms (brokers log in with it)")
        if self.ha_cluster and self.users_file is not None and self.ha_username is None:
            raise ValueError("--ha-cluster with --users-file needs --ha-username and --ha-password: backups log in "
                             "as that user, the only one allowed to replicate")
        return self

    @model_validator(mode="after")
    def _acl(self) -> BrokerConfig:
        if self.acl_file is not None and self.ha_cluster and self.ha_username is None:
            raise ValueError("--ha-cluster with --acl-file needs --ha-username and --ha-password: the rules let "
                             "the replication user replicate, and without one a backup cannot be told apart")
        return self

    @model_validator(mode="after")
    def _metrics_port(self) -> BrokerConfig:
        if self.metrics_port and self.metrics_port == self.port:
            raise ValueError(f"--metrics-port {self.metrics_port} is also --port (the AMQP listener)")
        return self

    @model_validator(mode="after")
    def _tls(self) -> BrokerConfig:
        if (self.ssl_cert is None) != (self.ssl_key is None):
            raise ValueError("--ssl-cert and --ssl-key go together (the listener's certificate and its key)")
        if self.ssl_cert is None:
            for flag, on in (("--ssl-ca", self.ssl_ca is not None),
                             ("--ssl-require-client-cert", self.ssl_require_client_cert),
                             ("--ssl-allow-plain", self.ssl_allow_plain)):
                if on:
                    raise ValueError(f"{flag} needs --ssl-cert and --ssl-key (TLS on the listener)")
        if self.ssl_require_client_cert and self.ssl_ca is None:
            raise ValueError("--ssl-require-client-cert needs --ssl-ca (the CA that signs client certificates)")
        if self.ha_cluster and self.ssl_cert is not None and self.ssl_ca is None:
            raise ValueError("--ha-cluster with --ssl-cert needs --ssl-ca: a backup verifies its primary's "
                             "certificate against it")
        return self

    @property
    def brokers(self) -> list[tuple[str, int]]:
        return [parse_address(p) for p in (self.ha_brokers_url or "").split(",") if p.strip()]


class ConfigError(Exception):
    """Invalid configuration; `lines` are ready to print, one per bad value."""

    def __init__(self, lines: list[str]) -> None:
        super().__init__("; ".join(lines))
        self.lines = lines


def flag_name(field: str) -> str:
    return "--" + field.replace("_", "-")


def load_config(values: dict[str, Any], config_file: Path | None = None) -> BrokerConfig:
    """Merge a TOML file (lower priority) with explicit values (flags) and validate."""
    merged: dict[str, Any] = {}
    if config_file is not None:
        try:
            with open(config_file, "rb") as f:
                raw = tomllib.load(f)
        except OSError as e:
            raise ConfigError([f"--config {config_file}: {e.strerror}"]) from None
        except tomllib.TOMLDecodeError as e:
            raise ConfigError([f"--config {config_file}: not valid TOML: {e}"]) from None
        for k, v in raw.items():
            merged[k.replace("-", "_")] = v
    merged.update({k: v for k, v in values.items() if v is not None})
    try:
        return BrokerConfig(**merged)
    except ValidationError as e:
        lines = []
        for err in e.errors():
            loc = [str(x) for x in err["loc"]]
            msg = err["msg"].removeprefix("Value error, ")
            if loc:
                where = flag_name(loc[0])
                if err["type"] == "extra_forbidden":
                    msg = "unknown setting"
                lines.append(f"{where}: {msg} (got {err.get('input')!r})")
            else:
                lines.append(msg)
        raise ConfigError(lines) from None
