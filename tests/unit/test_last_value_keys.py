"""Last-value keys read from a message's application properties (`broker.message.current_key` and
`last_value_key_of`): simple values key a queue; a list, a map or properties nested too deeply are a malformed
message on the way in, and no key at promotion (where a replica re-indexes what it holds)."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from proton import Message, symbol, ulong

from broker.errors import MalformedMessage
from broker.message import current_key, decode, last_value_key_of


def encoded(props: dict[str, Any] | None) -> bytes:
    return bytes(Message(body="x", properties=props).encode())


@pytest.mark.parametrize("key", ["IBM", symbol("s"), b"\x01", 7, ulong(2**64 - 1), 2.5, True,
                                 uuid.UUID(int=5)])
def test_simple_values_are_keys(key: Any) -> None:
    data = encoded({"k": key})
    decode(data)
    assert current_key("k") == key
    assert last_value_key_of(data, "k") == key


def test_no_properties_or_no_such_property_is_no_key() -> None:
    for props in (None, {"other": 1}):
        data = encoded(props)
        decode(data)
        assert current_key("k") is None and last_value_key_of(data, "k") is None


@pytest.mark.parametrize(("value", "kind"), [([1, 2], "list"), ({"x": 1}, "dict")])
def test_a_list_or_a_map_is_refused_as_a_key(value: Any, kind: str) -> None:
    data = encoded({"k": value})
    decode(data)
    with pytest.raises(MalformedMessage) as e:
        current_key("k")
    assert e.value.description == (f"application property 'k' must be a simple value (the last-value key of a "
                                   f"queue), got {kind}")
    assert last_value_key_of(data, "k") is None


def _str8(text: str) -> bytes:
    return b"\xa1" + bytes([len(text)]) + text.encode()


def test_properties_nested_too_deeply_are_malformed_not_a_crash() -> None:
    deep = b"\x45"  # list0, inside 5,000 list32s (proton's Python encoder cannot even write this: made by hand)
    for _ in range(5000):
        deep = b"\xd0" + (len(deep) + 4).to_bytes(4, "big") + (1).to_bytes(4, "big") + deep
    pairs = _str8("k") + _str8("a") + _str8("deep") + deep
    props = b"\x00\x53\x74\xd1" + (len(pairs) + 4).to_bytes(4, "big") + (4).to_bytes(4, "big") + pairs
    data = props + b"\x00\x53\x77" + _str8("x")
    decode(data)  # the framing check reads sizes only: this much is a well-formed message
    with pytest.raises(MalformedMessage) as e:
        current_key("k")
    assert e.value.description == "application-properties nested too deeply"
    assert last_value_key_of(data, "k") is None
