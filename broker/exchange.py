"""Exchanges route a message by its `subject` (the AMQP 1.0 routing key) to bound queues."""

from __future__ import annotations

import uuid as uuidlib
from dataclasses import dataclass, field
from functools import lru_cache
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
    """AMQP topic matching: words split by '.', `*` matches exactly one word, `#` zero or more words."""
    return _match(tuple(pattern.split(".")), tuple(subject.split(".")))


@lru_cache(maxsize=65536)
def _match(p: tuple[str, ...], s: tuple[str, ...]) -> bool:
    if not p:
        return not s
    head = p[0]
    if head == "#":
        # '#' eats zero words, or one word and stays.
        return _match(p[1:], s) or (bool(s) and _match(p, s[1:]))
    if not s:
        return False
    return (head == "*" or head == s[0]) and _match(p[1:], s[1:])


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
        if len(self._cache) > 10_000:
            self._cache.clear()
        self._cache[subject] = out
        return out
