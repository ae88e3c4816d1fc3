"""Fuzz `$management` with hypothesis against one real broker process.

Random operations (valid, miscased, junk, non-strings), types, names and attribute maps with random nested values.
Whatever the input, every request gets an answer with a 2xx/4xx status (never 500, never silence), and afterwards
the broker still serves and a sentinel queue filled beforehand is intact.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st
from proton import Delivery, Message, char, int32, symbol, timestamp, ubyte, ulong

from broker.client import ManagementClient
from broker.management import Management, Request, Response
from broker.wiring import Wiring
from tests.broker.helpers import Sentinel, outcome, send_raw
from tests.support.amqp import connect
from tests.support.procs import BrokerFactory, BrokerProcess

SENTINEL = "fuzz-sentinel"
ANSWERS = {200, 201, 204, 400, 403, 404, 409}
SEEN: dict[Any, int] = {}


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    f = BrokerFactory(tmp_path_factory.mktemp("fuzz"))
    yield f(name="fuzzed")
    for _ in f.cleanup():
        pass


@pytest.fixture(scope="module")
def sentinel(fuzzed: BrokerProcess) -> Sentinel:
    return Sentinel(fuzzed.url, SENTINEL)


@pytest.fixture(scope="module")
def client(fuzzed: BrokerProcess, sentinel: Sentinel) -> Iterator[ManagementClient]:
    m = ManagementClient(fuzzed.url, timeout=20)
    yield m
    m.close()


def safe_text(**kw: Any) -> st.SearchStrategy[str]:
    return st.text(**kw).filter(lambda s: SENTINEL not in s)


# Mostly well-formed requests (so random operations meet each other: create, bind, update, delete ...), mixed with
# junk of every kind. A small pool of names makes the well-formed ones collide.
POOL = ["a", "b", "c", "x.y", "q|1", "a|b|", "a|b|k", "amq.topic", "temp.1", "$management"]
INT64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
JUNK = st.one_of(safe_text(max_size=12), INT64, st.binary(max_size=5), st.booleans())


def mostly(valid: list[str]) -> st.SearchStrategy[Any]:
    """A value from `valid` 80% of the time, else junk or None (one_of alone would weigh the junk far higher)."""
    return st.tuples(st.integers(0, 9), st.sampled_from(valid), st.one_of(JUNK, st.none())).map(
        lambda t: t[1] if t[0] < 8 else t[2])


NAMES = st.sampled_from(POOL)
NAME = mostly(POOL)
OPERATION = mostly(["CREATE", "CREATE", "READ", "UPDATE", "DELETE", "QUERY", "create", "Query", "", "RELEASE"])
TYPE = mostly(["queue", "queue", "exchange", "exchange", "binding", "binding", "broker", "Queue"])
SCALAR = st.one_of(
    st.none(), st.booleans(), INT64, st.floats(allow_nan=True),
    safe_text(max_size=12), st.binary(max_size=8), st.sampled_from(["ring", "reject", "all", "none", "configuration",
                                                                    "fanout", "topic", "direct", "10", "-1", "true"]),
    NAMES, st.integers(min_value=0, max_value=12),
    st.integers(min_value=0, max_value=2**64 - 1).map(ulong), st.sampled_from([symbol("s"), char("c"), ubyte(7),
                                                                                int32(-3), timestamp(1000)]),
    st.sampled_from([ulong(2**63), ulong(2**64 - 1)]),  # no long holds these: hypothesis seldom draws them itself
    st.uuids(),
)
VALUE = st.recursive(SCALAR, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                    st.dictionaries(safe_text(max_size=8), inner, max_size=3)),
                     max_leaves=8)
KEY = st.one_of(st.sampled_from(["arguments", "max-count", "max-size", "limit-policy", "default-ttl",
                                 "priority-levels", "lvq-key", "exclusive", "auto-delete", "auto-delete-timeout",
                                 "alternate-exchange", "qpid.replicate", "exchange-type", "type-name", "source",
                                 "destination", "binding-key", "attributeNames", "name"]),
                safe_text(max_size=8))
ARGUMENTS = st.dictionaries(KEY, VALUE, max_size=4)
MAP = st.dictionaries(KEY, st.one_of(VALUE, ARGUMENTS, NAMES), max_size=5)
BODY = st.one_of(MAP, MAP, MAP, st.none(), VALUE)
EXTRA_PROPS = st.dictionaries(st.sampled_from(["index", "x", "statusCode", "reply-to"]), VALUE, max_size=2)


def request(client: ManagementClient, properties: dict[str, Any], body: Any) -> tuple[Any, Any]:
    """Send one request as given (no client-side checks) and return the reply's statusCode and description."""
    msg = Message(properties={k: v for k, v in properties.items() if v is not None}, body=body)
    try:
        msg.encode()
    except Exception:
        assume(False)  # proton cannot even encode it: nothing to send
    reply = client.rpc.call(msg)
    props: dict[Any, Any] = reply.properties or {}
    return props.get("statusCode"), props.get("statusDescription")


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(operation=OPERATION, type_=TYPE, name=NAME, body=BODY, extra=EXTRA_PROPS)
def test_management_answers_every_request_and_loses_nothing(
    client: ManagementClient, operation: Any, type_: Any, name: Any, body: Any, extra: dict[str, Any]
) -> None:
    status, description = request(client, {**extra, "operation": operation, "type": type_, "name": name}, body)
    SEEN[status] = SEEN.get(status, 0) + 1
    assert status in ANSWERS, (status, description)
    assert isinstance(description, str) and description


