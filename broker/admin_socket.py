"""The local admin socket: `$management` requests over a Unix domain socket, one JSON object per line.

Why a second way in: the Pacemaker agent asks its broker something every few seconds and twice on the failover
path. An AMQP management client costs a Python interpreter with proton (~0.15 s a call on the test machine); a
line of JSON on a Unix socket costs milliseconds and only the standard library. Operators get a way in that does
not depend on SASL users (``ha-admin --socket``).

Whoever can open the socket has the admin role, like HAProxy's ``stats socket ... level admin`` or Ceph's admin
socket: it is created mode 0600, owned by the broker's user. Each request is logged with the caller's uid.

Protocol, any number of requests per connection::

    {"operation": "STATUS", "type": "ha-broker", "name": null, "body": null}
    {"status": 200, "description": "OK", "body": {...}, "properties": {}}

A bad request gets ``status`` 400 and the connection stays usable. Requests run on the reactor thread, never
beside AMQP work: an event loop that does not answer within the timeout gets 503, and a stopped process does not
answer at all, so a hung broker fails the agent's monitor as it must.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import json
import os
import socket
import stat
import struct
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from broker.config import UNIX_SOCKET_PATH_MAX
from broker.log import get_logger
from broker.management import Request, Response

log = get_logger("broker")

MAX_LINE = 1024 * 1024
IDLE_TIMEOUT = 30.0
MAX_CONNECTIONS = 16


class AdminSocketError(Exception):
    """The socket cannot be served (bad path, in use by another broker, permissions)."""


def _jsonable(value: Any) -> Any:
    """AMQP values JSON does not know (binary, uuid, timestamps, described types) as text."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


class AdminSocket:
    """Serve ``server.handle_management`` on ``path``; each request runs on the server's event loop."""

    def __init__(self, path: Path, server: Any, timeout: float = 60.0) -> None:
        self.path = path
        self.server = server
        self.timeout = timeout  # the client's own timeout is normally shorter and decides
        self.sock: socket.socket | None = None
        self._closed = threading.Event()
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)

    # ----- lifecycle ----------------------------------------------------------------------------------------
    def open(self) -> None:
        """Bind and listen (before the reactor runs, so a bad path stops the start-up with a clear error)."""
        if len(os.fsencode(self.path)) > UNIX_SOCKET_PATH_MAX:
            raise AdminSocketError(
                f"{self.path}: longer than {UNIX_SOCKET_PATH_MAX} bytes (a Unix socket limit)"
            )
        self._clear_stale()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old_umask = os.umask(0o177)  # never world- or group-accessible, not even for an instant
        try:
            sock.bind(os.fspath(self.path))
        except OSError as e:
            sock.close()
            raise AdminSocketError(f"cannot bind {self.path}: {e.strerror or e}") from None
        finally:
            os.umask(old_umask)
        os.chmod(self.path, 0o600)
        sock.listen(16)
        self.sock = sock
        _thread(self._accept_loop, "admin-socket")

    def _clear_stale(self) -> None:
        """A socket file left by a crashed broker is removed; one another broker still serves is an error."""
        try:
            st = os.lstat(self.path)
        except FileNotFoundError:
            return
        if not stat.S_ISSOCK(st.st_mode):
            raise AdminSocketError(f"{self.path} exists and is not a socket")
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        probe.settimeout(1.0)
        try:
            probe.connect(os.fspath(self.path))
        except OSError:
            os.unlink(self.path)  # nobody listens: stale
            return
        finally:
            probe.close()
        raise AdminSocketError(f"{self.path} is served by another running broker")

    def close(self) -> None:
        if self._closed.is_set():
            return
        self._closed.set()
        if self.sock is not None:
            with contextlib.suppress(OSError):
                self.sock.shutdown(socket.SHUT_RDWR)
            self.sock.close()
            with contextlib.suppress(OSError):
                os.unlink(self.path)

    # ----- serving ------------------------------------------------------------------------------------------
    def _accept_loop(self) -> None:
        assert self.sock is not None
        while not self._closed.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                if self._closed.is_set():
                    return
                time.sleep(0.1)  # e.g. out of file descriptors: do not spin
                continue
            if not self._slots.acquire(blocking=False):
                _send(conn, Response(503, f"too many admin connections (at most {MAX_CONNECTIONS})"))
                conn.close()
                continue
            _thread(functools.partial(self._serve, conn), "admin-socket-conn")

    def _serve(self, conn: socket.socket) -> None:
        try:
            self._serve_requests(conn)
        finally:
            self._slots.release()

    def _serve_requests(self, conn: socket.socket) -> None:
        user = _peer(conn)
        conn.settimeout(IDLE_TIMEOUT)
        with conn, conn.makefile("rb") as reader:
            while not self._closed.is_set():
                try:
                    line = reader.readline(MAX_LINE + 1)
                except OSError:
                    return
                if not line:
                    return
                if len(line) > MAX_LINE:
                    _send(conn, Response(400, f"request longer than {MAX_LINE} bytes"))
                    return
                if not line.strip():
                    continue
                if not _send(conn, self._answer(line, user)):
                    return

    def _answer(self, line: bytes, user: str) -> Response:
        try:
            data = json.loads(line)
        except ValueError as e:
            log.warning("admin_socket.bad_request", user=user, reason=f"not JSON: {e}")
            return Response(400, f"request is not JSON: {e}")
        req = _request(data, user)
        if isinstance(req, Response):
            log.warning("admin_socket.bad_request", user=user, reason=req.description)
            return req
        return self._on_loop(req)

    def _on_loop(self, req: Request) -> Response:
        done = threading.Event()
        result: list[Response] = []

        def run() -> None:
            result.append(self.server.handle_management(req))
            done.set()

        try:
            self.server.call_soon_threadsafe(run)
        except OSError:  # the event loop is gone (shutting down)
            return Response(503, "broker is stopping")
        if not done.wait(self.timeout):
            return Response(503, f"the broker's event loop did not answer within {self.timeout:g}s")
        return result[0]


