"""The local admin socket (``--admin-socket``): management as HTTP/1.1 with JSON bodies over a Unix socket."""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.admin_socket import MAX_BODY, AdminSocketError, UnixHTTPConnection, request
from broker.options import QUEUE_ARGUMENTS
from tests.broker.helpers import Sentinel
from tests.support.procs import BIN, BrokerFactory, BrokerProcess, wait_for


def sock_path(b: BrokerProcess) -> Path:
    return b.data_dir / "admin.sock"


def with_socket(brokers: BrokerFactory, *extra: str, name: str = "adm") -> BrokerProcess:
    path = brokers.workdir / name / "admin.sock"
    return brokers("--admin-socket", str(path), *extra, name=name)


def exchange(path: Path, bodies: list[bytes]) -> list[dict[str, Any]]:
    """POST raw bodies on one kept-alive connection; one parsed answer per body (its HTTP status agrees)."""
    conn = UnixHTTPConnection(path, 5)
    try:
        answers = []
        first = None
        for body in bodies:
            conn.request("POST", "/management", body, {"Content-Type": "application/json"})
            r = conn.getresponse()
            answer = json.loads(r.read())
            assert r.status == (200 if answer["status"] == 204 else answer["status"]), (r.status, answer)
            first = first or conn.sock
            assert conn.sock is first, "the connection was closed"  # the same connection served every request
            answers.append(answer)
        return answers
    finally:
        conn.close()


def raw(path: Path, data: bytes, timeout: float = 5) -> bytes:
    """Bytes out, everything back until the broker closes."""
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(timeout)
        s.connect(str(path))
        s.sendall(data)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
        return out


def test_management_over_the_socket_is_the_same_as_over_amqp(brokers: BrokerFactory) -> None:
    b = with_socket(brokers)
    path = sock_path(b)
    mode = os.stat(path).st_mode
    assert stat.S_ISSOCK(mode) and stat.S_IMODE(mode) == 0o600  # owner only: it carries the admin role
    created = request(path, "CREATE", "queue", "q1", {"arguments": {"max-count": 1000}})
    assert (created.status, created.body["name"]) == (201, "q1")
    Sentinel(b.url, "q1", count=5)  # the queue made over the socket takes messages over AMQP
    read = request(path, "READ", "queue", "q1")
    assert read.body["depth"] == 5
    assert request(path, "READ", "queue", "nope").status == 404
    events = [e for e in b.events() if e.get("event") == "management.request" and e.get("name") == "q1"]
    assert events and events[0]["user"] == f"local:uid={os.getuid()}"


def test_bad_requests_get_400_and_the_connection_and_messages_survive(brokers: BrokerFactory) -> None:
    b = with_socket(brokers)
    sentinel = Sentinel(b.url, "sentinel")
    answers = exchange(
        sock_path(b),
        [
            b"{not json",
            b"[1, 2]",
            b'{"type": "queue"}',
            b'{"operation": "READ", "type": "queue", "name": 7}',
            b'{"operation": "DELETE", "type": "queue", "name": "sentinel", "properties": []}',
            b'{"operation": "FROB", "type": "queue", "name": "sentinel"}',
            b"[" * 100_000 + b"]" * 100_000,  # deeper than Python's json reads (it raised RecursionError: no answer)
            b'{"operation": "CREATE", "type": "queue", "name": "deep", "body": {"arguments": {"x-deep": '
            + b"[" * 500 + b"]" * 500 + b"}}}",  # readable, but deeper than an argument may be (it was a 500)
            b'{"operation": "READ", "type": "queue", "name": "sentinel"}',
        ],
    )
    statuses = [a["status"] for a in answers]
    assert statuses == [400, 400, 400, 400, 400, 400, 400, 400, 200]
    assert "not JSON" in answers[0]["description"]
    assert "'operation' and 'type'" in answers[2]["description"]
    assert answers[6]["description"] == "request is JSON nested too deeply to read"
    assert answers[7]["description"].endswith("x-deep: lists and maps nested more than 32 deep"), answers[7]
    sentinel.check()
    assert any(e.get("event") == "admin_socket.bad_request" for e in b.events())


def test_an_overlong_request_is_refused(brokers: BrokerFactory) -> None:
    b = with_socket(brokers)
    sentinel = Sentinel(b.url, "sentinel")
    answer = raw(sock_path(b), b"POST /management HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n{" % (MAX_BODY + 1))
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 413 ") and b"Connection: close" in head
    assert "longer than" in json.loads(body)["description"]
    sentinel.check()


