"""Bad input gets its precise AMQP error or management status and leaves every stored message intact.

One broker for the module (auto-create off, 4 KiB max message size) holds a sentinel queue filled before any bad
input; every test ends by proving the sentinel's messages are all there, unchanged and not acquired.
"""

from __future__ import annotations

import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from proton import Delivery, Message, symbol, ulong
from proton.utils import BlockingConnection, ConnectionClosed, LinkDetached

from tests.broker.helpers import EngineClient, Sentinel, big_message, outcome, send_raw, stored
from tests.support.amqp import connect, drain, mgmt, receive, send
from tests.support.procs import ROOT, BrokerFactory, BrokerProcess, wait_for

MAX_SIZE = 4096
DEEP: list[object] = []
for _ in range(40):
    DEEP = [DEEP]


@pytest.fixture(scope="module")
def strict(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    f = BrokerFactory(tmp_path_factory.mktemp("bad-input"))
    yield f("--max-message-size", str(MAX_SIZE), name="strict")
    for _ in f.cleanup():
        pass


@pytest.fixture(scope="module")
def sentinel(strict: BrokerProcess) -> Sentinel:
    return Sentinel(strict.url, "sentinel")


@pytest.fixture
def intact(sentinel: Sentinel, strict: BrokerProcess) -> Iterator[Sentinel]:
    """Checks after the test that the sentinel queue is untouched and the broker still serves."""
    yield sentinel
    assert strict.alive
    sentinel.check()


def create(url: str, type_: str, name: str | None, body: dict[str, Any]) -> None:
    with mgmt(url) as m:
        m.call("CREATE", type_, name, body)


def condition_name(e: LinkDetached) -> str | None:
    cond = e.link.remote_condition
    return cond.name if cond is not None else None


# ----- management --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("operation", "type_", "name", "body", "status", "words"),
    [
        ("FROB", "queue", "x", {}, 400, "unknown operation"),
        ("", "queue", "x", {}, 400, "unknown operation"),
        ("READ", "gizmo", "x", {}, 400, "unknown type"),
        ("CREATE", "queue", None, {}, 400, "missing name"),
        ("CREATE", "exchange", None, {"exchange-type": "fanout"}, 400, "missing name"),
        ("CREATE", "queue", "", {}, 400, "missing name"),
        ("CREATE", "queue", "$reserved", {}, 400, "reserved"),
        ("CREATE", "queue", "bad-count", {"arguments": {"max-count": "abc"}}, 400, "max-count"),
        ("CREATE", "queue", "bad-count2", {"arguments": {"max-count": -5}}, 400, "max-count"),
        ("CREATE", "queue", "bad-prio", {"arguments": {"priority-levels": 99}}, 400, "priority-levels"),
        # a ulong that no reply could carry back as a long (it broke every later QUERY and backup catch-up)
        ("CREATE", "queue", "big-count", {"arguments": {"max-count": ulong(2**63)}}, 400, "max-count: must be <="),
        ("CREATE", "queue", "big-ttl", {"arguments": {"default-ttl": "99999999999999999999"}}, 400, "default-ttl"),
        ("CREATE", "queue", "big-own", {"arguments": {"x-own": [ulong(2**64 - 1)]}}, 400, "x-own: integer"),
        ("CREATE", "exchange", "big-x", {"exchange-type": "fanout", "arguments": {"x-own": ulong(2**63)}}, 400,
         "out of range"),
        ("UPDATE", "queue", "sentinel", {"max-size": ulong(2**63)}, 400, "max-size: must be <="),
        ("CREATE", "queue", "deep", {"arguments": {"x-deep": DEEP}}, 400, "x-deep: lists and maps nested more than"),
        ("CREATE", "queue", "bad-repl", {"arguments": {"qpid.replicate": "sometimes"}}, 400, "qpid.replicate"),
        ("CREATE", "queue", "bad-policy", {"arguments": {"limit-policy": "drop"}}, 400, "limit-policy"),
        ("CREATE", "queue", "bad-args", {"arguments": ["max-count", 1]}, 400, "arguments must be a map"),
        ("CREATE", "exchange", "bad-type", {"exchange-type": "headers"}, 400, "exchange type"),
        ("CREATE", "exchange", "bad-repl-x", {"arguments": {"qpid.replicate": 3}}, 400, "qpid.replicate"),
        ("CREATE", "binding", None, {"source": "amq.nothing"}, 400, "binding needs"),
        ("CREATE", "binding", None, {"source": 1, "destination": "sentinel"}, 400, "binding needs"),
        ("DELETE", "queue", "never-was", {}, 404, "not found"),
        ("DELETE", "exchange", "never-was", {}, 404, "not found"),
        ("DELETE", "binding", "never|was|here", {}, 404, "not found"),
        ("READ", "queue", "never-was", {}, 404, "not found"),
        ("UPDATE", "queue", "sentinel", {"max-count": "abc"}, 400, "max-count"),
        ("UPDATE", "queue", "sentinel", {"priority-levels": 5}, 400, "cannot update"),
        ("UPDATE", "queue", "never-was", {"max-count": 5}, 404, "not found"),
        ("CREATE", "queue", "sentinel", {"arguments": {"max-count": 1001}}, 409, "different arguments"),
        ("CREATE", "queue", "sentinel", {"arguments": {}}, 409, "different arguments"),
        ("CREATE", "exchange", "sentinel", {"exchange-type": "fanout"}, 409, "queue named"),
        ("READ", "broker", None, {}, 200, "OK"),
    ],
)
def test_management_errors_have_precise_status(
    strict: BrokerProcess, intact: Sentinel, operation: str, type_: str, name: str | None, body: Any,
    status: int, words: str,
) -> None:
    with mgmt(strict.url) as m:
        r = m.request(operation, type_, name, body)
    assert (r.status, words in r.description) == (status, True), r.description
    if 400 <= status < 500 and name not in (None, "", "sentinel"):
        with mgmt(strict.url) as m:
            assert m.request("READ", type_, name).status in (400, 404)  # nothing half-created


