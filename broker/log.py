"""The event log: one JSON object per line, every line an event of the catalogue (broker/events.py, docs/events.md).

Three writers share one output, a `_Sink` (the stream, one lock, the path to reopen):

- structlog events (``get_logger(...).info("name", field=...)``): structlog's processor chain renders them straight
  to the sink. Measured on this machine: 27 µs per event this way, 66 µs through the stdlib ``logging`` machinery
  (ProcessorFormatter for everything), so structlog's own events do not take that detour.
- Python's standard ``logging`` (kazoo, proton, any library): a handler on the root logger renders each record with
  structlog's stdlib integration (``ProcessorFormatter``) and the same processors and JSON renderer, as the event
  ``python.log`` with ``logger`` and ``message`` (and ``exception``), warnings and above (Python ``warnings``
  too: they are captured into logging). A record whose message cannot be formatted becomes a ``python.log`` line
  that says so, instead of logging's traceback on stderr.
- `FastEvents` (``fast.info("ha.lag", {...})``): lag samples and settle windows, formatted without the processor
  chain and written in batches (the broker flushes every 0.2 s and at shutdown) so a busy primary does not pay a
  write per acknowledgement. Same schema and key order as the structlog lines (a test renders both and compares).

Log rotation: ``configure()`` with a ``log_file``, called on the main thread (as ``ha-broker`` does), installs a
SIGHUP handler that calls ``request_reopen()``, which only sets a flag and so is safe in a signal handler.
The sink reopens ``--log-file`` under its lock before the next write from any thread, or at the next `FastEvents`
flush (0.2 s), so a line is never split between the old and the new file and batched lines still waiting go to the
new one. The first line of the new file is ``broker.log.reopened``.
"""

from __future__ import annotations

import json
import logging
import signal
import sys
import threading
import time
from collections.abc import MutableMapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

import structlog
from structlog.typing import Processor

_LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40, "critical": 50}
LIBRARY_EVENT = "python.log"  # what a standard-logging record becomes (docs/events.md)
LIBRARY_MIN_LEVEL = logging.WARNING


