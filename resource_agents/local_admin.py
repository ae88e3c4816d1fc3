"""Ask the local broker over its admin socket (``ha-broker --admin-socket``): one HTTP request with a JSON body.

Standard library only: the agent runs under the system python3, beside resource-agents' ``ocf.py``, not in the
project's virtualenv. ``broker/admin_socket.py`` is the server and documents the protocol; this is the same few
lines as its client, kept apart on purpose (the agent cannot import the broker package).
"""

from __future__ import annotations

import http.client
import json
import socket
from dataclasses import dataclass
from typing import Any

MAX_REPLY = 16 * 1024 * 1024
MANAGEMENT_PATH = "/management"


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


class _UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self.unix_path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self.unix_path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


def call(
    path: str, operation: str, body: Any = None, timeout: float = 5.0, type_: str = "ha-broker"
) -> Reply:
    request = json.dumps({"operation": operation, "type": type_, "body": body}).encode()
    conn = _UnixHTTPConnection(path, timeout)
    try:
        conn.request("POST", MANAGEMENT_PATH, request, {"Content-Type": "application/json"})
        answer = conn.getresponse().read(MAX_REPLY)
    except TimeoutError:
        raise LocalAdminError(f"{operation}: no answer on {path} within {timeout:g}s") from None
    except http.client.RemoteDisconnected:
        raise LocalAdminError(f"{operation}: {path} closed without an answer") from None
    except http.client.HTTPException as exc:
        raise LocalAdminError(f"{operation}: unreadable answer on {path}: {exc!r}") from None
    except OSError as exc:
        raise LocalAdminError(f"{operation}: cannot use {path}: {exc.strerror or exc}") from None
    finally:
        conn.close()
    try:
        data = json.loads(answer)
        return Reply(int(data["status"]), str(data.get("description", "")), data.get("body"))
    except (ValueError, KeyError, TypeError) as exc:
        raise LocalAdminError(f"{operation}: unreadable answer on {path}: {exc}") from None
