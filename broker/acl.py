"""Access control: a rules file -> a compiled evaluator that says whether a user may do an action on an object.

Pure: standard library only, no broker state; `broker.access` applies it at the edges (attach, management, the
anonymous relay) and reloads it on SIGHUP. The file format (TOML, like the configuration and the users file):

    [groups]
    ops = ["alice", "bob"]

    [[rule]]                       # rules are tried in file order; the first that matches decides
    effect = "allow"               # "allow" or "deny"
    users = ["@ops", "carol"]      # user names, "@group", or "*" (anyone, ANONYMOUS logins included)
    actions = ["publish", "consume"]   # publish consume browse create delete manage, or "all"
    queues = ["orders.*"]          # glob patterns (`*`, `?`, `[abc]`); optional
    exchanges = ["amq.topic"]      # optional

A rule with neither `queues` nor `exchanges` matches every object, broker-wide ones (`$events`, connections, the HA
operations) included; a rule with either matches only objects of the kinds it names. No rule matches: denied (a
file, once given, is the whole policy).

Errors (`AclError`) name the rule by its number (1 = the first `[[rule]]`) and its line in the file.
"""

from __future__ import annotations

import fnmatch
import re
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

__all__ = ["ANYONE", "EVENTS", "Acl", "AclError", "Action", "Decision", "Kind", "Rule", "load", "parse"]

ANYONE = "*"
GROUP_PREFIX = "@"
EVENTS = "$events"  # the broker's event stream (browse on the broker: what a backup reads first)
_NAME = re.compile(r"^[A-Za-z0-9_.@-]{1,64}$")  # as a users-file name (broker.auth); `anonymous` is allowed here
_RULE_HEADER = re.compile(r"^\s*\[\[\s*(?:rule|\"rule\"|'rule')\s*\]\]")
_RULE_KEYS = ("effect", "users", "actions", "queues", "exchanges")
CACHE_MAX = 10_000  # decisions kept per loaded file (checked at attach, not per message: a small working set)


class Action(StrEnum):
    PUBLISH = "publish"  # attach a sender to a queue or exchange; each message's `to` on the anonymous relay
    CONSUME = "consume"  # attach a receiver that takes messages from a queue, or subscribes to an exchange
    BROWSE = "browse"  # attach a receiver in distribution mode copy; subscribe to `$events` (broker-wide)
    CREATE = "create"  # a queue (management, or auto-created on attach), an exchange, a binding (on its exchange)
    DELETE = "delete"  # a queue, an exchange, a binding (on its exchange)
    MANAGE = "manage"  # update, purge, move (both queues); broker-wide: connection close, HA operations


class Kind(StrEnum):
    QUEUE = "queue"
    EXCHANGE = "exchange"
    BROKER = "broker"  # broker-wide objects: `$events`, `connection`, `ha-broker`


ALL_ACTIONS = frozenset(Action)
_ACTION_NAMES = frozenset(a.value for a in Action)


class AclError(ValueError):
    """A rules file that cannot be used; the message names the file, the rule and its line."""


@dataclass(frozen=True, slots=True)
class Decision:
    allowed: bool
    rule: int | None  # the rule that decided (1-based), None: no rule matched (default deny)

    def explain(self) -> str:
        return f"rule {self.rule}" if self.rule is not None else "no rule matched (default deny)"


@dataclass(frozen=True, slots=True)
class Rule:
    number: int  # 1-based, in file order
    line: int | None  # the line of its `[[rule]]` header
    allow: bool
    users: frozenset[str]  # names; ANYONE for anyone
    groups: frozenset[str]  # group names (without the @)
    actions: frozenset[Action]
    queues: tuple[str, ...] | None  # None: the rule does not name queues
    exchanges: tuple[str, ...] | None

    def applies_to(self, user: str, groups: Iterable[str]) -> bool:
        return ANYONE in self.users or user in self.users or not self.groups.isdisjoint(groups)

    def patterns(self, kind: Kind) -> tuple[str, ...] | None:
        """The patterns for objects of `kind`; None: every object of that kind matches."""
        if self.queues is None and self.exchanges is None:
            return None
        if kind == Kind.QUEUE:
            return self.queues or ()
        if kind == Kind.EXCHANGE:
            return self.exchanges or ()
        return ()  # broker-wide objects only match rules that name no objects


@dataclass(slots=True)
class _Compiled:
    """One rule, ready to evaluate: its patterns as one regular expression per kind."""

    rule: Rule
    matchers: dict[Kind, re.Pattern[str] | None]  # None: any name

    def matches(self, action: Action, kind: Kind, name: str) -> bool:
        if action not in self.rule.actions:
            return False
        m = self.matchers[kind]
        return m is None or m.fullmatch(name) is not None


def _matcher(patterns: tuple[str, ...] | None) -> re.Pattern[str] | None:
    if patterns is None:
        return None
    if not patterns:
        return re.compile(r"(?!)")  # matches nothing
    return re.compile("|".join(f"(?:{fnmatch.translate(p)})" for p in patterns), re.DOTALL)


