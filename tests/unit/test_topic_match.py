"""Topic matching (`broker.exchange.topic_match`) against the recursive definition it replaced, and on subjects
long enough that the recursion failed (RecursionError: the publisher's link closed with amqp:internal-error)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.exchange import topic_match


def reference(p: tuple[str, ...], s: tuple[str, ...]) -> bool:
    """The AMQP 0-10 / RabbitMQ rule as the recursive definition reads: `#` eats zero words, or one and stays."""
    if not p:
        return not s
    if p[0] == "#":
        return reference(p[1:], s) or (bool(s) and reference(p, s[1:]))
    return bool(s) and (p[0] == "*" or p[0] == s[0]) and reference(p[1:], s[1:])


WORD = st.sampled_from(["a", "b", "", "*", "#"])


@settings(max_examples=1000, deadline=None)
@given(pattern=st.lists(WORD, min_size=1, max_size=6), subject=st.lists(st.sampled_from(["a", "b", ""]), min_size=1,
                                                                       max_size=7))
def test_the_same_answers_as_the_recursive_definition(pattern: list[str], subject: list[str]) -> None:
    assert topic_match(".".join(pattern), ".".join(subject)) == reference(tuple(pattern), tuple(subject))


@pytest.mark.parametrize(("pattern", "subject", "expected"), [
    ("#", "", True), ("#", "a.b.c", True), ("*", "", True), ("*", "a.b", False), ("a.#", "a", True),
    ("a.#.b", "a.b", True), ("a.#.b", "a.x.y.b", True), ("a.*.b", "a.b", False), ("#.#", "a", True),
    ("stock.*.nyse", "stock.ibm.nyse", True), ("stock.*.nyse", "stock.ibm.lse", False),
])
def test_examples(pattern: str, subject: str, expected: bool) -> None:
    assert topic_match(pattern, subject) is expected


def test_a_subject_of_thousands_of_words_is_matched() -> None:
    subject = ".".join(["a"] * 20_000) + ".x"  # the recursion ran out of stack at ~900 words
    assert topic_match("#.x", subject) and topic_match("#.a.#.x", subject)
    assert not topic_match("*.#.*.#.y", subject) and not topic_match("a.*", subject)


def test_routes_of_long_subjects_are_not_remembered() -> None:
    """The route cache is keyed by subject: distinct long subjects (up to --max-message-size each) must not pile
    up in it."""
    from broker.exchange import CACHED_SUBJECT, Binding, Exchange

    ex = Exchange("t", "topic", {})
    ex.bind(Binding("t", "q", "#.x"))
    for i in range(50):
        assert ex.route(f"{i}." + "w." * 50_000 + "x") == ("q",)
    assert ex.route("short.x") == ("q",) and ex.route("x" * CACHED_SUBJECT) == ()
    assert sorted(k or "" for k in ex._cache) == sorted(["short.x", "x" * CACHED_SUBJECT])