def test_health_metrics_wrong_paths_methods_and_non_http_get_answers(brokers: BrokerFactory) -> None:
    b = with_socket(brokers)
    conn = UnixHTTPConnection(sock_path(b), 5)
    try:
        conn.request("GET", "/health")
        r = conn.getresponse()
        health = json.loads(r.read())
        assert (r.status, r.getheader("Content-Type"), health["body"]["broker"]) == (200, "application/json", b.name)
        request(sock_path(b), "CREATE", "queue", "counted")
        conn.request("GET", "/metrics")  # Prometheus text, without --metrics-port
        r = conn.getresponse()
        text = r.read().decode()
        assert r.status == 200 and r.getheader("Content-Type", "").startswith("text/plain")
        assert 'understudy_broker_role{role="standalone"} 1.0' in text
        assert 'understudy_queue_depth{queue="counted"} 0.0' in text
        for method, path, status in (("GET", "/nope", 404), ("GET", "/management", 405), ("DELETE", "/health", 501)):
            conn.request(method, path)
            r = conn.getresponse()
            assert (r.status, json.loads(r.read())["status"]) == (status, status), (method, path)
    finally:
        conn.close()
    # A client of the earlier one-JSON-line protocol gets a JSON line that says what to speak, then the close.
    old = json.loads(raw(sock_path(b), b'{"operation": "READ", "type": "broker", "name": "broker"}\n'))
    assert old["status"] == 400 and "POST /management" in old["description"]
    no_length = raw(sock_path(b), b"POST /management HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
    assert no_length.startswith(b"HTTP/1.1 411 ")
    assert request(sock_path(b), "READ", "broker", "broker").status == 200  # and it serves on
    reasons = [e["reason"] for e in b.events() if e.get("event") == "admin_socket.bad_request"]
    assert any("/nope" in r for r in reasons) and any("Content-Length" in r for r in reasons)
    assert any("takes POST" in r for r in reasons)


def test_sigterm_removes_the_socket_and_a_stale_one_is_replaced(brokers: BrokerFactory) -> None:
    b = with_socket(brokers)
    path = sock_path(b)
    assert b.stop() == 0
    assert not path.exists()
    b.start()
    b.kill()  # SIGKILL leaves the socket file behind
    assert path.exists()
    b.start()
    assert request(path, "READ", "broker", "broker").status == 200


def test_a_socket_another_broker_serves_is_not_taken_over(brokers: BrokerFactory, tmp_path: Path) -> None:
    first = with_socket(brokers)
    path = sock_path(first)
    second = brokers("--admin-socket", str(path), name="second", start=False)
    second.start(wait=False)
    assert second.proc is not None and second.proc.wait(20) == 1
    assert "is served by another running broker" in second.stderr_file.read_text()
    assert request(path, "READ", "broker", "broker").body["name"] == first.name


def test_a_path_that_is_not_a_socket_or_too_long_is_refused(tmp_path: Path) -> None:
    plain = tmp_path / "file"
    plain.write_text("keep me")
    proc = subprocess.run(
        [
            str(BIN / "ha-broker"),
            "--port",
            "0",
            "--data-dir",
            str(tmp_path / "d"),
            "--admin-socket",
            str(plain),
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 1 and "exists and is not a socket" in proc.stderr
    assert plain.read_text() == "keep me"
    long_path = "/tmp/" + "s" * 120
    proc = subprocess.run(
        [str(BIN / "ha-broker"), "--admin-socket", long_path, "--validate-config"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 2 and "--admin-socket" in proc.stderr and "107 bytes" in proc.stderr


def test_a_stopped_broker_does_not_answer(brokers: BrokerFactory) -> None:
    """What makes a hung broker fail the agent's monitor: nothing comes back, however long the socket accepts."""
    b = with_socket(brokers)
    b.signal(signal.SIGSTOP)
    try:
        started = time.monotonic()
        with pytest.raises(AdminSocketError, match="no answer"):
            request(sock_path(b), "READ", "broker", "broker", timeout=1.0)
        assert time.monotonic() - started < 3
    finally:
        b.signal(signal.SIGCONT)
    assert wait_for(lambda: request(sock_path(b), "READ", "broker", "broker").status == 200, 5)


def test_ha_admin_uses_the_socket(brokers: BrokerFactory) -> None:
    b = with_socket(brokers, "--ha-cluster", "--ha-brokers-url", "127.0.0.1:1")
    path = str(sock_path(b))
    proc = subprocess.run([str(BIN / "ha-admin"), "--socket", path, "query"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["role"] == "backup"
    proc = subprocess.run([str(BIN / "ha-admin"), "--socket", path, "demote"], capture_output=True, text=True)
    assert proc.returncode == 1 and "demote refused" in proc.stderr and "not a primary" in proc.stderr
    proc = subprocess.run(
        [str(BIN / "ha-admin"), "--socket", path + ".missing", "ping"], capture_output=True, text=True
    )
    assert proc.returncode == 1 and "No such file" in proc.stderr


def test_connections_beyond_the_limit_get_503_and_a_freed_slot_serves_again(brokers: BrokerFactory) -> None:
    b = with_socket(brokers)
    path = str(sock_path(b))
    idle = []
    for _ in range(16):
        s = socket.socket(socket.AF_UNIX)
        s.connect(path)
        idle.append(s)
    try:
        refused = request(sock_path(b), "READ", "broker", "broker")
        assert refused.status == 503 and "too many admin connections" in refused.description
        idle.pop().close()
        assert wait_for(lambda: request(sock_path(b), "READ", "broker", "broker").status == 200, 5)
    finally:
        for s in idle:
            s.close()


# ----- fuzz: whatever arrives on the socket gets an answer, and nothing stored is lost --------------------------
FUZZ_SENTINEL = "socket-fuzz-sentinel"
POOL = ["a", "b", "x.y", "q|1", "a|b|k", "amq.topic", "$management"]
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


def mostly(good: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Well-formed values four times in five, so that valid requests meet each other; junk otherwise."""
    junk = JSON.filter(lambda v: v != FUZZ_SENTINEL)
    return st.integers(0, 4).flatmap(lambda i: junk if i == 0 else good)


ARGUMENT_KEYS = [*sorted(QUEUE_ARGUMENTS), "exchange-type", "source", "destination", "binding-key", "junk"]
WELL_TYPED = (
    st.sampled_from(POOL) | st.integers(-1, 10**6) | st.sampled_from(["ring", "reject", "all", "topic"])
)
REQUESTS = st.fixed_dictionaries(
    {
        "operation": mostly(
            st.sampled_from(["CREATE", "CREATE", "READ", "UPDATE", "DELETE", "QUERY", "create"])
        ),
        "type": mostly(st.sampled_from(["queue", "queue", "exchange", "binding", "broker"])),
        "name": mostly(st.sampled_from(POOL)),
    },
    optional={
        "body": st.dictionaries(st.sampled_from(ARGUMENT_KEYS), WELL_TYPED | JSON, max_size=4)
        | st.fixed_dictionaries(
            {"arguments": st.dictionaries(st.sampled_from(ARGUMENT_KEYS), WELL_TYPED | JSON)}
        )
        | JSON,
        "properties": mostly(st.dictionaries(st.text(max_size=8), JSON, max_size=3)),
    },
)
REQUEST_LINES = REQUESTS.map(lambda r: json.dumps(r).encode())
JUNK_LINES = st.one_of(
    JSON.map(lambda v: json.dumps(v).encode()),
    st.binary(max_size=40).map(lambda b: b.replace(b"\n", b"")),
)
LINES = st.integers(0, 9).flatmap(lambda i: JUNK_LINES if i == 0 else REQUEST_LINES)


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[BrokerProcess, Sentinel]]:
    f = BrokerFactory(tmp_path_factory.mktemp("socket-fuzz"))
    b = f("--admin-socket", str(f.workdir / "fz" / "admin.sock"), name="fz")
    yield b, Sentinel(b.url, FUZZ_SENTINEL)
    for _ in f.cleanup():
        pass


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lines=st.lists(LINES, min_size=1, max_size=8))
def test_fuzzed_lines_always_get_an_answer(
    fuzzed: tuple[BrokerProcess, Sentinel], lines: list[bytes]
) -> None:
    b, _ = fuzzed
    answers = exchange(sock_path(b), [line for line in lines if line.strip()])
    for a in answers:
        assert a["status"] in {200, 201, 204, 400, 403, 404, 409}, a


def test_after_the_fuzz_the_broker_serves_and_the_sentinel_is_intact(
    fuzzed: tuple[BrokerProcess, Sentinel],
) -> None:
    b, sentinel = fuzzed
    assert b.alive
    sentinel.check()
    assert not [e for e in b.events() if e.get("event") == "management.error"]