@dataclass
class Acl:
    """A loaded rules file. `decide` is first-match-wins over the rules that apply to the user, cached."""

    rules: tuple[Rule, ...]
    groups: Mapping[str, frozenset[str]]  # group -> members
    source: str = "<acl>"
    _member_of: dict[str, frozenset[str]] = field(default_factory=dict, repr=False)
    _compiled: list[_Compiled] = field(default_factory=list, repr=False)
    _by_user: dict[str, list[_Compiled]] = field(default_factory=dict, repr=False)
    _cache: dict[tuple[str, Action, Kind, str], Decision] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        member_of: dict[str, set[str]] = {}
        for g, members in self.groups.items():
            for u in members:
                member_of.setdefault(u, set()).add(g)
        self._member_of = {u: frozenset(gs) for u, gs in member_of.items()}
        self._compiled = [_Compiled(r, {k: _matcher(r.patterns(k)) for k in Kind}) for r in self.rules]

    def groups_of(self, user: str) -> frozenset[str]:
        return self._member_of.get(user, frozenset())

    def _rules_for(self, user: str) -> list[_Compiled]:
        found = self._by_user.get(user)
        if found is None:
            gs = self.groups_of(user)
            found = [c for c in self._compiled if c.rule.applies_to(user, gs)]
            if len(self._by_user) >= CACHE_MAX:
                self._by_user.clear()
            self._by_user[user] = found
        return found

    def decide(self, user: str, action: Action, kind: Kind, name: str) -> Decision:
        key = (user, action, kind, name)
        d = self._cache.get(key)
        if d is None:
            d = next((Decision(c.rule.allow, c.rule.number) for c in self._rules_for(user)
                      if c.matches(action, kind, name)), Decision(False, None))
            if len(self._cache) >= CACHE_MAX:
                self._cache.clear()
            self._cache[key] = d
        return d


# ----- parsing ----------------------------------------------------------------------------------------------------
def load(path: Path) -> Acl:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise AclError(f"--acl-file {path}: {e.strerror}") from None
    except UnicodeDecodeError as e:
        raise AclError(f"--acl-file {path}: not UTF-8 text: {e}") from None
    return parse(text, f"--acl-file {path}")


def parse(text: str, source: str = "acl") -> Acl:
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise AclError(f"{source}: not valid TOML: {e}") from None
    unknown = sorted(set(raw) - {"groups", "rule"})
    if unknown:
        raise AclError(f"{source}: unknown table or key {unknown[0]!r} (expected [groups] and [[rule]])")
    groups = _groups(raw.get("groups", {}), source)
    rules_raw = raw.get("rule")
    if not isinstance(rules_raw, list) or not rules_raw:
        raise AclError(f"{source}: needs at least one [[rule]] (with none, everything would be denied)")
    lines = [i for i, ln in enumerate(text.splitlines(), 1) if _RULE_HEADER.match(ln)]
    rules = []
    for i, entry in enumerate(rules_raw, 1):
        line = lines[i - 1] if len(lines) == len(rules_raw) else None
        where = f"{source}: rule {i}" + (f" (line {line})" if line is not None else "")
        rules.append(_rule(entry, i, line, where, groups))
    return Acl(tuple(rules), groups, source)


def _groups(table: Any, source: str) -> dict[str, frozenset[str]]:
    if not isinstance(table, dict):
        raise AclError(f"{source}: [groups] must be a table of name = [members]")
    out = {}
    for g, members in table.items():
        if not _NAME.match(g):
            raise AclError(f"{source}: group {g!r}: bad name (letters, digits, _ . @ -, at most 64)")
        if not isinstance(members, list) or not all(isinstance(m, str) for m in members):
            raise AclError(f"{source}: group {g!r}: members must be a list of user names")
        for m in members:
            if not _NAME.match(m) or m.startswith(GROUP_PREFIX):
                raise AclError(f"{source}: group {g!r}: bad member {m!r} (a user name; groups do not nest)")
        out[g] = frozenset(members)
    return out


def _strings(entry: dict[str, Any], key: str, where: str) -> list[str] | None:
    v = entry.get(key)
    if v is None:
        return None
    if isinstance(v, str):
        v = [v]
    if not isinstance(v, list) or not v or not all(isinstance(x, str) and x for x in v):
        raise AclError(f"{where}: {key} must be a non-empty list of non-empty strings, got {v!r}")
    return list(v)


def _rule(entry: Any, number: int, line: int | None, where: str, groups: Mapping[str, frozenset[str]]) -> Rule:
    if not isinstance(entry, dict):
        raise AclError(f"{where}: must be a table")
    unknown = sorted(set(entry) - set(_RULE_KEYS))
    if unknown:
        raise AclError(f"{where}: unknown key {unknown[0]!r} (expected {', '.join(_RULE_KEYS)})")
    effect = entry.get("effect")
    if effect not in ("allow", "deny"):
        raise AclError(f"{where}: effect must be \"allow\" or \"deny\", got {effect!r}")
    who = _strings(entry, "users", where)
    if who is None:
        raise AclError(f"{where}: users missing (names, \"@group\", or \"*\" for anyone)")
    users, gs = set(), set()
    for w in who:
        if w == ANYONE:
            users.add(w)
        elif w.startswith(GROUP_PREFIX):
            g = w[1:]
            if g not in groups:
                known = ", ".join(sorted(groups)) or "none defined"
                raise AclError(f"{where}: unknown group {w!r} (groups: {known})")
            gs.add(g)
        elif _NAME.match(w):
            users.add(w)
        else:
            raise AclError(f"{where}: bad user {w!r} (a name, \"@group\" or \"*\")")
    acts = _strings(entry, "actions", where)
    if acts is None:
        raise AclError(f"{where}: actions missing ({', '.join(Action)}, or \"all\")")
    actions: set[Action] = set()
    for a in acts:
        if a == "all":
            actions |= ALL_ACTIONS
        elif a in _ACTION_NAMES:
            actions.add(Action(a))
        else:
            raise AclError(f"{where}: unknown action {a!r} (expected {', '.join(Action)}, or \"all\")")
    queues = _strings(entry, "queues", where)
    exchanges = _strings(entry, "exchanges", where)
    return Rule(number, line, effect == "allow", frozenset(users), frozenset(gs), frozenset(actions),
                tuple(queues) if queues is not None else None, tuple(exchanges) if exchanges is not None else None)
