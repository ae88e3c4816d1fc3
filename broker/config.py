"""The broker's configuration: one validated model, fed by command-line flags, environment variables and a TOML file.

Every field is a flag (`--max-message-size` <-> `max_message_size`), an environment variable
(`UNDERSTUDY_MAX_MESSAGE_SIZE`) and a key of the `--config` file; the flags are generated from the model
(broker/cli.py). Precedence: flag > environment > file > default. A bad value is reported with the flag that carries
it, where it came from when not from a flag, and the reason, so an operator can fix the command line, the environment
or the file without reading code.
"""

from __future__ import annotations

import difflib
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum, StrEnum
from pathlib import Path
from types import UnionType
from typing import Annotated, Any, get_args

from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
)

ENV_PREFIX = "UNDERSTUDY_"
VALID_MECHS = ("ANONYMOUS", "PLAIN", "EXTERNAL")  # EXTERNAL: a TLS client certificate (broker.auth)
UNIX_SOCKET_PATH_MAX = 107  # bytes: sockaddr_un.sun_path is 108 including the terminating NUL


class ReplicateLevel(StrEnum):
    """`qpid.replicate` levels: what a backup copies of an object."""

    ALL = "all"
    CONFIGURATION = "configuration"
    NONE = "none"


class Coordinator(StrEnum):
    EXTERNAL = "external"
    ZOOKEEPER = "zookeeper"


def parse_address(text: str, default_port: int | None = None) -> tuple[str, int]:
    """`host:port`, `[IPv6]:port` (or `amqp://host:port`) -> (host, port); raises ValueError with a readable reason.
    Without a port: `default_port`, or an error when there is none."""
    t = text.strip()
    if "://" in t:
        t = t.split("://", 1)[1]
    t = t.rsplit("@", 1)[-1].split("/", 1)[0]
    port: str | None
    if t.startswith("["):
        host, close, rest = t[1:].partition("]")
        if not close or not host or (rest and not rest.startswith(":")):
            raise ValueError(f"{text!r} is not host:port (an IPv6 address as [::1]:5672)")
        port = rest[1:] if rest else None
    else:
        host, sep, after = t.rpartition(":")
        host, port = (host, after) if sep else (t, None)
        if ":" in host:
            raise ValueError(f"{text!r}: an IPv6 address needs brackets (as [::1]:5672)")
    if not host:
        raise ValueError(f"{text!r} is not host:port")
    if port is None:
        if default_port is None:
            raise ValueError(f"{text!r} is not host:port")
        return host, default_port
    try:
        p = int(port)
    except ValueError:
        raise ValueError(f"{text!r}: port {port!r} is not a number") from None
    if not 0 < p < 65536:
        raise ValueError(f"{text!r}: port {p} out of range 1-65535")
    return host, p


ZK_PORT = 2181


def split_list(text: str | None) -> list[str]:
    """A comma-separated list as an operator types it (`a:5672, b:5672,`): the items, stripped, empty ones left
    out."""
    return [p.strip() for p in (text or "").split(",") if p.strip()]


def parse_zk_hosts(text: str) -> list[tuple[str, int]]:
    """kazoo's hosts string, `host:port,host:port[/chroot]` (a port left out is 2181) -> the servers; raises
    ValueError with a readable reason (kazoo itself fails with a traceback from urllib)."""
    parts = split_list(text)
    if not parts:
        raise ValueError("empty list of ZooKeeper servers")
    return [parse_address(p, default_port=ZK_PORT) for p in parts]


def check_zk_path(path: str) -> str:
    """A ZooKeeper node path as ZooKeeper takes it (`/understudy/orders`); raises ValueError saying what is wrong."""
    parts = path.split("/")
    if not path.startswith("/"):
        raise ValueError(f"{path!r} must start with '/'")
    if path != "/" and (path.endswith("/") or "" in parts[1:]):
        raise ValueError(f"{path!r} has an empty part ('//' or a '/' at the end)")
    if "." in parts or ".." in parts or "\0" in path:
        raise ValueError(f"{path!r} has a '.' or '..' part or a NUL character")
    return path


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


