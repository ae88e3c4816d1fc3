"""Users file -> Cyrus SASL database; who may write through management; which role a connection gets.

Users file (TOML):

    [users.alice]
    password = "secret"
    admin = true

    [users.bob]
    password = "s3cret"

With a users file, PLAIN logins are checked against it and only users with `admin = true` may change wiring; an
ANONYMOUS connection may read but not write. Without a users file every connection is anonymous and an admin
(a broker on loopback for development), except that the HA replication user (`--ha-username`/`--ha-password`, the
brokers' own credentials) can log in with PLAIN when it is set.

Roles (`admit`): a connection's open frame may *ask* for a kind (`x-understudy-kind`: `client`, `admin`, `ha`), but
the authenticated identity decides what it gets; the properties never grant anything:
- `ha` (a backup replicating from this broker) only for the replication user (`--ha-username`); anyone else asking
  is refused with `amqp:unauthorized-access`. Only when replication is not authenticated at all (no users file and
  no `--ha-username`: a development cluster on loopback, warned at start-up as `access.open`) may anyone ask.
- `admin` (exempt from a backup's redirect; management writes) only for an admin identity: a user with
  `admin = true`, the replication user, or anyone without a users file. A non-admin asking gets `client` (a tool
  such as `ha-status` asks for `admin` by default and may still read).
- everything else is `client`.

Certificates (`--sasl-mechanisms EXTERNAL`, with `--ssl-require-client-cert`): a client that logs in with SASL
EXTERNAL is the user named by its certificate's subject CN (`CN=backup1,O=Example` -> `backup1`); that name is
checked like any other: the replication user when it equals `--ha-username` (brokers then log in to each other with
their certificates, no password), an admin when the users file says `admin = true` for it, and the name ACL rules
match.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from broker.client import KIND_PROPERTY  # the connection property a peer asks for a role with

__all__ = ["ANONYMOUS", "KIND_PROPERTY", "Admission", "Kind", "SaslSetup", "Trust", "User", "UsersFileError", "admit",
           "certificate_name", "load_users", "login_name"]

_NAME = re.compile(r"^[A-Za-z0-9_.@-]{1,64}$")
ANONYMOUS = "anonymous"  # the user name proton reports for a SASL ANONYMOUS login: never a users-file name


class UsersFileError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class User:
    name: str
    password: str
    admin: bool


def load_users(path: Path) -> dict[str, User]:
    try:
        with open(path, "rb") as f:
            raw = tomllib.load(f)
    except OSError as e:
        raise UsersFileError(f"--users-file {path}: {e.strerror}") from None
    except tomllib.TOMLDecodeError as e:
        raise UsersFileError(f"--users-file {path}: not valid TOML: {e}") from None
    table = raw.get("users")
    if not isinstance(table, dict) or not table:
        raise UsersFileError(f"--users-file {path}: needs a [users.NAME] table with at least one user")
    users = {}
    for name, entry in table.items():
        if not _NAME.match(name):
            raise UsersFileError(f"--users-file {path}: bad user name {name!r}")
        if name.lower() == ANONYMOUS:
            raise UsersFileError(f"--users-file {path}: user name {name!r} is reserved (it is how an ANONYMOUS "
                                 "login is reported, so a PLAIN login with it could not be told apart)")
        if not isinstance(entry, dict) or not isinstance(entry.get("password"), str) or not entry["password"]:
            raise UsersFileError(f"--users-file {path}: user {name!r} needs a non-empty password")
        admin = entry.get("admin", False)
        if not isinstance(admin, bool):
            raise UsersFileError(f"--users-file {path}: user {name!r}: admin must be true or false")
        users[name] = User(name, entry["password"], admin)
    return users


class SaslSetup:
    """Writes a sasldb and a Cyrus config for the broker's PLAIN logins into a private directory."""

    CONFIG_NAME = "understudy"

    def __init__(self, directory: Path, users: dict[str, User], mechanisms: tuple[str, ...]) -> None:
        self.directory = directory
        self.users = users
        self.mechanisms = mechanisms

    def write(self) -> None:
        tool = shutil.which("saslpasswd2")
        if tool is None and self.users:
            raise UsersFileError("saslpasswd2 not found (Debian package sasl2-bin) but a users file is set")
        self.directory.mkdir(parents=True, exist_ok=True)
        os.chmod(self.directory, 0o700)
        db = self.directory / "users.sasldb"
        if db.exists():
            db.unlink()
        realm = socket.gethostname()
        for u in self.users.values():
            subprocess.run(
                [str(tool), "-c", "-p", "-f", str(db), "-u", realm, u.name],
                input=u.password.encode(),
                check=True,
                capture_output=True,
            )
        conf = self.directory / f"{self.CONFIG_NAME}.conf"
        conf.write_text(
            "pwcheck_method: auxprop\n"
            "auxprop_plugin: sasldb\n"
            f"sasldb_path: {db}\n"
            f"mech_list: {' '.join(self.mechanisms)}\n"
        )


