"""The event catalogue (broker/events.py) against the code that logs and against docs/events.md.

The scan reads the sources of broker/, ha/ and resource_agents/ (no import, no process): every call on an event-log
logger (a name bound to ``get_logger(...)``/``structlog.get_logger(...)``, or ``fast`` from broker.log) must name a
catalogued event, at a catalogued level, with catalogued fields.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from broker import events
from broker.events import EVENTS, FIELDS, Level

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("broker", "ha", "resource_agents")
DOC = ROOT / "docs" / "events.md"
LEVEL_METHODS = {"debug": Level.DEBUG, "info": Level.INFO, "warning": Level.WARNING, "error": Level.ERROR,
                 "critical": Level.CRITICAL, "exception": Level.ERROR}
LOGGER_FACTORIES = {"get_logger"}  # broker.log.get_logger, structlog.get_logger
# Lines broker/log.py writes itself (not through a logger call): the event names appear there as literals.
WRITTEN_BY_LOG_MODULE = {"python.log", "broker.log.reopened", "broker.log.reopen_failed"}


def python_sources() -> Iterator[Path]:
    for top in SOURCES:
        for path in sorted((ROOT / top).rglob("*")):
            if "__pycache__" in path.parts or not path.is_file():
                continue
            if path.suffix == ".py" or (path.suffix == "" and path.read_bytes()[:40].startswith(b"#!/usr/bin/python")):
                yield path


def wiring_kinds() -> set[str]:
    """The kinds WiringTable._emit is called with (broker/wiring.py): what ``f"wiring.{event.kind}"`` becomes."""
    tree = ast.parse((ROOT / "broker" / "wiring.py").read_text())
    return {
        node.args[0].value
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "_emit"
        and node.args and isinstance(node.args[0], ast.Constant)
    }


# f-string event names, by their source text, and how to expand each one (given the kinds an enclosing
# ``if event.kind in (...)`` allows, or None). A new f-string name fails the scan until it is added here.
DYNAMIC_NAMES = {
    "f'wiring.{event.kind}'": lambda allowed: {f"wiring.{k}" for k in wiring_kinds() if allowed is None or k in allowed},
}


def _kind_tests(tree: ast.Module) -> dict[int, set[str] | None]:
    """For each call inside ``if <x>.kind in ("a", "b"): ... else: ...``, the kinds its branch allows."""
    allowed: dict[int, set[str] | None] = {}
    every = wiring_kinds()
    for node in ast.walk(tree):
        if not (isinstance(node, ast.If) and isinstance(node.test, ast.Compare)
                and isinstance(node.test.left, ast.Attribute) and node.test.left.attr == "kind"
                and isinstance(node.test.ops[0], ast.In) and isinstance(node.test.comparators[0], ast.Tuple)):
            continue
        kinds = {e.value for e in node.test.comparators[0].elts if isinstance(e, ast.Constant)}
        for branch, branch_kinds in ((node.body, kinds), (node.orelse, every - kinds)):
            for stmt in branch:
                for inner in ast.walk(stmt):
                    allowed[id(inner)] = branch_kinds  # ast.walk goes outside in: the innermost test wins
    return allowed


@dataclass(frozen=True)
class Emission:
    where: str
    names: frozenset[str]
    levels: frozenset[Level]
    fields: frozenset[str]
    splat: bool  # **kwargs: fields not known statically


def _logger_names(tree: ast.Module) -> set[str]:
    """Names bound at module level to an event-log logger."""
    names = set()
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and _is_factory(node.value):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        if isinstance(node, ast.ImportFrom) and node.module == "broker.log":
            names |= {a.asname or a.name for a in node.names if a.name == "fast"}
    return names


def _is_factory(call: ast.Call) -> bool:
    f = call.func
    return (isinstance(f, ast.Attribute) and f.attr in LOGGER_FACTORIES) or (
        isinstance(f, ast.Name) and f.id in LOGGER_FACTORIES)


# Pure code returns its log lines as data (ha/core/controller.py: `_log("ha.state", "warning", **fields)` makes a
# `Log` action that HaNode writes through its logger): such a call is scanned as the line it becomes.
LOG_ACTION_HELPERS = {"_log"}


def _action_levels(call: ast.Call) -> set[Level] | None:
    if not (isinstance(call.func, ast.Name) and call.func.id in LOG_ACTION_HELPERS):
        return None
    level = call.args[1] if len(call.args) > 1 else ast.Constant("info")
    if not (isinstance(level, ast.Constant) and level.value in LEVEL_METHODS):
        return {Level.CRITICAL, Level.DEBUG}  # not a literal level: fails the level check below
    return {LEVEL_METHODS[level.value]}


def _levels(func: ast.expr, loggers: set[str]) -> set[Level] | None:
    """The levels a call's function logs at, or None when it is not an event-log call."""
    if isinstance(func, ast.IfExp):  # (log.debug if temp else log.info)(...)
        a, b = _levels(func.body, loggers), _levels(func.orelse, loggers)
        return a | b if a is not None and b is not None else None
    if not isinstance(func, ast.Attribute) or func.attr not in LEVEL_METHODS:
        return None
    receiver = func.value
    if (isinstance(receiver, ast.Name) and receiver.id in loggers) or (
            isinstance(receiver, ast.Call) and _is_factory(receiver)):
        return {LEVEL_METHODS[func.attr]}
    return None


