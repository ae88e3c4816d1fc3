"""The replication batch format: what a writer writes a parser reads back; anything else is refused whole."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.errors import BatchError
from ha.core.batch import (
    DEFAULT_LIMIT,
    VERSION_MAX,
    BatchWriter,
    Gone,
    TxnPart,
    encode_acks,
    negotiate,
    parse,
    parse_acks,
    txn_parts,
)

MAX = 10 * 1024 * 1024


def test_records_come_back_in_order_with_every_field() -> None:
    w = BatchWriter()
    w.dequeue(3, 7)
    w.enqueue(10, 2, 3, 1, 1_800_000_000.25, b"ten")
    w.enqueue(11, 0, 0, 0, None, b"")
    records = parse(w.payload(), MAX)
    assert records == [(3, 7), (10, 2, 3, 1, 1_800_000_000.25, b"ten"), (11, 0, 0, 0, 0.0, b"")]
    assert w.count == 3


def test_the_payload_is_one_amqp_data_section() -> None:
    from proton import Message

    w = BatchWriter()
    w.enqueue(1, 0, 0, 0, None, b"x" * 300)
    payload = w.payload()
    m = Message()
    m.decode(payload)
    assert bytes(m.body)[:3] == b"UB\x01"


def test_full_says_when_to_start_the_next_batch() -> None:
    w = BatchWriter(limit=1000)
    while not w.full:
        w.enqueue(w.count + 1, 0, 0, 0, None, b"x" * 100)
    assert 1000 <= w.size < 1000 + 100 + 30
    assert not BatchWriter().full and not BatchWriter()
    assert DEFAULT_LIMIT >= 64 * 1024


def _batch(*records: bytes) -> bytes:
    body = b"UB\x01" + b"".join(records)
    return b"\x00\x53\x75\xb0" + len(body).to_bytes(4, "big") + body


def _enq(pos: int, data: bytes, n: int | None = None) -> bytes:
    return struct.pack(">cQBBIdI", b"E", pos, 0, 0, 0, 0.0, len(data) if n is None else n) + data


@pytest.mark.parametrize(
    ("payload", "says"),
    [
        (b"", "not a replication batch"),
        (b"\x00\x53\x77\xa1\x03abc", "not a replication batch"),
        (_batch(_enq(1, b"abc"))[:-1], "transfer has"),
        (b"\x00\x53\x75\xb0\x00\x00\x00\x03UB\x05", "version 5 is not supported"),
        (b"\x00\x53\x75\xb0\x00\x00\x00\x03XY\x01", "bad magic"),
        (_batch(_enq(0, b"a")), "position 0"),
        (_batch(_enq(5, b"abc", n=9)), "message truncated"),
        (_batch(_enq(5, b"a"), _enq(5, b"b")), "position 5 twice"),
        (_batch(struct.pack(">cQQ", b"D", 9, 3)), "bad range 9..3"),
        (_batch(struct.pack(">cQQ", b"D", 0, 3)), "bad range 0..3"),
        (_batch(b"D\x00\x00"), "truncated dequeue record"),
        (_batch(b"E\x00"), "truncated enqueue record"),
        (_batch(b"Z"), "unknown record kind"),
    ],
)
def test_a_bad_batch_is_refused_naming_the_problem(payload: bytes, says: str) -> None:
    with pytest.raises(BatchError, match=says):
        parse(payload, MAX)


def _batch3(*records: bytes, version: int = 3) -> bytes:
    body = b"UB" + bytes([version]) + b"".join(records)
    return b"\x00\x53\x75\xb0" + len(body).to_bytes(4, "big") + body


def _batch4(*records: bytes) -> bytes:
    return _batch3(*records, version=4)


def _x(txn: int, parts: int) -> bytes:
    return struct.pack(">cQH", b"X", txn, parts)


def test_version_3_transaction_parts_come_first_and_back() -> None:
    w = BatchWriter(version=3)
    w.txn(5, 2)
    w.txn(6, 1)
    w.dequeue(1, 2)
    w.enqueue(9, 0, 2, 0, None, b"nine")
    records = parse(w.payload(), MAX)
    assert records == [TxnPart("X", 5, 2), TxnPart("X", 6, 1), (1, 2), (9, 0, 2, 0, 0.0, b"nine")]
    assert txn_parts(records) == [(5, 2), (6, 1)]
    assert txn_parts(records[2:]) == [] and w.payload()[8:11] == b"UB\x03"


def test_version_4_gone_records_come_back_with_their_ids() -> None:
    w = BatchWriter(version=4)
    w.dequeue(1, 3)
    w.gone(2, b"Sm-2")
    w.gone(3)  # acknowledge only
    w.enqueue(2, 0, 0, 0, None, b"two")  # a "G" is not an enqueue of its position
    assert parse(w.payload(), MAX) == [(1, 3), Gone("G", 2, b"Sm-2"), Gone("G", 3, b""), (2, 0, 0, 0, 0.0, b"two")]
    assert w.payload()[8:11] == b"UB\x04" and VERSION_MAX == 4
    with pytest.raises(AssertionError):
        BatchWriter(version=3).gone(1)


@pytest.mark.parametrize(
    ("payload", "says"),
    [
        (_batch3(struct.pack(">cQH", b"G", 1, 0)), "unknown record kind b'G'"),  # version 3 has no "G"
        (_batch4(struct.pack(">cQH", b"G", 0, 0)), "gone record at byte 11: position 0"),
        (_batch4(struct.pack(">cQH", b"G", 4, 5) + b"Sab"), "gone record of position 4: id truncated"),
        (_batch4(struct.pack(">cQ", b"G", 4)), "truncated gone record"),
    ],
)
def test_a_bad_gone_record_is_refused_naming_the_problem(payload: bytes, says: str) -> None:
    with pytest.raises(BatchError, match=says):
        parse(payload, MAX)


def test_a_writer_of_version_2_has_no_transaction_parts() -> None:
    with pytest.raises(AssertionError):
        BatchWriter(version=2).txn(1, 1)
    with pytest.raises(ValueError, match="0 parts"):
        BatchWriter(version=3).txn(1, 0)


@pytest.mark.parametrize(
    ("payload", "says"),
    [
        (_batch(_x(1, 2)), "unknown record kind b'X'"),  # version 1 (and 2) have no transaction parts
        (_batch3(_enq(1, b"a"), _x(1, 2)), "after other records"),
        (_batch3(_x(0, 2)), "txn 0, 2 parts"),
        (_batch3(_x(4, 0)), "txn 4, 0 parts"),
        (_batch3(_x(4, 2), _x(4, 2)), "transaction 4 twice"),
        (_batch3(_x(4, 2)[:-1]), "truncated transaction record"),
    ],
)
def test_a_bad_transaction_part_is_refused_naming_the_problem(payload: bytes, says: str) -> None:
    with pytest.raises(BatchError, match=says):
        parse(payload, MAX)


@pytest.mark.parametrize(
    ("batch", "offered", "version"),
    [(False, 3, 1), (True, None, 1), (True, 1, 1), (True, True, 1), (True, 2, 2), (True, 3, 3), (True, 4, 4),
     (True, 9, 4)],
)
def test_negotiation_gives_a_version_2_backup_version_2(batch: bool, offered: object, version: int) -> None:
    assert negotiate(batch, offered) == version


def test_a_message_over_the_limit_is_refused() -> None:
    with pytest.raises(BatchError, match="over the limit of 10"):
        parse(_batch(_enq(1, b"x" * 11)), 10)


_records = st.lists(
    st.one_of(
        st.tuples(st.integers(1, 2**40), st.integers(0, 9), st.integers(0, 3), st.integers(0, 5),
                  st.one_of(st.none(), st.floats(1.0, 2e9)), st.binary(max_size=64)),
        st.tuples(st.integers(1, 2**40), st.integers(0, 2**20)),
    ),
    max_size=20,
)


@settings(max_examples=300, deadline=None)
@given(_records)
def test_round_trip(records: list[tuple]) -> None:  # type: ignore[type-arg]
    w = BatchWriter()
    want = []
    seen: set[int] = set()
    for r in records:
        if len(r) == 2:
            lo = r[0]
            w.dequeue(lo, lo + r[1])
            want.append((lo, lo + r[1]))
        elif r[0] not in seen:
            seen.add(r[0])
            w.enqueue(*r)
            want.append((r[0], r[1], r[2], r[3], r[4] or 0.0, r[5]))
    assert parse(w.payload(), MAX) == want


@settings(max_examples=500, deadline=None)
@given(_records, st.data())
def test_any_damage_raises_batch_error_or_parses_fully(records: list[tuple], data: st.DataObject) -> None:  # type: ignore[type-arg]
    """Truncation, flipped bytes, junk appended: parse raises BatchError (never another exception) or returns a
    complete list of well-formed records."""
    w = BatchWriter()
    seen: set[int] = set()
    for r in records:
        if len(r) == 2:
            w.dequeue(r[0], r[0] + r[1])
        elif r[0] not in seen:
            seen.add(r[0])
            w.enqueue(*r)
    payload = bytearray(w.payload())
    how = data.draw(st.sampled_from(["truncate", "flip", "append"]))
    if how == "truncate":
        payload = payload[: data.draw(st.integers(0, len(payload) - 1))]
    elif how == "flip":
        i = data.draw(st.integers(0, len(payload) - 1))
        payload[i] ^= data.draw(st.integers(1, 255))
    else:
        payload += data.draw(st.binary(min_size=1, max_size=40))
    try:
        out = parse(bytes(payload), MAX)
    except BatchError:
        return
    positions = [r[0] for r in out if len(r) == 6]
    assert len(positions) == len(set(positions))
    for r in out:
        assert r[0] >= 1
        if len(r) == 2:
            assert r[0] <= r[1]


def test_version_2_records_come_back_in_order() -> None:
    from ha.core.batch import Acquired, Released, Window

    w = BatchWriter(version=2)
    w.window([(b"Sa", 1.5), (b"L\x07", 2.0)])
    w.dequeue(1, 2)
    w.enqueue(5, 0, 16 | 32, 0, None, b"five")
    w.acquired(5, 9)
    w.released(6, 1, 2)
    assert parse(w.payload(), MAX) == [Window("W", [(b"Sa", 1.5), (b"L\x07", 2.0)]), (1, 2),
                                       (5, 0, 48, 0, 0.0, b"five"), Acquired("A", 5, 9), Released("R", 6, 1, 2)]
    assert w.payload()[8:11] == b"UB\x02"


def test_version_2_kinds_in_a_version_1_batch_are_refused() -> None:
    w = BatchWriter(version=2)
    w.acquired(1, 1)
    payload = bytearray(w.payload())
    payload[10] = 1
    with pytest.raises(BatchError, match="unknown record kind"):
        parse(bytes(payload), MAX)


@pytest.mark.parametrize("cut", [1, 5, 9, 14])
def test_a_truncated_window_record_is_refused(cut: int) -> None:
    w = BatchWriter(version=2)
    w.window([(b"Sabc", 1.0), (b"Sdef", 2.0)])
    payload = w.payload()
    body = payload[8:]
    body = body[: len(body) - cut]
    with pytest.raises(BatchError):
        parse(b"\x00\x53\x75\xb0" + len(body).to_bytes(4, "big") + body, MAX)


# ----- acknowledgements ----------------------------------------------------------------------------------------
def test_acknowledgements_version_1_carry_applied_ranges_only() -> None:
    payload = encode_acks({"a": [(1, 3), (7, 7)], "b": []})
    assert payload[8:11] == b"UA\x01"
    assert parse_acks(payload) == ({"a": [(1, 3), (7, 7)], "b": []}, {})


def test_acknowledgements_version_2_carry_dequeues_too_even_for_a_queue_with_nothing_applied() -> None:
    payload = encode_acks({"a": [(1, 3)]}, {"a": [(2, 2)], "b": [(5, 9)]})
    assert payload[8:11] == b"UA\x02"
    assert parse_acks(payload) == ({"a": [(1, 3)], "b": []}, {"a": [(2, 2)], "b": [(5, 9)]})


@pytest.mark.parametrize("version", [1, 2])
def test_damaged_acknowledgements_are_refused(version: int) -> None:
    payload = encode_acks({"q": [(1, 2)]}, {"q": [(1, 1)]} if version == 2 else None)
    for cut in range(12, len(payload)):  # (11: the header alone is a valid empty acknowledgement)
        short = payload[:cut]
        short = short[:4] + (len(short) - 8).to_bytes(4, "big") + short[8:]
        with pytest.raises(BatchError):
            parse_acks(short)
    with pytest.raises(BatchError, match="version 3"):
        parse_acks(payload[:10] + b"\x03" + payload[11:])