def test_non_string_operation_and_body_are_refused(strict: BrokerProcess, intact: Sentinel) -> None:
    with mgmt(strict.url) as m:
        assert m.request(7, "queue", "x").status == 400  # type: ignore[arg-type]
        assert m.request("READ", "queue", 42).status == 400  # type: ignore[arg-type]
        assert m.request("CREATE", "queue", "list-body", [1, 2]).status == 400
        assert m.request("READ", "queue", "list-body").status == 404


def test_a_reply_that_cannot_be_encoded_is_answered_500_and_the_link_keeps_serving(
        brokers: BrokerFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """A bug that builds a reply proton cannot encode: the client gets a 500 saying what was done (not a closed link
    and a timeout), the same link answers the next request, and the error is logged once."""
    monkeypatch.setenv("PYTHONPATH", str(ROOT))  # the broker process imports tests.support.reply_plugin
    b = brokers("--plugin", "tests.support.reply_plugin:install")
    with mgmt(b.url) as m:
        r = m.request("UNENCODABLE", "test-reply", "x")
        assert r.status == 500, r.description
        assert r.description.startswith("UNENCODABLE test-reply was carried out (200 done), but its reply cannot be "
                                        "encoded: OverflowError"), r.description
        assert m.request("CREATE", "queue", "after").status == 201
        assert m.request("QUERY", "queue", None).status == 200
    assert [(e["event"], e["operation"]) for e in b.events() if e.get("level") == "error"] == [
        ("management.error", "UNENCODABLE")]


def test_duplicate_create_same_arguments_is_200_different_is_409(strict: BrokerProcess, intact: Sentinel) -> None:
    url = strict.url
    with mgmt(url) as m:
        assert m.request("CREATE", "queue", "dup", {"arguments": {"max-count": 10, "limit-policy": "ring"}}).status == 201
        send(url, "dup", ["kept-1", "kept-2"])
        same = m.request("CREATE", "queue", "dup", {"arguments": {"max-count": 10, "limit-policy": "ring"}})
        assert same.status == 200
        assert same.body["depth"] == 2
        # "10" normalises to 10: the same arguments.
        assert m.request("CREATE", "queue", "dup", {"arguments": {"max-count": "10", "limit-policy": "ring"}}).status == 200
        different = m.request("CREATE", "queue", "dup", {"arguments": {"max-count": 11, "limit-policy": "ring"}})
        assert different.status == 409
        assert m.call("READ", "queue", "dup").body["arguments"] == {"max-count": 10, "limit-policy": "ring"}
        assert m.request("CREATE", "exchange", "dup-x", {"exchange-type": "topic"}).status == 201
        assert m.request("CREATE", "exchange", "dup-x", {"exchange-type": "topic"}).status == 200
        assert m.request("CREATE", "exchange", "dup-x", {"exchange-type": "fanout"}).status == 409
        assert m.call("READ", "exchange", "dup-x").body["exchange-type"] == "topic"
        assert m.request("CREATE", "queue", "dup-x", {}).status == 409  # an exchange has that name
    assert stored(url, "dup") == ["kept-1", "kept-2"]


# ----- messages ----------------------------------------------------------------------------------------------------
@pytest.fixture
def target(strict: BrokerProcess, request: pytest.FixtureRequest) -> str:
    name = "t-" + request.node.name.replace("[", "-").replace("]", "")[:60]
    create(strict.url, "queue", name, {})
    send(strict.url, name, ["before"])
    return name


def test_a_last_value_key_that_is_not_a_simple_value_is_rejected_and_nothing_routed(
        strict: BrokerProcess, intact: Sentinel) -> None:
    """AMQP allows only simple values in application-properties; a list or a map as the key of a last-value queue
    closed the link with amqp:internal-error (TypeError: unhashable). Now: rejected with amqp:decode-error before
    any queue of the exchange takes it, the link open; an operator's move of such a message into a last-value queue
    is refused whole."""
    url = strict.url
    with mgmt(url) as m:
        m.call("CREATE", "queue", "lv-plain", {})
        m.call("CREATE", "queue", "lv-last", {"arguments": {"lvq-key": "k"}})
        m.call("CREATE", "exchange", "lv-fan", {"exchange-type": "fanout"})
        for q in ("lv-plain", "lv-last"):
            m.call("CREATE", "binding", None, {"source": "lv-fan", "destination": q, "binding-key": ""})
    c = connect(url)
    try:
        link = c.create_sender("lv-fan").link
        for tag, props in enumerate([{"k": [1, 2]}, {"k": {"x": 1}}, {"k": "a"}]):  # one link for all three
            d = link.delivery(str(tag))
            link.send(Message(body=f"m{tag}", properties=props).encode())
            link.advance()
            c.wait(lambda d=d: d.remote_state != 0, timeout=10, msg="the broker's outcome")
            if tag < 2:
                assert outcome(d) == (Delivery.REJECTED, "amqp:decode-error")
                assert "application property 'k' must be a simple value" in d.remote.condition.description
            else:
                assert outcome(d) == (Delivery.ACCEPTED, None)
    finally:
        c.close()
    send(url, "lv-fan", ["b1", "b2"], properties={"k": b"\x01"})  # a binary key (it was unhashable too) replaces
    assert drain(url, "lv-plain") == ["m2", "b1", "b2"] and drain(url, "lv-last") == ["m2", "b2"]
    send(url, "lv-plain", ["keyed"], properties={"k": [3]})  # fine on a queue without a last-value key
    with mgmt(url) as m:
        r = m.request("MOVE", "queue", "lv-plain", {"destination": "lv-last"})
        assert r.status == 409 and r.description.endswith("got list; nothing moved"), r.description
    assert drain(url, "lv-plain", browse=True) == ["keyed"] and drain(url, "lv-last") == []
    assert [e for e in strict.events() if e.get("level") == "error"] == []


def test_a_subject_of_a_thousand_words_is_routed_by_a_topic_exchange(strict: BrokerProcess, intact: Sentinel) -> None:
    """Topic matching recursed once per word: past ~900 words the publisher's link closed with internal-error."""
    url = strict.url
    with mgmt(url) as m:
        m.call("CREATE", "queue", "words", {})
        m.call("CREATE", "exchange", "words-topic", {"exchange-type": "topic"})
        m.call("CREATE", "binding", None, {"source": "words-topic", "destination": "words", "binding-key": "#.end"})
    subject = "w." * 1500 + "end"  # 3,003 bytes: within the 4 KiB limit with its body
    send(url, "words-topic", ["long"], subject=subject)
    send(url, "words-topic", ["elsewhere"], subject=subject + ".more")  # routed nowhere: accepted, dropped
    assert drain(url, "words") == ["long"]
    assert [e for e in strict.events() if e.get("level") == "error"] == []


def test_connection_properties_nested_too_deeply_are_refused_with_decode_error(
        strict: BrokerProcess, intact: Sentinel) -> None:
    """proton reads them recursively: the open was never answered (the client waited out its timeout) and the
    broker logged a bug. Now the connection is refused at once with amqp:decode-error."""
    deep: Any = "x"
    for _ in range(3000):
        deep = [deep]
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(100_000)  # for this client's own encoder
    try:
        with pytest.raises(ConnectionClosed) as e:
            BlockingConnection(strict.url, timeout=10, properties={symbol("deep"): deep})
    finally:
        sys.setrecursionlimit(limit)
    assert "Condition('amqp:decode-error', 'connection properties nested too deeply to read')" in str(e.value)
    assert [e for e in strict.events() if e.get("level") == "error"] == []


@pytest.mark.parametrize("size", [MAX_SIZE * 2, 300_000])  # one frame; many frames (checked while partial)
def test_oversize_message_detaches_with_message_size_exceeded(
    strict: BrokerProcess, intact: Sentinel, target: str, size: int
) -> None:
    c = connect(strict.url)
    try:
        s = c.create_sender(target)
        with pytest.raises(LinkDetached) as exc:
            s.send(big_message(size))
        assert condition_name(exc.value) == "amqp:link:message-size-exceeded"
        # The connection survives: a new link on it still works.
        c.create_sender(target, name="after").send(Message(body="after"))
    finally:
        c.close()
    assert stored(strict.url, target) == ["before", "after"]


def test_message_just_under_the_limit_is_accepted(strict: BrokerProcess, intact: Sentinel, target: str) -> None:
    body = b"y" * (MAX_SIZE - 100)
    assert len(Message(body=body).encode()) <= MAX_SIZE
    send(strict.url, target, [body])
    assert stored(strict.url, target) == ["before", body]


GOOD = bytes(Message(body="valid", subject="s", properties={"k": 1}).encode())


@pytest.mark.parametrize(
    "payload",
    [b"garbage", GOOD[: len(GOOD) // 2], GOOD + b"\x00", b"\x00Sw", b"\x00Sw\xa1\x01x\x00Sp\x45", b"",
     b"\x00" * 3000, b"\x00Sw" + b"\x00\x53\x01" * 1000 + b"\x45"],  # (the last two: RecursionError, link closed)
    ids=["garbage", "truncated", "trailing-byte", "cut-descriptor", "sections-out-of-order", "empty",
         "descriptor-chain", "described-chain-body"],
)
def test_malformed_message_is_rejected_with_decode_error(
    strict: BrokerProcess, intact: Sentinel, target: str, payload: bytes
) -> None:
    c = connect(strict.url)
    try:
        d = send_raw(c, target, payload)
        assert outcome(d) == (Delivery.REJECTED, "amqp:decode-error")
        # The link stays usable: a well-formed message after it is accepted.
        d2 = send_raw(c, target, GOOD)
        assert outcome(d2) == (Delivery.ACCEPTED, None)
    finally:
        c.close()
    assert stored(strict.url, target) == ["before", "valid"]


@pytest.mark.parametrize("direction", ["sender", "receiver"])
def test_unknown_address_is_not_found_on_attach(strict: BrokerProcess, intact: Sentinel, direction: str) -> None:
    c = connect(strict.url)
    try:
        with pytest.raises(LinkDetached) as exc:
            if direction == "sender":
                c.create_sender("no-such-queue")
            else:
                c.create_receiver("no-such-queue")
        assert condition_name(exc.value) == "amqp:not-found"
    finally:
        c.close()
    with mgmt(strict.url) as m:
        assert m.request("READ", "queue", "no-such-queue").status == 404  # auto-create is off


def test_anonymous_relay_to_unknown_address_is_rejected_not_found(
    strict: BrokerProcess, intact: Sentinel, target: str
) -> None:
    c = connect(strict.url)
    try:
        d = send_raw(c, None, bytes(Message(body="lost", address="nowhere").encode()))
        assert outcome(d) == (Delivery.REJECTED, "amqp:not-found")
        d = send_raw(c, None, bytes(Message(body="no-to").encode()))
        assert outcome(d) == (Delivery.REJECTED, "amqp:precondition-failed")
        d = send_raw(c, None, bytes(Message(body="relayed", address=target).encode()))
        assert outcome(d) == (Delivery.ACCEPTED, None)
    finally:
        c.close()
    assert stored(strict.url, target) == ["before", "relayed"]


# ----- clients vanishing -------------------------------------------------------------------------------------------
def closed_connections(b: BrokerProcess) -> int:
    return sum(1 for e in b.events() if e["event"] == "connection.closed")


@pytest.mark.parametrize("reset", [False, True], ids=["fin", "rst"])
def test_client_vanishing_mid_transfer_loses_nothing(
    strict: BrokerProcess, intact: Sentinel, target: str, reset: bool
) -> None:
    """A hand-driven client attaches, gets credit, and starts a multi-frame transfer; it writes half of the bytes
    and drops the socket. The partial message is not enqueued; the broker serves on."""
    closed_before = closed_connections(strict)
    client = EngineClient(strict.port or 0)
    snd = client.sender(target)
    d = snd.delivery(b"big")
    snd.send(bytes(big_message(MAX_SIZE - 200).encode()))  # under the limit, several frames at the broker's frame size
    snd.advance()
    wire = client.pending_bytes()
    assert len(wire) > MAX_SIZE // 2
    client.write_and_vanish(wire[: len(wire) // 2], reset)
    assert d.remote_state == 0
    wait_for(lambda: closed_connections(strict) > closed_before, what="the broker to notice the vanished client")
    assert stored(strict.url, target) == ["before"]
    send(strict.url, target, ["after"])
    assert receive(strict.url, target, 2) == ["before", "after"]


def test_consumer_reset_with_unsettled_messages_gets_them_back(
    strict: BrokerProcess, intact: Sentinel, target: str
) -> None:
    """A consumer holding unsettled messages vanishes with a TCP reset: the broker notices, and the messages come
    back (redelivered) for the next consumer."""
    send(strict.url, target, ["m1", "m2"])
    client = EngineClient(strict.port or 0)
    client.receiver(target, 2)
    with mgmt(strict.url) as m:
        assert m.call("READ", "queue", target).body["acquired"] == 2
    client.write_and_vanish(b"", reset=True)

    def returned() -> bool:
        with mgmt(strict.url) as m:
            return bool(m.call("READ", "queue", target).body["acquired"] == 0)

    wait_for(returned, what="the reset consumer's messages to come back")
    c = connect(strict.url)
    try:
        r = c.create_receiver(target, credit=3)
        got = [r.receive(10) for _ in range(3)]
        r.accept()
    finally:
        c.close()
    assert [(m.body, m.delivery_count) for m in got] == [("before", 1), ("m1", 1), ("m2", 0)]


@pytest.mark.parametrize(
    "junk",
    [b"AMQP\x00\x01\x00\x00\x00\x00\x01\x00\x02\x00", b"AMQP\x03\x01\x00\x00\x00\x00", b"AM", b"GET / HTTP/1.1\r\n\r\n"],
    ids=["half-open-frame", "half-sasl", "half-header", "http"],
)
def test_raw_socket_with_half_a_frame_does_not_hurt(strict: BrokerProcess, intact: Sentinel, junk: bytes) -> None:
    s = socket.create_connection(("127.0.0.1", strict.port or 0), timeout=10)
    s.sendall(junk)
    s.close()
    with mgmt(strict.url) as m:
        assert m.call("READ", "broker").body["name"] == "strict"


def test_consumer_killed_with_unsettled_messages_gets_them_back(
    strict: BrokerProcess, intact: Sentinel, target: str, tmp_path: Path
) -> None:
    """A consumer in another process is SIGKILLed holding unsettled messages: all come back, in order."""
    import subprocess
    import sys

    from tests.support.procs import ROOT

    send(strict.url, target, ["m1", "m2"])
    script = (
        "import sys\n"
        "from proton.utils import BlockingConnection\n"
        f"c = BlockingConnection({strict.url!r}, reconnect=False)\n"
        f"r = c.create_receiver({target!r}, credit=3)\n"
        "for _ in range(3):\n"
        "    r.receive(10)\n"
        "print('holding', flush=True)\n"
        "sys.stdin.read()\n"
    )
    p = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=ROOT)
    try:
        assert p.stdout is not None
        assert p.stdout.readline().strip() == b"holding"
        with mgmt(strict.url) as m:
            assert m.call("READ", "queue", target).body["acquired"] == 3
        p.kill()
    finally:
        p.kill()
        p.wait(10)

    def returned() -> bool:
        with mgmt(strict.url) as m:
            return bool(m.call("READ", "queue", target).body["acquired"] == 0)

    wait_for(returned, what="the killed consumer's messages to come back")
    assert receive(strict.url, target, 3) == ["before", "m1", "m2"]
