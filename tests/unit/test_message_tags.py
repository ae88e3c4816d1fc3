"""The per-message replication format's tags (ha.protocol): a position, and the absolute expiry for a backup that
offered to read it; anything else is refused (the backup closes the link and attaches again)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ha import protocol as P


def test_an_older_backup_gets_the_plain_tag_and_a_message_without_expiry_needs_none() -> None:
    assert P.message_tag(P.TAG_LIVE, 7, 1795450000.25, with_expiry=False) == b"e7"
    assert P.message_tag(P.TAG_CATCHUP, 7, None, with_expiry=True) == b"c7"
    assert P.parse_message_tag("7") == (7, None)


@given(st.integers(1, 2**63), st.floats(1.0, 4e9, allow_nan=False))
def test_a_tag_with_expiry_reads_back_exactly(position: int, expires: float) -> None:
    tag = P.message_tag(P.TAG_LIVE, position, expires, with_expiry=True).decode()
    assert tag[0] == P.TAG_LIVE and P.parse_message_tag(tag[1:]) == (position, expires)


@pytest.mark.parametrize("rest", ["", "0", "-1", "x", "7@", "7@soon", "7@nan", "7@inf", "7@-5", "@5", "7@1@2"])
def test_anything_else_is_not_a_tag(rest: str) -> None:
    assert P.parse_message_tag(rest) is None