# ----- roles ----------------------------------------------------------------------------------------------------
class Kind(StrEnum):
    """What a connection is: a client, an operator's tool, or a backup replicating from this broker."""

    CLIENT = "client"
    ADMIN = "admin"
    HA = "ha"


@dataclass(frozen=True, slots=True)
class Trust:
    """Who is who, from the users file and the configuration (the only inputs `admit` trusts)."""

    users_file: bool  # a users file is set: logins are checked and only its admins are admins
    admins: frozenset[str]  # users with `admin = true`
    replication_user: str | None  # --ha-username: the only identity that may replicate (None: nobody named)

    @classmethod
    def of(cls, users: Mapping[str, User], replication_user: str | None) -> Trust:
        return cls(bool(users), frozenset(u.name for u in users.values() if u.admin), replication_user)

    @property
    def open_replication(self) -> bool:
        """No users file and no replication user: nothing is authenticated, anyone may replicate."""
        return not self.users_file and self.replication_user is None

    def is_admin(self, user: str | None) -> bool:
        if not self.users_file:
            return True
        return user is not None and (user in self.admins or user == self.replication_user)

    def may_replicate(self, user: str | None) -> bool:
        if self.open_replication:
            return True
        return user is not None and user == self.replication_user


@dataclass(frozen=True, slots=True)
class Admission:
    """What `admit` decided: the kind granted and the admin flag, or a refusal (`amqp:unauthorized-access`)."""

    kind: Kind
    admin: bool
    asked: str  # the kind the connection asked for, as text (for the log)
    refusal: str | None = None

    CONDITION = "amqp:unauthorized-access"


def asked_kind(properties: Mapping[Any, Any] | None) -> str:
    """The kind a connection asks for, as text: `client` when absent; anything else verbatim (it is only logged)."""
    v = (properties or {}).get(KIND_PROPERTY, Kind.CLIENT.value)
    return v if isinstance(v, str) else repr(v)[:64]


def certificate_name(subject: str) -> str:
    """The user a certificate logs in as: the CN of its subject (proton gives `CN=a,O=b` or `/CN=a/O=b`), else
    the whole subject."""
    for part in re.split(r"[,/]", subject):
        key, _, value = part.strip().partition("=")
        if key.strip().upper() == "CN" and value.strip():
            return value.strip()
    return subject


def login_name(transport: Any) -> str | None:
    """Who logged in on `transport`: the SASL user, or for EXTERNAL the name of the client certificate."""
    user = transport.user
    if user and transport.sasl().mech == "EXTERNAL":
        return certificate_name(str(user))
    return str(user) if user is not None else None


def admit(trust: Trust, user: str | None, properties: Mapping[Any, Any] | None) -> Admission:
    """The role of a connection authenticated as `user` whose open frame carries `properties`.

    The properties only choose among the roles the identity has (an operator's tool logged in as the replication
    user is an `admin`, not a backup); the admin flag depends on the identity alone."""
    asked = asked_kind(properties)
    admin = trust.is_admin(user)
    if asked == Kind.HA:
        if trust.may_replicate(user):
            return Admission(Kind.HA, admin, asked)
        who = "an ANONYMOUS login" if user in (None, ANONYMOUS) else f"user {user!r}"
        need = (f"the replication user {trust.replication_user!r} (--ha-username)" if trust.replication_user
                else "a replication user (--ha-username), and none is configured")
        return Admission(Kind.CLIENT, admin, asked,
                         f"{who} may not connect as a backup ({KIND_PROPERTY}=ha): only {need} may replicate")
    if asked == Kind.ADMIN and admin:
        return Admission(Kind.ADMIN, True, asked)
    return Admission(Kind.CLIENT, admin, asked)
