"""The local admin socket: `$management` requests as HTTP/1.1 with JSON bodies over a Unix domain socket.

Why a second way in: the Pacemaker agent asks its broker something every few seconds and twice on the failover
path. An AMQP management client costs a Python interpreter with proton (~0.15 s a call on the test machine); an HTTP
request on a Unix socket costs milliseconds and only the standard library (`http.client`). Operators get a way in
that does not depend on SASL users (``ha-admin --socket``, ``curl --unix-socket``), and a container a health check.

Whoever can open the socket has the admin role, like HAProxy's ``stats socket ... level admin`` or Ceph's admin
socket: it is created mode 0600, owned by the broker's user. Each request is logged with the caller's uid.

Protocol (the standard library's `http.server` on a `socketserver.UnixStreamServer`; keep-alive, any number of
requests per connection)::

    POST /management   {"operation": "STATUS", "type": "ha-broker", "name": null, "body": null, "properties": {}}
    -> 200             {"status": 200, "description": "OK", "body": {...}, "properties": {}}
    GET /health        -> 200 {"status": 200, "description": "OK", "body": {"broker": "b1", ...}}, or 503
    GET /metrics       -> 200, the Prometheus text format (docs/metrics.md), also without --metrics-port

The HTTP status is the management status, except that 204 is sent as 200 (an HTTP 204 has no body); the body's
``status`` is always the management one. A bad request gets 400 and the connection stays usable; a body over
`MAX_BODY` gets 413 and the connection is closed. Requests run on the reactor thread, never beside AMQP work: an
event loop that does not answer within the timeout gets 503, and a stopped process does not answer at all, so a hung
broker fails the agent's monitor as it must.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import http.client
import json
import os
import socket
import socketserver
import stat
import struct
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

from broker.log import get_logger
from broker.management import Request, Response

log = get_logger("broker")

MAX_BODY = 1024 * 1024
MAX_REPLY = 64 * 1024 * 1024
IDLE_TIMEOUT = 30.0
MAX_CONNECTIONS = 16
HEALTH_TIMEOUT = 5.0
MANAGEMENT_PATH = "/management"
HEALTH_PATH = "/health"
METRICS_PATH = "/metrics"


class AdminSocketError(Exception):
    """The socket cannot be served (bad path, in use by another broker, permissions), or a client got no answer."""


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
        self.httpd: _UnixHttpServer | None = None
        self._closed = threading.Event()
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self._registry: Any = None  # the Prometheus registry, made at the first GET /metrics
        self._registry_lock = threading.Lock()

    # ----- lifecycle ----------------------------------------------------------------------------------------
    def open(self) -> None:
        """Bind and listen (before the reactor runs, so a bad path stops the start-up with a clear error)."""
        # Imported here: ha-admin imports this module for its client only, and needs no configuration model.
        from broker.config import UNIX_SOCKET_PATH_MAX

        if len(os.fsencode(self.path)) > UNIX_SOCKET_PATH_MAX:
            raise AdminSocketError(
                f"{self.path}: longer than {UNIX_SOCKET_PATH_MAX} bytes (a Unix socket limit)"
            )
        self._clear_stale()
        httpd = _UnixHttpServer(self)
        old_umask = os.umask(0o177)  # never world- or group-accessible, not even for an instant
        try:
            httpd.server_bind()
        except OSError as e:
            httpd.server_close()
            raise AdminSocketError(f"cannot bind {self.path}: {e.strerror or e}") from None
        finally:
            os.umask(old_umask)
        os.chmod(self.path, 0o600)
        httpd.server_activate()
        self.httpd = httpd
        _thread(functools.partial(httpd.serve_forever, 0.2), "admin-socket")

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
        if self.httpd is not None:
            self.httpd.shutdown()
            self.httpd.server_close()
            with contextlib.suppress(OSError):
                os.unlink(self.path)

    # ----- answers (on the connection's thread; the work itself on the event loop) -----------------------------
    def answer(self, raw: bytes, user: str) -> Response:
        try:
            data = json.loads(raw)
        except ValueError as e:
            log.warning("admin_socket.bad_request", user=user, reason=f"not JSON: {e}")
            return Response(400, f"request is not JSON: {e}")
        except RecursionError:
            log.warning("admin_socket.bad_request", user=user, reason="JSON nested too deeply")
            return Response(400, "request is JSON nested too deeply to read")
        req = _request(data, user)
        if isinstance(req, Response):
            log.warning("admin_socket.bad_request", user=user, reason=req.description)
            return req
        return self._on_loop(lambda: self.server.handle_management(req), self.timeout)

    def health(self) -> Response:
        """The event loop answers within HEALTH_TIMEOUT: the broker's id and uptime."""
        def look() -> Response:
            body: dict[str, Any] = {"broker": self.server.id}
            started = getattr(self.server, "started", None)
            if isinstance(started, float):
                body["uptime_seconds"] = round(time.time() - started, 3)
            return Response(200, "OK", body)

        return self._on_loop(look, min(self.timeout, HEALTH_TIMEOUT))

    def metrics(self) -> tuple[bytes, str]:
        """The broker's Prometheus families (broker/metrics.py) and their content type. Imported only when asked:
        `ha-admin`, which imports this module for its client, does not need prometheus_client."""
        from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

        from broker.metrics import BrokerCollector, SnapshotPublisher, take_snapshot

        with self._registry_lock:
            if self._registry is None:
                publisher = SnapshotPublisher(lambda: take_snapshot(self.server), self.server.call_soon_threadsafe)
                self._registry = CollectorRegistry(auto_describe=False)
                self._registry.register(BrokerCollector(publisher))
        return generate_latest(self._registry), CONTENT_TYPE_LATEST

    def _on_loop(self, work: Callable[[], Response], timeout: float) -> Response:
        done = threading.Event()
        result: list[Response] = []

        def run() -> None:
            result.append(work())
            done.set()

        try:
            self.server.call_soon_threadsafe(run)
        except OSError:  # the event loop is gone (shutting down)
            return Response(503, "broker is stopping")
        if not done.wait(timeout):
            return Response(503, f"the broker's event loop did not answer within {timeout:g}s")
        return result[0]


