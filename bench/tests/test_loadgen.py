"""The C load generator itself: its message format (read back by python-qpid-proton), the stamp parser on messages
encoded by proton, its errors and exit codes, the hop mode, and one short send/receive against the proton-C example
broker when that builds too. Skipped when gcc or the proton-C headers are missing (under CI the skip fails: conftest.py). Run:
.venv/bin/pytest bench/tests
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
from proton import Message

from bench import cclient, native
from bench.protonc import ProtonCBroker
from bench.targets import ClientSpec


@pytest.fixture(scope="module")
def loadgen() -> Path:
    binary, why = native.try_loadgen()
    if binary is None:
        pytest.skip(f"C load generator not built: {why}")
    return binary


def _json(stdout: str) -> dict[str, object]:
    line = next(x for x in stdout.splitlines() if x.startswith("{"))
    return dict(json.loads(line))


def _now_ns() -> int:
    return time.monotonic_ns()


@pytest.mark.parametrize(("size", "durable"), [(128, False), (8, True), (300, True), (70000, False)])
def test_encoded_message_decodes_with_the_body_stamped_first(loadgen: Path, size: int, durable: bool) -> None:
    t0 = _now_ns()
    raw = subprocess.run([str(loadgen), "encode", "--size", str(size)] + (["--durable"] if durable else []),
                         capture_output=True, check=True, timeout=10).stdout
    m = Message()
    m.decode(raw)
    assert isinstance(m.body, bytes | memoryview), type(m.body)
    body = bytes(m.body)
    assert len(body) == size and m.durable is durable
    stamp = int.from_bytes(body[:8], "little")
    assert t0 <= stamp <= _now_ns()  # CLOCK_MONOTONIC ns, as time.monotonic_ns()
    assert body[8:] == b"x" * (size - 8)


def _stamp_of(loadgen: Path, raw: bytes) -> object:
    out = subprocess.run([str(loadgen), "stamp"], input=raw, capture_output=True, check=True, timeout=10).stdout
    return json.loads(out)["stamp"]


def test_stamp_is_found_behind_every_other_section(loadgen: Path) -> None:
    t = 123456789012345
    body = t.to_bytes(8, "little") + b"y" * 40
    m = Message(body=body, durable=True, priority=7, ttl=5.0, id="m-1", subject="s", address="q",
                properties={"k": "v", "n": 3}, annotations={"x-opt-a": "b"}, instructions={"x-i": 1})
    m.inferred = True  # bytes body as a data section
    assert _stamp_of(loadgen, bytes(m.encode())) == t
    m.inferred = False  # amqp-value holding binary (the Python clients' encoding)
    assert _stamp_of(loadgen, bytes(m.encode())) == t


def test_no_stamp_in_short_or_non_binary_bodies(loadgen: Path) -> None:
    assert _stamp_of(loadgen, bytes(Message(body="a string body, not binary").encode())) is None
    short = Message(body=b"1234567")
    short.inferred = True
    assert _stamp_of(loadgen, bytes(short.encode())) is None
    assert _stamp_of(loadgen, b"\x00\x53") is None  # truncated


def test_usage_errors_exit_1(loadgen: Path) -> None:
    for args in (["fly"], ["send"], ["send", "--address", "q", "--window", "0"], ["send", "--address", "q",
                                                                                  "--count", "ten"]):
        r = subprocess.run([str(loadgen), *args], capture_output=True, text=True, timeout=10)
        assert r.returncode == 1, args


def test_connection_refused_exits_2_with_the_error_in_the_json(loadgen: Path) -> None:
    r = subprocess.run([str(loadgen), "send", "--url", "127.0.0.1:1", "--address", "q", "--count", "5",
                        "--timeout", "20"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 2
    d = _json(r.stdout)
    assert d["started"] is False and d["sent"] == 0 and "connection failed" in str(d["error"])
    assert "refused" in r.stderr.lower()


def test_hop_mode_reports_half_the_median_round_trip(loadgen: Path) -> None:
    r = subprocess.run([str(loadgen), "hop", "--count", "300"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    d = _json(r.stdout)
    assert d["samples"] == 300 and d["error"] is None
    rtt = d["rtt_us"]
    assert isinstance(rtt, dict) and d["hop_us"] == pytest.approx(rtt["p50"] / 2)
    assert 0 < rtt["min"] <= rtt["p50"] <= rtt["p99"]


@pytest.fixture(scope="module")
def c_broker(tmp_path_factory: pytest.TempPathFactory) -> ProtonCBroker:  # type: ignore[misc]
    try:
        native.c_broker()
    except native.BuildError as e:
        pytest.skip(f"proton-C example broker not built: {e}")
    b = ProtonCBroker()
    b.start(tmp_path_factory.mktemp("pcb"))
    yield b
    b.stop()


def test_send_then_receive_through_the_example_broker(loadgen: Path, c_broker: ProtonCBroker,
                                                      tmp_path: Path) -> None:
    spec = c_broker.client()
    accepted, seconds, d = cclient.fill(loadgen, spec, "t-fill", 300, 64, False, window=50, timeout=30)
    assert accepted == 300 and seconds > 0 and d["other_outcomes"] == 0
    samples = tmp_path / "rx.f32"
    rx = cclient.CClient(cclient.argv(loadgen, spec, cclient.LoadgenArgs(
        "receive", "t-fill", 300, 64, credit=20, timeout=30, barrier="stdin", progress_ms=10,
        samples_file=str(samples))), "consumer")
    try:
        rx.wait_ready(20)
        rx.send("go")
        r = cclient.loop_result(rx.wait_result(30))
    finally:
        rx.close()
    assert r.error is None and r.received == 300 and r.cpu_seconds >= 0
    lat = cclient.read_samples(samples)
    assert len(lat) == 300 and min(lat) >= 0


def test_sync_mode_and_a_stopped_receiver(loadgen: Path, c_broker: ProtonCBroker, tmp_path: Path) -> None:
    spec = c_broker.client()
    rx = cclient.CClient(cclient.argv(loadgen, spec, cclient.LoadgenArgs(
        "receive", "t-sync", 0, credit=10, timeout=30, progress_ms=10)), "consumer")
    tx = cclient.CClient(cclient.argv(loadgen, spec, cclient.LoadgenArgs(
        "sync", "t-sync", 50, 16, timeout=30, samples_file=str(tmp_path / "tx.f32"))), "publisher")
    try:
        rx.wait_ready(20)
        tx.wait_ready(20)
        rx.send("go")
        tx.send("go")
        d = tx.wait_result(30)
        deadline = time.monotonic() + 20
        while rx.received < 50 and time.monotonic() < deadline:
            time.sleep(0.01)
        rx.send("stop")
        r = cclient.loop_result(rx.wait_result(30))
    finally:
        tx.close()
        rx.close()
    assert d["mode"] == "sync" and d["window"] == 1 and d["accepted"] == 50 and d["error"] is None
    lat = d["latency_ms"]
    assert isinstance(lat, dict) and lat["samples"] == 50 and 0 < lat["p50"] <= lat["p99"]
    assert r.received == 50 and r.error is None and r.end >= r.start > 0


def test_a_client_that_cannot_attach_is_reported(loadgen: Path) -> None:
    c = cclient.CClient(cclient.argv(loadgen, ClientSpec("127.0.0.1:1"), cclient.LoadgenArgs("send", "q", 5,
                                                                                             timeout=10)), "pub")
    try:
        with pytest.raises(RuntimeError, match="ended before READY: connection failed"):
            c.wait_ready(20)
    finally:
        c.close()
