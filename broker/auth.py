"""Users file -> Cyrus SASL database, and who may write through management.

Users file (TOML):

    [users.alice]
    password = "secret"
    admin = true

    [users.bob]
    password = "s3cret"

With a users file, PLAIN logins are checked against it and only users with `admin = true` may change wiring; an
ANONYMOUS connection may read but not write. Without a users file every connection is anonymous and an admin
(a broker on loopback for development).
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import tomllib
from dataclasses import dataclass
from pathlib import Path

_NAME = re.compile(r"^[A-Za-z0-9_.@-]{1,64}$")


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
