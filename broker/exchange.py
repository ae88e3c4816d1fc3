"""Exchanges route a message by its `subject` (the AMQP 1.0 routing key) to bound queues."""

from __future__ import annotations

import uuid as uuidlib
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class BindingKey:
    exchange: str
    queue: str
    key: str


@dataclass(slots=True)
class Binding:
    exchange: str
    queue: str
    key: str
    arguments: dict[str, Any] = field(default_factory=dict)
    uuid: str = field(default_factory=lambda: str(uuidlib.uuid4()))

    @property
    def ident(self) -> BindingKey:
        return BindingKey(self.exchange, self.queue, self.key)

    @property
    def name(self) -> str:
        return binding_name(self.exchange, self.queue, self.key)


def binding_name(exchange: str, queue: str, key: str) -> str:
    """The management name of a binding: `exchange|queue|key` (`|` inside a part is escaped as `\\|`)."""
    return "|".join(p.replace("\\", "\\\\").replace("|", "\\|") for p in (exchange, queue, key))


def parse_binding_name(name: str) -> tuple[str, str, str] | None:
    parts: list[str] = []
    cur: list[str] = []
    it = iter(name)
    for ch in it:
        if ch == "\\":
            cur.append(next(it, ""))
        elif ch == "|":
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    if len(parts) != 3:
        return None
    return parts[0], parts[1], parts[2]


def topic_match(pattern: str, subject: str) -> bool:
    """AMQP topic matching: words split by '.', `*` matches exactly one word, `#` zero or more words.

    Walks the subject once, keeping the set of pattern positions it can be at: time O(words x pattern), no
    recursion (a subject of a few thousand words against a `#` used to exceed Python's recursion limit)."""
    p = pattern.split(".")
    words = subject.split(".")
    if "#" not in p:
        return len(p) == len(words) and all(t == "*" or t == w for t, w in zip(p, words, strict=True))
    states = _skip_hashes({0}, p)
    for word in words:
        nxt = set()
        for i in states:
            if i < len(p):
                tok = p[i]
                if tok == "#":
                    nxt.add(i)  # '#' eats this word and stays
                elif tok == "*" or tok == word:
                    nxt.add(i + 1)
        if not nxt:
            return False
        states = _skip_hashes(nxt, p)
    return len(p) in states


def _skip_hashes(states: set[int], p: list[str]) -> set[int]:
    """`states` with every position reachable by letting a `#` match no word."""
    out = set(states)
    for i in sorted(states):
        while i < len(p) and p[i] == "#":
            i += 1
            out.add(i)
    return out


CACHED_SUBJECT = 256  # characters: the routes of subjects up to this long are remembered (10,000 at most)


class Exchange:
    TYPES = ("direct", "fanout", "topic")

    def __init__(self, name: str, type_: str, arguments: dict[str, Any], uuid: str | None = None) -> None:
        self.name = name
        self.type = type_
        self.arguments = arguments
        self.uuid = uuid or str(uuidlib.uuid4())
        self.bindings: dict[BindingKey, Binding] = {}
        self._direct: dict[str, set[str]] = {}
        self._cache: dict[str | None, tuple[str, ...]] = {}
        self.routed = 0
        self.unrouted = 0

    @property
    def alternate(self) -> str | None:
        """Where a message no binding matches goes instead (`alternate-exchange`), if anywhere."""
        alt = self.arguments.get("alternate-exchange")
        return alt if isinstance(alt, str) else None

    @property
    def auto_delete(self) -> bool:
        """Deleted when its last binding is removed (`auto-delete`)."""
        return self.arguments.get("auto-delete") is True

    def bind(self, b: Binding) -> None:
        self.bindings[b.ident] = b
        self._direct.setdefault(b.key, set()).add(b.queue)
        self._cache.clear()

    def unbind(self, ident: BindingKey) -> Binding | None:
        b = self.bindings.pop(ident, None)
        if b is not None:
            qs = self._direct.get(b.key)
            if qs is not None:
                if not any(k.queue == b.queue and k.key == b.key for k in self.bindings):
                    qs.discard(b.queue)
                if not qs:
                    del self._direct[b.key]
            self._cache.clear()
        return b

    def route(self, subject: str | None) -> tuple[str, ...]:
        """Names of the queues a message with this subject goes to (each once)."""
        hit = self._cache.get(subject)
        if hit is not None:
            return hit
        if self.type == "fanout":
            out = tuple(sorted({b.queue for b in self.bindings.values()}))
        elif self.type == "direct":
            out = tuple(sorted(self._direct.get(subject or "", ())))
        else:
            s = subject or ""
            out = tuple(sorted({b.queue for b in self.bindings.values() if topic_match(b.key, s)}))
        if subject is None or len(subject) <= CACHED_SUBJECT:  # a cache of long subjects would hold megabytes
            if len(self._cache) > 10_000:
                self._cache.clear()
            self._cache[subject] = out
        return out