class _UnixHttpServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    """`http.server` on the Unix socket; one daemon thread per connection, carrying the broker's log context."""

    daemon_threads = True
    block_on_close = False
    request_queue_size = 16

    def __init__(self, admin: AdminSocket) -> None:
        super().__init__(os.fspath(admin.path), _Handler, bind_and_activate=False)
        self.admin = admin

    def process_request(self, request: Any, client_address: Any) -> None:
        _thread(functools.partial(self.process_request_thread, request, client_address), "admin-socket-conn")

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A bug in the handler: logged (not printed on stderr), that connection closed, the others go on."""
        log.error("broker.error", where="admin_socket", exc_info=True)


class _Handler(BaseHTTPRequestHandler):
    """POST /management, GET /health and GET /metrics; every other answer, errors included, is the JSON reply
    object."""

    protocol_version = "HTTP/1.1"  # keep-alive
    timeout = IDLE_TIMEOUT
    server_version = "understudy-admin"
    sys_version = ""
    server: _UnixHttpServer
    user = "local"
    over_limit = False

    def setup(self) -> None:
        super().setup()
        self.user = _peer(self.connection)

    def handle(self) -> None:
        slots = self.server.admin._slots
        if not slots.acquire(blocking=False):
            self.over_limit = True  # read its one request (briefly), answer 503, close
            self.connection.settimeout(2.0)
            with contextlib.suppress(OSError):
                self.handle_one_request()
            return
        try:
            super().handle()
        finally:
            slots.release()

    def do_GET(self) -> None:
        if self._refused():
            return
        if self.path == HEALTH_PATH:
            self._reply(self.server.admin.health())
        elif self.path == METRICS_PATH:
            self._send(200, *self.server.admin.metrics())
        elif self.path == MANAGEMENT_PATH:
            self._bad(405, f"{MANAGEMENT_PATH} takes POST")
        else:
            self._not_found()

    def do_POST(self) -> None:
        if self._refused():
            return
        if self.path != MANAGEMENT_PATH:
            self._not_found()
            return
        length = self.headers.get("Content-Length")
        if length is None or not length.strip().isdigit():
            self._bad(411, "a request needs a Content-Length (the JSON body's size in bytes)", close=True)
            return
        size = int(length)
        if size > MAX_BODY:
            self._bad(413, f"request longer than {MAX_BODY} bytes", close=True)
            return
        self._reply(self.server.admin.answer(self.rfile.read(size), self.user))

    def _refused(self) -> bool:
        if self.over_limit:
            self._reply(Response(503, f"too many admin connections (at most {MAX_CONNECTIONS})"), close=True)
        elif self.server.admin._closed.is_set():
            self._reply(Response(503, "broker is stopping"), close=True)
        return self.over_limit or self.server.admin._closed.is_set()

    def _not_found(self) -> None:
        self._bad(404, f"no {self.path!r} here: POST {MANAGEMENT_PATH}, GET {HEALTH_PATH} or GET {METRICS_PATH}")

    def _bad(self, status: int, text: str, close: bool = False) -> None:
        log.warning("admin_socket.bad_request", user=self.user, reason=text)
        self._reply(Response(status, text), close=close)

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """http.server's own refusals (a malformed request line, an unknown method) as our JSON reply too. A line
        that is not HTTP at all (the one-JSON-line protocol of earlier releases) gets the JSON alone, then close."""
        text = message or self.responses.get(code, ("error",))[0]
        if self.request_version == "HTTP/0.9" and code == 400:
            text = (f"not an HTTP request ({text}): this admin socket takes HTTP/1.1, POST {MANAGEMENT_PATH} with "
                    "a JSON body")
        log.warning("admin_socket.bad_request", user=self.user, reason=f"{code} {text}")
        self._reply(Response(code, text), close=True)

    def _reply(self, resp: Response, close: bool = False) -> None:
        payload = json.dumps(
            {"status": resp.status, "description": resp.description, "body": resp.body,
             "properties": resp.properties},
            default=_jsonable,
        ).encode()
        code = resp.status if 200 <= resp.status < 600 and resp.status not in (204, 304) else 200
        self._send(code, payload, "application/json", close)

    def _send(self, code: int, payload: bytes, content_type: str, close: bool = False) -> None:
        try:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(payload)))
            if close:
                self.send_header("Connection", "close")
                self.close_connection = True
            self.end_headers()
            self.wfile.write(payload)
        except OSError:
            self.close_connection = True

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: management requests are logged as events by the broker, bad ones as admin_socket.bad_request."""

    def address_string(self) -> str:
        return self.user

    def version_string(self) -> str:
        return self.server_version


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


