"""The reader's line classification against the table in docs/lag-report.md ("Bad input"), row by row, and against
the event catalogue: every catalogued event, written as the catalogue says, is a good line."""

from __future__ import annotations

import datetime as dt
import json
import re
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from broker import events as catalogue
from spark import events, reader
from spark.events import Quality

pytestmark = pytest.mark.spark

DAY = dt.date(2026, 11, 22)
DOC = Path(__file__).resolve().parents[2] / "docs" / "lag-report.md"
TS = "2026-11-22T02:30:00.123456Z"


def line(event: str = "ha.lag", **fields: Any) -> str:
    base: dict[str, Any] = {"ts": TS, "level": "info", "event": event, "broker": "b1"}
    if event == "ha.lag":
        base |= {"queue": "orders", "backup": "b2", "position": 17, "enqueue_ts": 1795833000.1201,
                 "ack_ts": 1795833000.1234, "lag_ms": 3.3, "backlog": 4, "sample_rate": 1.0}
    base |= fields
    return json.dumps({k: v for k, v in base.items() if v is not _ABSENT})


_ABSENT = object()

# One row of the documented table per entry, in the table's order: (category, [(why, line), ...]).
ROWS: list[tuple[str, list[tuple[str, str]]]] = [
    ("malformed_json", [
        ("truncated line", line()[:40]),
        ("a traceback", "Traceback (most recent call last):"),
        ("an array", "[" + line() + "]"),
        ("a JSON string", '"ha.lag"'),
        ("a number", "42"),
        ("text after the object", line() + " trailing"),
        ("two objects on one line", line() + line()),
        ("single quotes", line().replace('"', "'")),
        ("NaN", line(lag_ms=_ABSENT)[:-1] + ', "lag_ms": NaN}'),
        ("Infinity", line(lag_ms=_ABSENT)[:-1] + ', "lag_ms": Infinity}'),
    ]),
    ("missing_common_field", [
        ("no event", line(event=_ABSENT)),  # type: ignore[arg-type]
        ("no broker", line(broker=_ABSENT)),
        ("broker null", line(broker=None)),
        ("no ts", line(ts=_ABSENT)),
        ("ts null", line(ts=None)),
        ("ts as Unix seconds", line(ts=1795833000.12)),
        ("ts with a space", line(ts="2026-11-22 02:30:00.123456Z")),
        ("ts without a zone", line(ts="2026-11-22T02:30:00.123456")),
        ("ts a date only", line(ts="2026-11-22")),
        ("ts 30 February", line(ts="2026-02-30T02:30:00Z")),
        ("ts hour 25", line(ts="2026-11-22T25:30:00Z")),
    ]),
    ("outside_date_range", [
        ("the day before", line(ts="2026-11-21T23:59:59.999999Z")),
        ("the day after", line(ts="2026-11-23T00:00:00Z")),
        ("an offset moves it out", line(ts="2026-11-22T00:30:00+01:00")),
    ]),
    ("unknown_event", [
        ("a name not in the catalogue", line(event="ha.mystery")),
        ("the removed broker.config.invalid", line(event="broker.config.invalid")),
    ]),
    ("missing_field", [
        ("ha.lag without backup", line(backup=_ABSENT)),
        ("ha.lag without queue", line(queue=_ABSENT)),
        ("ha.lag with queue null", line(queue=None)),
        ("ha.lag without a lag", line(lag_ms=_ABSENT, ack_ts=_ABSENT)),
        ("lag_ms a string", line(lag_ms="slow")),
        ("lag_ms a numeric string", line(lag_ms="3.3")),
        ("lag_ms a string although enqueue_ts and ack_ts give one", line(lag_ms="slow")),
        ("lag_ms the string NaN", line(lag_ms="NaN")),
        ("backlog a fraction", line(backlog=2.5)),
        ("sample_rate 0", line(sample_rate=0)),
        ("sample_rate above 1", line(sample_rate=1.5)),
        ("sample_rate a string", line(sample_rate="1")),
        ("ha.promoted with forced a string", line("ha.promoted", epoch=3, from_state="ready", forced="no",
                                                  expected_backups=[])),
        ("ha.promoted with epoch a fraction", line("ha.promoted", epoch=2.5, from_state="ready", forced=False,
                                                   expected_backups=[])),
        ("ha.promoted without epoch", line("ha.promoted", from_state="ready", forced=False, expected_backups=[])),
        ("ha.state without to_state", line("ha.state", from_state="joining", role="backup", epoch=1,
                                           reason="x")),
        ("ha.catchup.start without queue", line("ha.catchup.start", backup="b2", messages=3, format="batch")),
        ("client.settled without last_ts", line("client.settled", count=3, first_ts=1795833000.0, epoch=1,
                                                role="primary")),
    ]),
    ("negative_lag", [
        ("lag_ms below zero", line(lag_ms=-0.5)),
        ("ack before enqueue, no lag_ms", line(lag_ms=_ABSENT, enqueue_ts=1795833000.2, ack_ts=1795833000.1)),
    ]),
    ("ok", [
        ("the documented example", line()),
        ("lag from enqueue_ts and ack_ts", line(lag_ms=_ABSENT)),
        ("an integer where a float belongs", line(lag_ms=3)),
        ("no sample_rate", line(sample_rate=_ABSENT)),
        ("an offset", line(ts="2026-11-22T03:30:00.5+01:00")),
        ("ts without a fraction", line(ts="2026-11-22T02:30:00Z")),
        ("an unknown extra field", line(extra={"a": 1})),
        ("a field the report does not read, of any type", line(position="seventeen")),
        ("last second of the day", line(ts="2026-11-22T23:59:59.999999Z")),
    ]),
]


