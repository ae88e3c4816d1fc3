"""broker.acl: the rules file (parse, validation errors with rule and line numbers) and the evaluator (first match
wins, default deny), checked against a plain reference over generated rule files."""

from __future__ import annotations

import fnmatch
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.acl import Acl, AclError, Action, Decision, Kind, load, parse

EXAMPLE = """
[groups]
ops = ["alice", "bob"]

[[rule]]
effect = "deny"
users = ["@ops"]
actions = ["delete"]
queues = ["prod.*"]

[[rule]]
effect = "allow"
users = ["@ops"]
actions = ["all"]

[[rule]]
effect = "allow"
users = ["carol"]
actions = ["publish"]
exchanges = ["amq.*"]

[[rule]]
effect = "allow"
users = ["*"]
actions = ["consume", "browse"]
queues = ["public.?"]
"""


def test_first_matching_rule_decides() -> None:
    acl = parse(EXAMPLE)
    assert acl.decide("alice", Action.DELETE, Kind.QUEUE, "prod.orders") == Decision(False, 1)
    assert acl.decide("alice", Action.DELETE, Kind.QUEUE, "dev.orders") == Decision(True, 2)
    assert acl.decide("bob", Action.MANAGE, Kind.BROKER, "connection") == Decision(True, 2)


def test_object_patterns_match_only_their_kind_and_whole_names() -> None:
    acl = parse(EXAMPLE)
    assert acl.decide("carol", Action.PUBLISH, Kind.EXCHANGE, "amq.topic") == Decision(True, 3)
    assert not acl.decide("carol", Action.PUBLISH, Kind.QUEUE, "amq.topic").allowed  # a queue of that name
    assert acl.decide("dave", Action.CONSUME, Kind.QUEUE, "public.1") == Decision(True, 4)
    assert not acl.decide("dave", Action.CONSUME, Kind.QUEUE, "public.12").allowed  # ? is one character
    assert not acl.decide("dave", Action.BROWSE, Kind.BROKER, "$events").allowed  # broker-wide: not a queue


def test_nothing_matches_means_denied() -> None:
    acl = parse(EXAMPLE)
    assert acl.decide("mallory", Action.PUBLISH, Kind.QUEUE, "anything") == Decision(False, None)
    assert acl.decide("anonymous", Action.CREATE, Kind.QUEUE, "public.1") == Decision(False, None)
    assert "default deny" in Decision(False, None).explain()


def test_anyone_includes_anonymous_and_a_rule_without_objects_covers_the_broker() -> None:
    acl = parse('[[rule]]\neffect = "allow"\nusers = ["*"]\nactions = ["browse"]\n')
    assert acl.decide("anonymous", Action.BROWSE, Kind.BROKER, "$events").allowed
    assert acl.decide("anonymous", Action.BROWSE, Kind.QUEUE, "q").allowed
    assert not acl.decide("anonymous", Action.CONSUME, Kind.QUEUE, "q").allowed


@pytest.mark.parametrize(("text", "expected"), [
    ("not toml [", "not valid TOML"),
    ("", "needs at least one [[rule]]"),
    ("[users]\n", "unknown table or key 'users'"),
    ('[groups]\nops = "alice"\n[[rule]]\neffect="allow"\nusers=["*"]\nactions=["all"]\n', "group 'ops': members"),
    ('[groups]\nops = ["@x"]\n[[rule]]\neffect="allow"\nusers=["*"]\nactions=["all"]\n', "groups do not nest"),
    ('[[rule]]\neffect="allow"\nusers=["*"]\nactions=["all"]\n\n[[rule]]\neffect="permit"\nusers=["*"]\n'
     'actions=["all"]\n', "rule 2 (line 6): effect must be \"allow\" or \"deny\", got 'permit'"),
    ('\n\n[[rule]]\neffect="allow"\nactions=["all"]\n', "rule 1 (line 3): users missing"),
    ('[[rule]]\neffect="allow"\nusers=["@ops"]\nactions=["all"]\n', "unknown group '@ops' (groups: none defined)"),
    ('[[rule]]\neffect="allow"\nusers=["a b"]\nactions=["all"]\n', "bad user 'a b'"),
    ('[[rule]]\neffect="allow"\nusers=["*"]\n', "actions missing"),
    ('[[rule]]\neffect="allow"\nusers=["*"]\nactions=["publsh"]\n', "unknown action 'publsh'"),
    ('[[rule]]\neffect="allow"\nusers=["*"]\nactions=["all"]\nqueues=[]\n', "queues must be a non-empty list"),
    ('[[rule]]\neffect="allow"\nusers=["*"]\nactions=["all"]\nqueue=["x"]\n', "unknown key 'queue'"),
])
def test_bad_files_are_refused_with_rule_and_line(text: str, expected: str) -> None:
    with pytest.raises(AclError) as exc:
        parse(text, "--acl-file f.toml")
    assert expected in str(exc.value)
    assert str(exc.value).startswith("--acl-file f.toml: ")