def _peer(conn: socket.socket) -> str:
    """``local:uid=N`` from the kernel's peer credentials (who is asking, for the log)."""
    try:
        _pid, uid, _gid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
    except OSError:
        return "local"
    return f"local:uid={uid}"


class UnixHTTPConnection(http.client.HTTPConnection):
    """`http.client` over a Unix socket (resource_agents/local_admin.py has its own copy: standard library only)."""

    def __init__(self, path: Path | str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self.unix_path = os.fspath(path)

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self.unix_path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


def request(
    path: Path, operation: str, type_: str, name: str | None = None, body: Any = None, timeout: float = 5.0
) -> Response:
    """One request on a broker's admin socket (``ha-admin --socket``); AdminSocketError if nothing answers."""
    payload = json.dumps({"operation": operation, "type": type_, "name": name, "body": body}, default=_jsonable)
    conn = UnixHTTPConnection(path, timeout)
    try:
        conn.request("POST", MANAGEMENT_PATH, payload.encode(), {"Content-Type": "application/json"})
        answer = conn.getresponse().read(MAX_REPLY)
    except TimeoutError:
        raise AdminSocketError(f"no answer on {path} within {timeout:g}s") from None
    except http.client.RemoteDisconnected:
        raise AdminSocketError(f"{path} closed without an answer") from None
    except http.client.HTTPException as e:
        raise AdminSocketError(f"unreadable answer on {path}: {e!r}") from None
    except OSError as e:
        raise AdminSocketError(f"cannot use {path}: {e.strerror or e}") from None
    finally:
        conn.close()
    try:
        data = json.loads(answer)
        return Response(
            int(data["status"]), str(data["description"]), data.get("body"), data.get("properties") or {}
        )
    except (ValueError, KeyError, TypeError) as e:
        raise AdminSocketError(f"unreadable answer on {path}: {e}") from None