def emissions() -> Iterator[Emission]:
    for path in python_sources():
        tree = ast.parse(path.read_text())
        loggers = _logger_names(tree)
        narrowed = _kind_tests(tree)
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            levels = _levels(node.func, loggers)
            if levels is None:
                levels = _action_levels(node)
            if levels is None:
                continue
            where = f"{path.relative_to(ROOT)}:{node.lineno}"
            first = node.args[0] if node.args else ast.Constant("<no event name>")
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                names = {first.value}
            else:
                source = ast.unparse(first)
                expand = DYNAMIC_NAMES.get(source)
                names = expand(narrowed.get(id(node))) if expand is not None else {f"<{source}>"}  # fails below
            fields = {k.arg for k in node.keywords if k.arg is not None and k.arg != "exc_info"}
            if any(k.arg == "exc_info" for k in node.keywords) or (
                    isinstance(node.func, ast.Attribute) and node.func.attr == "exception"):
                fields.add("exception")
            if len(node.args) > 1 and isinstance(node.args[1], ast.Dict):  # fast.info("name", {...})
                fields |= {k.value for k in node.args[1].keys if isinstance(k, ast.Constant)}
            splat = any(k.arg is None for k in node.keywords)
            yield Emission(where, frozenset(names), frozenset(levels), frozenset(fields), splat)


ALL = list(emissions())


def test_the_scan_finds_the_logging_calls() -> None:
    # A scan that silently found nothing would pass every test below.
    names = {n for e in ALL for n in e.names}
    assert {"broker.started", "ha.lag", "client.settled", "wiring.bound", "ha.zookeeper.elected"} <= names
    assert {"wiring.declared", "wiring.deleted", "wiring.bound", "wiring.unbound"} <= names
    assert len(ALL) > 50


@pytest.mark.parametrize("emission", ALL, ids=lambda e: e.where)
def test_every_emitted_event_is_catalogued_with_its_level_and_fields(emission: Emission) -> None:
    for name in emission.names:
        if name not in EVENTS:
            pytest.fail(f"{emission.where}: {name!r} is not in broker/events.py (an f-string name needs an entry "
                        "in DYNAMIC_NAMES)")
        event = EVENTS[name]
        assert emission.levels <= set(event.levels), (
            f"{emission.where}: {name} logged at {sorted(emission.levels)}, catalogued {event.levels}")
        undocumented = emission.fields - set(event.field_names())
        assert not undocumented, f"{emission.where}: {name} fields {sorted(undocumented)} not in the catalogue"
        if not emission.splat:
            missing = set(event.required()) - emission.fields
            assert not missing, f"{emission.where}: {name} lacks catalogued fields {sorted(missing)}"


def test_every_catalogued_event_is_emitted_somewhere() -> None:
    emitted = {n for e in ALL for n in e.names}
    log_module = (ROOT / "broker" / "log.py").read_text()
    for name in WRITTEN_BY_LOG_MODULE:
        assert f'"{name}"' in log_module, name
    never = set(EVENTS) - emitted - WRITTEN_BY_LOG_MODULE
    assert not never, f"catalogued but never written (remove them or write them): {sorted(never)}"


def test_our_code_logs_only_through_the_event_log() -> None:
    # Standard logging would still reach the log (as python.log), but with free text instead of an event name.
    offenders = [str(p.relative_to(ROOT)) for p in python_sources()
                 if "logging.getLogger(" in p.read_text() and p != ROOT / "broker" / "log.py"]
    assert offenders == []


def test_every_field_used_by_an_event_is_defined_once_with_one_type() -> None:
    for event in EVENTS.values():
        names = event.field_names()
        assert len(names) == len(set(names)), event.name
        for name in names:
            assert name in FIELDS, f"{event.name}: field {name!r} has no entry in FIELDS"
            assert name not in events.COMMON, f"{event.name}: {name} is a common field"
    used = {name for e in EVENTS.values() for name in e.field_names()}
    assert set(FIELDS) - used == set(), "fields no event carries"


def test_check_accepts_the_documented_example_and_names_what_is_wrong() -> None:
    good = {"ts": "2026-11-22T02:30:00.123456Z", "level": "warning", "event": "ha.promoted", "broker": "b2",
            "epoch": 3, "from_state": "ready", "forced": False, "expected_backups": ["b3"]}
    assert events.check(good) == []
    assert events.check({**good, "epoch": "3"}) == ["ha.promoted: epoch='3' is not a int"]
    assert events.check({**good, "level": "info"}) == ["ha.promoted at level 'info', documented warning"]
    assert events.check({**good, "extra": 1}) == ["ha.promoted: undocumented field 'extra'"]
    assert events.check({k: v for k, v in good.items() if k != "forced"}) == ["ha.promoted: field 'forced' missing"]
    assert events.check({**good, "event": "ha.mystery"}) == ["unknown event 'ha.mystery'"]


def test_docs_events_md_is_generated_from_the_catalogue() -> None:
    assert DOC.read_text() == events.render_markdown(), (
        "docs/events.md is out of date: run `python -m broker.events > docs/events.md`"
    )


def test_docs_list_every_event_and_field() -> None:
    text = DOC.read_text()
    for name in EVENTS:
        assert f"| `{name}` |" in text
    for name in FIELDS:
        assert f"| `{name}` |" in text