def classify(spark: SparkSession, lines: list[str]) -> list[str]:
    frame = spark.createDataFrame([(text, f"f{i}") for i, text in enumerate(lines)], "value string, file string")
    rows = reader.classify(frame, reader.DateRange(DAY, DAY)).select("file", "quality").collect()
    by_file = {r["file"]: r["quality"] for r in rows}
    return [by_file.get(f"f{i}", "<dropped>") for i in range(len(lines))]


def test_the_table_in_the_docs_is_the_one_tested() -> None:
    text = DOC.read_text()
    section = text[text.index("### Bad input"):text.index("## On a cluster")]
    documented = re.findall(r"^\| \d+ \| `([a-z_]+)` \|", section, re.MULTILINE)
    assert documented == [category for category, _ in ROWS]
    assert {q.value for q in Quality} == set(documented)


@pytest.mark.parametrize(("category", "cases"), ROWS, ids=[c for c, _ in ROWS])
def test_each_row_of_the_documented_table(spark: SparkSession, category: str, cases: list[tuple[str, str]]) -> None:
    got = classify(spark, [text for _, text in cases])
    wrong = [(why, quality) for (why, _), quality in zip(cases, got, strict=True) if quality != category]
    assert wrong == [], f"expected {category}"


def test_blank_lines_are_not_counted(spark: SparkSession) -> None:
    assert classify(spark, ["", "   ", line()]) == ["<dropped>", "<dropped>", "ok"]


def _value(f: catalogue.Field) -> Any:
    samples = {catalogue.Type.STRING: "x", catalogue.Type.INT: 1, catalogue.Type.FLOAT: 0.5,
               catalogue.Type.BOOL: False, catalogue.Type.LIST: ["b3"], catalogue.Type.OBJECT: {"k": 1}}
    return samples[f.type]


def test_every_catalogued_event_written_as_documented_is_a_good_line(spark: SparkSession) -> None:
    lines = []
    for event in catalogue.EVENTS.values():
        fields = {u.name: _value(catalogue.FIELDS[u.name]) for u in event.fields}
        lines.append(json.dumps({"ts": TS, "level": event.level.value, "event": event.name, "broker": "b1",
                                 **fields}))
    got = classify(spark, lines)
    bad = {name: quality for name, quality in zip(catalogue.EVENTS, got, strict=True) if quality != "ok"}
    assert bad == {}


def test_the_documented_needs_are_the_readers() -> None:
    text = DOC.read_text()
    row = next(r for r in text.splitlines() if r.startswith("| 5 | `missing_field` |"))
    documented: dict[str, set[str]] = {}
    for names, segment in re.findall(r"(?:: |; )((?:`[a-z_]+`(?:, | and )?)+) for ([^;]*)", row):
        for event in re.findall(r"`([a-z_.]+)`", segment):
            documented.setdefault(event, set()).update(re.findall(r"`([a-z_]+)`", names))
    assert documented == {event: set(fields) for event, fields in events.REQUIRED.items()}
