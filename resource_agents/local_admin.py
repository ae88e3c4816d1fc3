"""Ask the local broker over its admin socket (``ha-broker --admin-socket``): one JSON line out, one back.

Standard library only: the agent runs under the system python3, beside resource-agents' ``ocf.py``, not in the
project's virtualenv. ``broker/admin_socket.py`` is the server and documents the protocol; this is the same few
lines as its client, kept apart on purpose (the agent cannot import the broker package).
"""

from __future__ import annotations

import json
import socket
from dataclasses import dataclass
from typing import Any

MAX_REPLY = 16 * 1024 * 1024


class LocalAdminError(Exception):
    """No answer: no socket, nobody listening, or nothing back within the timeout (a hung broker)."""


@dataclass(frozen=True)
class Reply:
    status: int
    description: str
    body: Any

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300


def call(
    path: str, operation: str, body: Any = None, timeout: float = 5.0, type_: str = "ha-broker"
) -> Reply:
    request = {"operation": operation, "type": type_, "body": body}
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            sock.connect(path)
            sock.sendall(json.dumps(request).encode() + b"\n")
            with sock.makefile("rb") as reader:
                line = reader.readline(MAX_REPLY)
    except TimeoutError:
        raise LocalAdminError(f"{operation}: no answer on {path} within {timeout:g}s") from None
    except OSError as exc:
        raise LocalAdminError(f"{operation}: cannot use {path}: {exc.strerror or exc}") from None
    if not line:
        raise LocalAdminError(f"{operation}: {path} closed without an answer")
    try:
        data = json.loads(line)
        return Reply(int(data["status"]), str(data.get("description", "")), data.get("body"))
    except (ValueError, KeyError, TypeError) as exc:
        raise LocalAdminError(f"{operation}: unreadable answer on {path}: {exc}") from None