class BrokerConfig(BaseSettings):
    """All settings of one `ha-broker` process.

    Each field is one flag (`max_message_size` <-> `--max-message-size`, help text = the field's description, booleans
    as `--x/--no-x`), one environment variable (`UNDERSTUDY_MAX_MESSAGE_SIZE`) and one key of the `--config` file
    (`max-message-size` or `max_message_size`); `load_config` merges them. Built directly (`BrokerConfig(port=0)`)
    it reads nothing but its arguments: only `load_config(..., from_env=True)` looks at the environment.
    """

    model_config = SettingsConfigDict(extra="forbid", frozen=True, validate_default=False, env_prefix=ENV_PREFIX,
                                      case_sensitive=False)

    host: str = Field("127.0.0.1", description="address to listen on [127.0.0.1]")
    port: int = Field(5672, ge=0, le=65535, description="port to listen on (0 = any free port) [5672]")
    name: str | None = Field(None, min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.@-]+$",
                             description="broker id (default: generated once and kept in the data dir)")
    data_dir: Path | None = Field(None, description="directory for the broker id and state")
    log_file: Path | None = Field(None, description="JSON-lines event log (default stderr)")
    log_level: str = Field("info", description="debug|info|warning|error|critical [info]")
    pid_file: Path | None = Field(None, description="write the process id here")
    admin_socket: Path | None = Field(None, description="serve management on this Unix socket (0600)")
    auto_create_queues: bool = Field(False, description="create queues on attach")
    # The durable store: a journal under --data-dir for durable queues and messages (off: everything in memory).
    journal: bool = Field(True, description="journal durable queues and messages under --data-dir [on]")
    journal_segment_bytes: int = Field(64 * 1024 * 1024, ge=64 * 1024, le=1 << 31,
                                       description="size at which the journal starts a new segment [64 MiB]")
    journal_stall_halt: float = Field(0.0, ge=0, le=3600,
                                      description="end the broker (exit code 3) when no journal fdatasync has "
                                                  "returned, or its event loop has waited in the journal, for this "
                                                  "many seconds (a hung disk), so that a backup takes over; 0: only "
                                                  "log it [0]")
    # Flow to disk: bytes queued messages may take in memory (0 = no bound). See broker/memory.py.
    max_memory: int = Field(0, ge=0, description="memory queued messages may take (bytes, or 512M, 2G); beyond it "
                                                 "durable queues page to disk and what cannot is refused [no bound]",
                            json_schema_extra={"metavar": "SIZE"})
    min_disk_free: int = Field(0, ge=0, description="free space the journal's disk must keep (bytes, or 512M, 2G); "
                               "below it durable messages are refused with amqp:resource-limit-exceeded until there "
                               "is room again (checked every second) [0: off]",
                               json_schema_extra={"metavar": "SIZE"})
    max_message_size: int = Field(10 * 1024 * 1024, ge=512, le=1024 * 1024 * 1024,
                                  description="largest accepted message in bytes [10 MiB]")
    max_connections: int = Field(0, ge=0, le=10_000_000,
                                 description="client connections open at once; one more is refused with "
                                             "amqp:resource-limit-exceeded (backups and operators' tools are not "
                                             "counted) [no bound]")
    max_connections_per_user: int = Field(0, ge=0, le=10_000_000,
                                          description="client connections one user (the login name; anonymous "
                                                      "ones share `anonymous`) may have open at once; one more is "
                                                      "refused like --max-connections [no bound]")
    sasl_mechanisms: Annotated[tuple[str, ...], NoDecode] = Field(
        ("ANONYMOUS", "PLAIN"), description="space or comma separated: ANONYMOUS PLAIN",
        json_schema_extra={"metavar": "TEXT"})
    users_file: Path | None = Field(None, description="TOML users file for PLAIN (see docs)")
    # Access control rules (broker/acl.py, docs/access-control.md); reloaded on SIGHUP. None: no rules.
    acl_file: Path | None = Field(None, description="TOML access rules; reloaded on SIGHUP (see "
                                                    "docs/access-control.md) [everything allowed]")
    credit_window: int = Field(500, ge=1, le=100_000, description="credit given to each publisher link [500]")
    # Prometheus endpoint (broker/metrics.py) on --host; None = off, 0 = any free port (logged as metrics.started).
    metrics_port: int | None = Field(None, ge=0, le=65535,
                                     description="serve Prometheus metrics over HTTP on --host at this port (0 = any "
                                                 "free port; see docs/metrics.md) [off]")
    # TLS (broker/tls.py, docs/tls.md): the listener, and this broker's links to the others when it is a backup.
    ssl_cert: Path | None = Field(None, description="PEM certificate of the listener: clients and other brokers "
                                                    "connect over TLS (docs/tls.md) [off]")
    ssl_key: Path | None = Field(None, description="PEM private key of --ssl-cert (0600; if it is encrypted, "
                                                   "give --ssl-key-password-file)")
    ssl_key_password_file: Path | None = Field(None, description="file whose first line is the passphrase of an "
                                                                 "encrypted --ssl-key (0600)")
    ssl_ca: Path | None = Field(None, description="PEM CA certificate(s) trusted for the other brokers' and for "
                                                  "client certificates")
    ssl_require_client_cert: bool = Field(False, description="refuse a client without a certificate signed by "
                                                             "--ssl-ca [off]")
    ssl_allow_plain: bool = Field(False, description="accept plain (non-TLS) connections on the same port too "
                                                     "[off: TLS only]")
    ssl_verify_hostname: bool = Field(True, description="a backup checks that the primary's certificate names the "
                                                        "host it dialled [on]")

    # HA
    ha_cluster: bool = Field(False, description="join an HA cluster (starts as a backup)")
    ha_brokers_url: str | None = Field(None, description="comma list of every broker's own host:port (never the VIP)")
    ha_public_url: str | None = Field(None, description="what clients use (e.g. the VIP host:port)")
    ha_replicate: ReplicateLevel = Field(ReplicateLevel.ALL,
                                         description="default replication of new objects: all|configuration|none "
                                                     "[all]")
    ha_backup_timeout: float = Field(10.0, ge=0, le=3600,
                                     description="seconds a new primary waits for expected backups [10]")
    # The primary settles clients' messages and accepts only while at least this many backups are ready.
    ha_min_ready_backups: int = Field(0, ge=0, le=64,
                                      description="the primary settles clients' messages and accepts only while at "
                                                  "least this many backups are ready; held meanwhile [0]")
    ha_flow_messages: int = Field(1000, ge=1, le=1_000_000,
                                  description="replication credit in messages per queue [1000]")
    ha_flow_bytes: int = Field(16 * 1024 * 1024, ge=1024, description="replication credit in bytes [16 MiB]")
    ha_heartbeat: float = Field(2.0, gt=0, le=600, description="heartbeat seconds; a peer silent for 2 is dead [2]")
    # The replication user: backups log in as it, and only it may replicate (or, with a users file, is an admin
    # besides its own entry). Without a users file it is the brokers' own PLAIN login (see broker.auth).
    ha_username: str | None = Field(None, min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.@-]+$",
                                    description="the replication user: brokers log in to each other as it, and only "
                                                "it may act as a backup (in --users-file if one is set; see "
                                                "docs/replication.md)")
    ha_password: str | None = Field(None, description="the replication user's password")
    ha_lag_sample_max: int = Field(1000, ge=1,
                                   description="log every ack as ha.lag below this rate per second [1000]")
    ha_batched_acks: bool = Field(True, description="acknowledge replication in batches [on]")
    # Replication batches: bytes of records per transfer; 0 = one transfer per message (the older format).
    ha_batch_bytes: int = Field(256 * 1024, ge=0, le=64 * 1024 * 1024,
                                description="replication batch size in bytes; 0 = one transfer per message [256 KiB]")
    ha_coordinator: Coordinator = Field(Coordinator.EXTERNAL,
                                        description="external (Pacemaker/operator) | zookeeper [external]")
    zk_hosts: str | None = Field(None, description="ZooKeeper host:port,...")
    zk_path: str = Field("/understudy/default", description="ZooKeeper path of this cluster [/understudy/default]")
    zk_session_timeout: float = Field(6.0, gt=0, le=600, description="ZooKeeper session timeout seconds [6]")

    @classmethod
    def settings_customise_sources(cls, settings_cls: type[BaseSettings], init_settings: PydanticBaseSettingsSource,
                                   env_settings: PydanticBaseSettingsSource,
                                   dotenv_settings: PydanticBaseSettingsSource,
                                   file_secret_settings: PydanticBaseSettingsSource,
                                   ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Only the arguments: `load_config` reads the environment and the file itself, so that each value's source
        is known when it is refused."""
        return (init_settings,)

    @field_validator("max_memory", "min_disk_free", mode="before")
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
        parts = split_list(v)
        if not parts:
            raise ValueError("empty list of brokers")
        for p in parts:
            parse_address(p)
        return ",".join(parts)

    @field_validator("zk_path")
    @classmethod
    def _zk_path(cls, v: str) -> str:
        return check_zk_path(v)

    @field_validator("zk_hosts")
    @classmethod
    def _zk_hosts(cls, v: str | None) -> str | None:
        if v is not None:
            parse_zk_hosts(v)
        return v

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
        if "EXTERNAL" in self.sasl_mechanisms and not self.ssl_require_client_cert:
            raise ValueError("--sasl-mechanisms EXTERNAL needs --ssl-require-client-cert (the client certificate is "
                             "the login)")
        if self.ha_password is not None and self.ha_username is None:
            raise ValueError("--ha-username and --ha-password go together")
        if self.ha_username is not None and self.ha_password is None and not (
                "EXTERNAL" in self.sasl_mechanisms and self.ssl_cert is not None):
            raise ValueError("--ha-username needs --ha-password, or (brokers logging in with their certificates) "
                             "--sasl-mechanisms EXTERNAL with --ssl-cert/--ssl-key")
        # Who may replicate is who logs in as --ha-username (broker.auth.admit): with a users file, nobody else.
        if self.ha_username is not None and self.ha_password is not None and "PLAIN" not in self.sasl_mechanisms:
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
    def _min_disk_free(self) -> BrokerConfig:
        if self.min_disk_free and (self.data_dir is None or not self.journal):
            raise ValueError("--min-disk-free needs --data-dir and the journal: without one nothing is written, "
                             "and there is no disk to keep free")
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
                             ("--ssl-key-password-file", self.ssl_key_password_file is not None),
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
        return [parse_address(p) for p in split_list(self.ha_brokers_url)]


class ConfigError(Exception):
    """Invalid configuration; `lines` are ready to print, one per bad value."""

    def __init__(self, lines: list[str]) -> None:
        super().__init__("; ".join(lines))
        self.lines = lines


def flag_name(field: str) -> str:
    return "--" + field.replace("_", "-")


def env_name(field: str) -> str:
    return ENV_PREFIX + field.upper()


@dataclass(frozen=True)
class FlagSpec:
    """How one field appears on the command line (broker/cli.py turns these into click options)."""

    field: str
    flag: str  # `--max-message-size`
    help: str
    boolean: bool  # a `--x/--no-x` switch
    metavar: str  # what --help shows after a flag that takes a value
    is_path: bool


def _value_type(annotation: Any) -> Any:
    """`int | None` -> int; anything else unchanged."""
    args = [a for a in get_args(annotation) if a is not type(None)]
    return args[0] if isinstance(annotation, UnionType) and len(args) == 1 else annotation


def flag_specs() -> list[FlagSpec]:
    """Every field of BrokerConfig as a flag, in the model's order. A field without a description has no flag: the
    test in tests/broker/test_config_cli.py refuses that."""
    specs = []
    for field, info in BrokerConfig.model_fields.items():
        t = _value_type(info.annotation)
        extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
        if isinstance(t, type) and issubclass(t, Enum):
            metavar = "[" + "|".join(str(m.value) for m in t) + "]"
        else:
            metavar = {int: "INTEGER", float: "FLOAT", Path: "PATH"}.get(t, "TEXT")
        specs.append(FlagSpec(field, str(extra.get("flag", flag_name(field))), info.description or "", t is bool,
                              str(extra.get("metavar", metavar)), t is Path))
    return specs


def _read_file(config_file: Path) -> tuple[dict[str, Any], dict[str, str]]:
    """The TOML file -> (values by field name, the key as written in the file by field name)."""
    try:
        with open(config_file, "rb") as f:
            raw = tomllib.load(f)
    except OSError as e:
        raise ConfigError([f"--config {config_file}: {e.strerror}"]) from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError([f"--config {config_file}: not valid TOML: {e}"]) from None
    values: dict[str, Any] = {}
    keys: dict[str, str] = {}
    for k, v in raw.items():
        field = k.replace("-", "_")
        if field in keys:
            raise ConfigError([f"--config {config_file}: keys {keys[field]!r} and {k!r} are the same setting "
                               f"({flag_name(field)})"])
        values[field], keys[field] = v, k
    return values, keys


def _read_env() -> dict[str, Any]:
    """`UNDERSTUDY_<FIELD>` variables (any case) -> values by field name, as strings for the model to check."""
    try:
        return EnvSettingsSource(BrokerConfig)()
    except SettingsError as e:  # only for values that need decoding, which no field has (NoDecode); kept precise
        raise ConfigError([f"environment: {e}"]) from None


def env_near_misses(environ: Mapping[str, str]) -> list[str]:
    """`UNDERSTUDY_` variables that are no setting but look like one (a typo would otherwise be ignored silently;
    other `UNDERSTUDY_` variables belong to the project's scripts and tests, so they cannot all be refused)."""
    fields = list(BrokerConfig.model_fields)
    out = []
    for var in sorted(environ):
        if not var.upper().startswith(ENV_PREFIX):
            continue
        rest = var[len(ENV_PREFIX):].lower()
        if rest in fields:
            continue
        close = difflib.get_close_matches(rest, fields, n=1, cutoff=0.8)
        if close:
            out.append(f"{var} is not a setting (did you mean {env_name(close[0])}?): ignored")
    return out


_FLAG_IN_TEXT = re.compile(r"--[a-z0-9]+(?:-[a-z0-9]+)*")


def load_config(values: Mapping[str, Any], config_file: Path | None = None, *, from_env: bool = False
                ) -> BrokerConfig:
    """Merge explicit values (flags; None = not given) over the environment (only with `from_env`) over a TOML file
    over the defaults, and validate. Each refused value names its flag and, when it did not come from a flag, its
    environment variable or file key."""
    file_values, file_keys = _read_file(config_file) if config_file is not None else ({}, {})
    env_values = _read_env() if from_env else {}
    flags = {k: v for k, v in values.items() if v is not None}
    origin: dict[str, str] = {}  # field -> where its value came from, for fields not set by a flag
    for k in file_values:
        origin[k] = f"{config_file}, key {file_keys[k]!r}"
    for k in env_values:
        origin[k] = f"environment variable {env_name(k)}"
    for k in flags:
        origin.pop(k, None)
    merged = {**file_values, **env_values, **flags}

    def where(field: str) -> str:
        return flag_name(field) + (f" (from {origin[field]})" if field in origin else "")

    # Unknown keys are refused here, not by the model: BaseSettings would take `_env_file` and the like as its own
    # arguments instead of settings.
    lines = [f"{where(k)}: unknown setting (got {merged.pop(k)!r})" for k in list(merged)
             if k not in BrokerConfig.model_fields]
    try:
        cfg = BrokerConfig(**merged)
    except ValidationError as e:
        for err in e.errors():
            loc = [str(x) for x in err["loc"]]
            msg = err["msg"].removeprefix("Value error, ")
            if loc:
                lines.append(f"{where(loc[0])}: {msg} (got {err.get('input')!r})")
            else:
                # A rule across settings names flags; say where those not given as flags came from.
                named = dict.fromkeys(f[2:].replace("-", "_") for f in _FLAG_IN_TEXT.findall(msg))
                sources = [f"{flag_name(f)} from {origin[f]}" for f in named if f in origin]
                lines.append(msg + (f" [{'; '.join(sources)}]" if sources else ""))
        raise ConfigError(lines) from None
    if lines:
        raise ConfigError(lines)
    return cfg
