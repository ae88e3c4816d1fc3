"""structlog set-up: one JSON object per line, schema in docs/events.md."""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import MutableMapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

import structlog

_LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40, "critical": 50}


def _timestamp(_: Any, __: str, event_dict: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    event_dict["ts"] = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return event_dict


def _order(_: Any, __: str, event_dict: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    # ts, level, event, broker first: easier to read with `less`, same content.
    head: dict[str, Any] = {k: event_dict.pop(k) for k in ("ts", "level", "event", "broker") if k in event_dict}
    head.update(event_dict)
    return head


def configure(broker: str, level: str = "info", log_file: Path | None = None) -> TextIO:
    """Route structlog to `log_file` (line buffered) or stderr. Returns the stream."""
    stream: TextIO = sys.stderr
    if log_file is not None:
        stream = open(log_file, "a", buffering=1, encoding="utf-8")  # noqa: SIM115 - lives as long as the process
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            _timestamp,
            structlog.processors.format_exc_info,
            _order,
            structlog.processors.JSONRenderer(default=str),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS[level]),
        logger_factory=structlog.PrintLoggerFactory(file=stream),
        cache_logger_on_first_use=True,
    )
    structlog.contextvars.bind_contextvars(broker=broker)
    fast.configure(stream, broker, level)
    # proton's own python logging goes to the same place, at warning and above.
    logging.basicConfig(stream=stream, level=logging.WARNING, format="%(message)s")
    return stream


def get_logger(name: str | None = None) -> Any:
    return structlog.get_logger(name)


class FastEvents:
    """Writes frequent events (lag samples, settle windows) in the same JSON-lines schema, without structlog's
    processor chain, and batched: lines are collected and written together (`flush()`, called by the broker a few
    times a second and at shutdown), so a busy broker does not pay one write system call per acknowledgement."""

    MAX_PENDING = 512

    def __init__(self) -> None:
        self.stream: TextIO | None = None
        self.prefix = ""
        self.min_level = _LEVELS["info"]
        self.pending: list[str] = []
        self._sec = 0
        self._prefix = ""

    def configure(self, stream: TextIO, broker: str, level: str) -> None:
        self.stream = stream
        self.prefix = json.dumps(broker)
        self.min_level = _LEVELS[level]

    def _ts(self) -> str:
        """The structlog timestamp format, with the date-and-second part formatted once per second."""
        now = time.time()
        sec = int(now)
        if sec != self._sec:
            self._sec = sec
            self._prefix = datetime.fromtimestamp(sec, UTC).strftime("%Y-%m-%dT%H:%M:%S")
        return f"{self._prefix}.{int((now - sec) * 1_000_000):06d}Z"

    def info(self, event: str, fields: dict[str, Any]) -> None:
        if self.stream is None or self.min_level > 20:
            return
        ts = self._ts()
        body = json.dumps(fields, default=str)
        self.pending.append(
            f'{{"ts": "{ts}", "level": "info", "event": "{event}", "broker": {self.prefix}, {body[1:]}\n'
            if len(body) > 2
            else f'{{"ts": "{ts}", "level": "info", "event": "{event}", "broker": {self.prefix}}}\n'
        )
        if len(self.pending) >= self.MAX_PENDING:
            self.flush()

    def flush(self) -> None:
        if self.pending and self.stream is not None:
            self.stream.write("".join(self.pending))
            self.pending.clear()


fast = FastEvents()
