"""structlog set-up: one JSON object per line, schema in docs/events.md."""

from __future__ import annotations

import logging
import sys
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
    # proton's own python logging goes to the same place, at warning and above.
    logging.basicConfig(stream=stream, level=logging.WARNING, format="%(message)s")
    return stream


def get_logger(name: str | None = None) -> Any:
    return structlog.get_logger(name)