def _now_ts() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _timestamp(_: Any, __: str, event_dict: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    event_dict["ts"] = _now_ts()
    return event_dict


def _order(_: Any, __: str, event_dict: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    # ts, level, event, broker first: easier to read with `less`, same content.
    head: dict[str, Any] = {k: event_dict.pop(k) for k in ("ts", "level", "event", "broker") if k in event_dict}
    head.update(event_dict)
    return head


class _AddBroker:
    """Every line names its broker, whichever thread wrote it (context variables are per thread)."""

    def __init__(self, broker: str) -> None:
        self.broker = broker

    def __call__(self, _: Any, __: str, event_dict: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
        event_dict.setdefault("broker", self.broker)
        return event_dict


def _library_level(levelno: int) -> str:
    """The catalogue's level for a standard-logging level (custom levels such as 35 round down)."""
    return "critical" if levelno >= logging.CRITICAL else "error" if levelno >= logging.ERROR else "warning"


def _library_record(_: Any, __: str, event_dict: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """A standard-logging record as the catalogue's ``python.log`` event: ``logger``, ``message`` and, for
    ``exc_info``/``stack_info``, ``exception`` (rendered by ``format_exc_info``)."""
    record: logging.LogRecord = event_dict["_record"]
    message = event_dict.pop("event")
    event_dict["event"] = LIBRARY_EVENT
    event_dict["level"] = _library_level(record.levelno)
    event_dict["logger"] = record.name
    event_dict["message"] = message
    stack = event_dict.pop("stack_info", None)
    if stack and "exc_info" not in event_dict:
        event_dict["exception"] = stack
    return event_dict


def render_line(level: str, event: str, broker: str, fields: dict[str, Any]) -> str:
    """One line as the structlog chain renders it (for lines the sink writes itself)."""
    return json.dumps({"ts": _now_ts(), "level": level, "event": event, "broker": broker, **fields},
                      default=str) + "\n"


class _Sink:
    """The output every writer shares: a stream, a lock around each write, and reopen-on-request."""

    def __init__(self, broker: str, path: Path | None) -> None:
        self.broker = broker
        self.path = path
        self.stream: TextIO = self._open() if path is not None else sys.stderr
        self._lock = threading.Lock()
        self._reopen_wanted = False

    def _open(self) -> TextIO:
        assert self.path is not None
        return open(self.path, "a", buffering=1, encoding="utf-8")  # closed on reopen and close()

    def write(self, text: str) -> None:
        with self._lock:
            if self._reopen_wanted:
                self._reopen()
            self.stream.write(text)

    def request_reopen(self) -> None:
        """Reopen before the next write. Only sets a flag: safe in a signal handler."""
        if self.path is not None:
            self._reopen_wanted = True

    def reopen_if_wanted(self) -> None:
        if self._reopen_wanted:
            with self._lock:
                if self._reopen_wanted:
                    self._reopen()

    def _reopen(self) -> None:
        # Called with the lock held.
        self._reopen_wanted = False
        try:
            new = self._open()
        except OSError as e:
            self.stream.write(render_line("error", "broker.log.reopen_failed", self.broker,
                                          {"path": str(self.path), "description": str(e)}))
            return
        old, self.stream = self.stream, new
        old.close()
        new.write(render_line("info", "broker.log.reopened", self.broker, {"path": str(self.path)}))

    def close(self) -> None:
        with self._lock:
            if self.stream is not sys.stderr:
                self.stream.close()


class _SinkLogger:
    """structlog's final logger: the rendered line goes to the sink, whatever the level method."""

    def __init__(self, sink: _Sink) -> None:
        self._sink = sink

    def msg(self, message: str) -> None:
        self._sink.write(message + "\n")

    log = debug = info = warning = warn = error = err = critical = fatal = exception = failure = msg


class _SinkHandler(logging.Handler):
    """Standard logging into the sink (records rendered by the ProcessorFormatter)."""

    def __init__(self, sink: _Sink) -> None:
        super().__init__()
        self.sink = sink

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record) + "\n"
        except Exception as e:  # e.g. arguments that do not fit the format: logging would print a traceback
            line = render_line(_library_level(record.levelno), LIBRARY_EVENT, self.sink.broker, {
                "logger": record.name, "message": f"unformattable log record {record.msg!r} % {record.args!r}: {e!r}"})
        self.sink.write(line)


_sink: _Sink | None = None


def configure(broker: str, level: str = "info", log_file: Path | None = None) -> TextIO:
    """Route every writer (structlog, standard logging, `fast`) to ``log_file`` (line buffered) or stderr.

    Returns the stream opened now (after a reopen, writes go to a new one)."""
    global _sink
    if _sink is not None:
        _sink.close()
    sink = _sink = _Sink(broker, log_file)
    add_broker = _AddBroker(broker)
    render: list[Processor] = [
        structlog.processors.format_exc_info, _order, structlog.processors.JSONRenderer(default=str)
    ]
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            _timestamp,
            add_broker,
            *render,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS[level]),
        logger_factory=lambda *_args: _SinkLogger(sink),
        cache_logger_on_first_use=True,
    )
    handler = _SinkHandler(sink)
    handler.setLevel(LIBRARY_MIN_LEVEL)  # records of a library logger set to a lower level still reach the root
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[structlog.processors.add_log_level, _timestamp, _library_record, add_broker],
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, *render],
        )
    )
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(max(LIBRARY_MIN_LEVEL, _LEVELS[level]))
    logging.captureWarnings(True)  # Python warnings too: python.log from logger py.warnings, not text on stderr
    fast.configure(sink, broker, level)
    if log_file is not None and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGHUP, lambda *_: sink.request_reopen())
    return sink.stream


def request_reopen() -> None:
    """Reopen ``--log-file`` before the next line (the broker's SIGHUP handler; signal-safe)."""
    if _sink is not None:
        _sink.request_reopen()


def silent_logger(name: str) -> logging.Logger:
    """A stdlib logger that writes nothing, for a library whose own lines a command-line tool replaces with one
    message of its own (kazoo's "Connection dropped" in `ha-status --zk-hosts`). Not registered: the process's
    logging is left as it is."""
    quiet = logging.Logger(name)
    quiet.propagate = False
    quiet.addHandler(logging.NullHandler())
    return quiet


def get_logger(name: str | None = None) -> Any:
    return structlog.get_logger(name)


class FastEvents:
    """Writes frequent events (lag samples, settle windows) in the same JSON-lines schema, without structlog's
    processor chain, and batched: lines are collected and written together (`flush()`, called by the broker a few
    times a second and at shutdown), so a busy broker does not pay one write system call per acknowledgement."""

    MAX_PENDING = 512

    def __init__(self) -> None:
        self.sink: _Sink | None = None
        self.prefix = ""
        self.min_level = _LEVELS["info"]
        self.pending: list[str] = []
        self._sec = 0
        self._prefix = ""

    def configure(self, sink: _Sink, broker: str, level: str) -> None:
        self.sink = sink
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
        if self.sink is None or self.min_level > 20:
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
        if self.sink is None:
            return
        if self.pending:
            self.sink.write("".join(self.pending))
            self.pending.clear()
        else:
            self.sink.reopen_if_wanted()


fast = FastEvents()