def _thread(fn: Callable[[], None], name: str) -> None:
    """A daemon thread that logs with the caller's bound context (the broker's name)."""
    ctx = contextvars.copy_context()
    threading.Thread(target=ctx.run, args=(fn,), name=name, daemon=True).start()


def _request(data: Any, user: str) -> Request | Response:
    if not isinstance(data, dict):
        return Response(400, "request must be a JSON object")
    op, type_, name = data.get("operation"), data.get("type"), data.get("name")
    if not isinstance(op, str) or not isinstance(type_, str):
        return Response(400, "request needs 'operation' and 'type' (strings)")
    if name is not None and not isinstance(name, str):
        return Response(400, "'name' must be a string")
    props = data.get("properties")
    if props is None:
        props = {}
    elif not isinstance(props, dict):
        return Response(400, "'properties' must be an object")
    return Request(op, type_, name, data.get("body"), user, True, props)


def _send(conn: socket.socket, resp: Response) -> bool:
    reply = {
        "status": resp.status,
        "description": resp.description,
        "body": resp.body,
        "properties": resp.properties,
    }
    try:
        conn.sendall(json.dumps(reply, default=_jsonable).encode() + b"\n")
    except OSError:
        return False
    return True


def _peer(conn: socket.socket) -> str:
    """``local:uid=N`` from the kernel's peer credentials (who is asking, for the log)."""
    try:
        _pid, uid, _gid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
    except OSError:
        return "local"
    return f"local:uid={uid}"


def request(
    path: Path, operation: str, type_: str, name: str | None = None, body: Any = None, timeout: float = 5.0
) -> Response:
    """One request on a broker's admin socket (``ha-admin --socket``); AdminSocketError if nothing answers."""
    line = json.dumps({"operation": operation, "type": type_, "name": name, "body": body}, default=_jsonable)
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            sock.connect(os.fspath(path))
            sock.sendall(line.encode() + b"\n")
            with sock.makefile("rb") as reader:
                answer = reader.readline()
    except TimeoutError:
        raise AdminSocketError(f"no answer on {path} within {timeout:g}s") from None
    except OSError as e:
        raise AdminSocketError(f"cannot use {path}: {e.strerror or e}") from None
    try:
        data = json.loads(answer)
        return Response(
            int(data["status"]), str(data["description"]), data.get("body"), data.get("properties") or {}
        )
    except (ValueError, KeyError, TypeError) as e:
        raise AdminSocketError(f"unreadable answer on {path}: {e}") from None