@settings(max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(operation=OPERATION, type_=TYPE, name=NAME, body=BODY, admin=st.booleans())
@example(operation="CREATE", type_="queue", name="a", body={"arguments": {"max-count": ulong(2**63)}}, admin=True)
def test_management_core_never_raises(operation: Any, type_: Any, name: Any, body: Any, admin: bool) -> None:
    """The same inputs straight into the pure request handler (no sockets, many more examples): no exception
    escapes, so the server never has to answer 500."""
    if not isinstance(operation, str) or not isinstance(type_, str) or not (name is None or isinstance(name, str)):
        return  # the server answers these 400 before the core sees them
    resp = CORE.handle(Request(operation, type_, name, body, None, admin, {}))
    assert resp.status in ANSWERS, (resp.status, resp.description)
    encodable(resp)  # the reply can go back; and what the request left behind can still be listed
    for listed in ("queue", "exchange", "binding"):
        encodable(CORE.handle(Request("QUERY", listed, None, None, None, admin, {})))
    if not admin and operation.upper() in ("CREATE", "UPDATE", "DELETE") and resp.status < 300:
        raise AssertionError(f"{operation} succeeded without the admin role")


CORE = Management(Wiring(), lambda: {"name": "core"})


def encodable(resp: Response) -> None:
    Message(properties={"statusCode": resp.status, "statusDescription": resp.description, **resp.properties},
            body=resp.body).encode()


def test_after_the_fuzz_the_broker_serves_and_nothing_is_lost(
    fuzzed: BrokerProcess, sentinel: Sentinel, client: ManagementClient
) -> None:
    """Runs after the fuzz (file order). Also checks junk that is not a message at all, sent to `$management`."""
    c = connect(fuzzed.url)
    try:
        d = send_raw(c, "$management", b"\x00Sw\xa1\x03abc" + b"junk")
        assert outcome(d)[0] in (Delivery.REJECTED, Delivery.ACCEPTED)
    finally:
        c.close()
    assert fuzzed.alive
    assert client.call("READ", "broker").body["name"] == "fuzzed"
    for type_ in ("queue", "exchange", "binding"):  # whatever the fuzz created can still be listed
        assert client.request("QUERY", type_, None).status == 200
    sentinel.check()
    print("statuses seen by the fuzz:", dict(sorted(SEEN.items())))
    errors = [e for e in fuzzed.events() if e.get("level") == "error"]
    assert errors == [], errors[:3]
