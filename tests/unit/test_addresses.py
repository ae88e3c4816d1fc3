"""`broker.config.parse_address`: the one reading of host:port (--ha-brokers-url, --ha-public-url, and the
`--broker` of ha-admin and ha-status), IPv6 in brackets as in a URL (RFC 3986) and as the OCF agent reads it."""

from __future__ import annotations

import pytest

from broker.config import parse_address, parse_zk_hosts


@pytest.mark.parametrize(("text", "default", "expected"), [
    ("h:1", None, ("h", 1)),
    (" h.example.com:5672 ", None, ("h.example.com", 5672)),
    ("amqp://user:pw@10.0.0.1:5673/queue", None, ("10.0.0.1", 5673)),
    ("[::1]:5672", None, ("::1", 5672)),
    ("[fe80::1:2]:99", None, ("fe80::1:2", 99)),
    ("h", 5672, ("h", 5672)),
    ("[::1]", 5672, ("::1", 5672)),
    ("amqps://h", 5671, ("h", 5671)),
])
def test_good_addresses(text: str, default: int | None, expected: tuple[str, int]) -> None:
    assert parse_address(text, default) == expected


@pytest.mark.parametrize(("text", "default", "reason"), [
    ("nohost", None, "'nohost' is not host:port"),
    (":5672", 5672, "':5672' is not host:port"),
    ("", 5672, "'' is not host:port"),
    ("h:", 5672, "'h:': port '' is not a number"),
    ("h:abc", None, "'h:abc': port 'abc' is not a number"),
    ("h:0", None, "'h:0': port 0 out of range 1-65535"),
    ("h:70000", None, "'h:70000': port 70000 out of range 1-65535"),
    ("::1", 5672, "'::1': an IPv6 address needs brackets (as [::1]:5672)"),  # was host ':' port 1
    ("fe80::1:5672", None, "'fe80::1:5672': an IPv6 address needs brackets (as [::1]:5672)"),
    ("[::1", 5672, "'[::1' is not host:port (an IPv6 address as [::1]:5672)"),
    ("[::1]5672", None, "'[::1]5672' is not host:port (an IPv6 address as [::1]:5672)"),
    ("[]:5672", None, "'[]:5672' is not host:port (an IPv6 address as [::1]:5672)"),
    ("[::1]", None, "'[::1]' is not host:port"),
])
def test_bad_addresses_say_why(text: str, default: int | None, reason: str) -> None:
    with pytest.raises(ValueError) as e:
        parse_address(text, default)
    assert str(e.value) == reason


def test_zookeeper_hosts_as_kazoo_reads_them() -> None:
    assert parse_zk_hosts("z1:2181,z2,[::1]:2182/understudy") == [("z1", 2181), ("z2", 2181), ("::1", 2182)]
    for text, reason in [("z1:notaport", "'z1:notaport': port 'notaport' is not a number"),
                         (",", "empty list of ZooKeeper servers"), ("z1,::1", "'::1': an IPv6 address needs brackets")]:
        with pytest.raises(ValueError) as e:
            parse_zk_hosts(text)
        assert str(e.value).startswith(reason)