def test_load_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(AclError, match=r"acl\.toml: No such file"):
        load(tmp_path / "acl.toml")
    (tmp_path / "bad.toml").write_bytes(b"\xff\xfe")
    with pytest.raises(AclError, match="not UTF-8"):
        load(tmp_path / "bad.toml")


# ----- the evaluator against a plain reference ---------------------------------------------------------------------
USERS = ["alice", "bob", "carol", "anonymous"]
GROUPS = {"ops": ["alice", "bob"], "apps": ["carol"]}
NAMES = ["orders", "orders.eu", "prod.x", "amq.topic", "q1", "q12", "$events", "a*b"]
PATTERNS = ["*", "orders*", "orders.?", "prod.*", "q?", "q[12]", "amq.*", "a*b", "orders"]


def reference(rules: list[dict[str, object]], user: str, action: str, kind: str, name: str) -> tuple[bool, int | None]:
    """The rules read the simplest way: each in order, every condition spelled out."""
    for i, r in enumerate(rules, 1):
        who = r["users"]
        assert isinstance(who, list)
        mine = user in who or "*" in who or any(w[1:] in GROUPS and user in GROUPS[w[1:]] for w in who
                                                 if w.startswith("@"))
        acts = r["actions"]
        assert isinstance(acts, list)
        if not mine or not (action in acts or "all" in acts):
            continue
        qs, xs = r.get("queues"), r.get("exchanges")
        if qs is None and xs is None:
            hit = True
        else:
            pats = {"queue": qs, "exchange": xs}.get(kind) or []
            assert isinstance(pats, list)
            hit = any(fnmatch.fnmatchcase(name, p) for p in pats)
        if hit:
            return r["effect"] == "allow", i
    return False, None


def _toml_list(xs: list[str]) -> str:
    return "[" + ", ".join(f'"{x}"' for x in xs) + "]"


def render(rules: list[dict[str, object]]) -> str:
    out = ["[groups]"] + [f"{g} = {_toml_list(m)}" for g, m in GROUPS.items()]
    for r in rules:
        out.append("\n[[rule]]")
        for k, v in r.items():
            out.append(f'{k} = "{v}"' if isinstance(v, str) else f"{k} = {_toml_list(v)}")  # type: ignore[arg-type]
    return "\n".join(out) + "\n"


rule_st = st.fixed_dictionaries(
    {"effect": st.sampled_from(["allow", "deny"]),
     "users": st.lists(st.sampled_from([*USERS, "*", "@ops", "@apps", "dave"]), min_size=1, max_size=3),
     "actions": st.lists(st.sampled_from([*(a.value for a in Action), "all"]), min_size=1, max_size=3)},
    optional={"queues": st.lists(st.sampled_from(PATTERNS), min_size=1, max_size=3),
              "exchanges": st.lists(st.sampled_from(PATTERNS), min_size=1, max_size=3)},
)
question_st = st.tuples(st.sampled_from(USERS), st.sampled_from(list(Action)), st.sampled_from(list(Kind)),
                        st.sampled_from(NAMES))


@settings(max_examples=300, deadline=None)
@given(st.lists(rule_st, min_size=1, max_size=8), st.lists(question_st, min_size=1, max_size=20))
def test_the_evaluator_agrees_with_the_reference(rules: list[dict[str, object]],
                                                  questions: list[tuple[str, Action, Kind, str]]) -> None:
    acl = parse(render(rules))
    assert [r.line for r in acl.rules] == [i for i, ln in enumerate(render(rules).splitlines(), 1)
                                           if ln == "[[rule]]"]
    for user, action, kind, name in questions * 2:  # the second pass answers from the cache
        d = acl.decide(user, action, kind, name)
        assert (d.allowed, d.rule) == reference(rules, user, action.value, kind.value, name), (user, action, kind,
                                                                                               name)


@settings(max_examples=100, deadline=None)
@given(st.lists(rule_st, min_size=1, max_size=6), st.integers(0, 5), st.sampled_from(["effect", "actions", "users"]))
def test_a_broken_rule_is_named_by_its_number(rules: list[dict[str, object]], which: int, key: str) -> None:
    which %= len(rules)
    rules = [dict(r) for r in rules]
    rules[which][key] = "nonsense" if key == "effect" else ["no such thing!"]
    with pytest.raises(AclError) as exc:
        parse(render(rules), "f")
    assert f"rule {which + 1} (line " in str(exc.value)


def test_an_acl_is_a_value_built_from_rules() -> None:
    acl = parse(EXAMPLE)
    again = Acl(acl.rules, acl.groups)
    assert again.decide("alice", Action.DELETE, Kind.QUEUE, "prod.a") == acl.decide("alice", Action.DELETE,
                                                                                    Kind.QUEUE, "prod.a")
    assert acl.groups_of("alice") == frozenset({"ops"})
