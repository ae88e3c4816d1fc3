"""The event-log contract the lag report reads (docs/events.md), as data.

Every field is parsed as a JSON *string* first and converted with ``try_cast`` afterwards, so a value of the wrong
type makes one field invalid (counted as "missing field") instead of making Spark drop or fail the whole line.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final

COMMON_FIELDS: Final = ("ts", "level", "event", "broker")

# Extra fields the report uses, by their documented type. Unknown fields are ignored (the schema only grows).
STRING_FIELDS: Final = (
    "queue",
    "backup",
    "primary",
    "role",
    "from_state",
    "to_state",
    "reason",
    "address",
    "timed_out",
    "expected_backups",
)
DOUBLE_FIELDS: Final = (
    "lag_ms",
    "enqueue_ts",
    "ack_ts",
    "sample_rate",
    "seconds",
    "waited_seconds",
    "first_ts",
    "last_ts",
)
LONG_FIELDS: Final = ("position", "backlog", "epoch", "messages", "count")
BOOLEAN_FIELDS: Final = ("forced",)
ALL_FIELDS: Final = COMMON_FIELDS + STRING_FIELDS + DOUBLE_FIELDS + LONG_FIELDS + BOOLEAN_FIELDS
CORRUPT_COLUMN: Final = "_corrupt_record"

BROKER_EVENTS: Final = frozenset(
    {
        "broker.started",
        "broker.stopping",
        "broker.stopped",
        "broker.config.invalid",
        "connection.opened",
        "connection.closed",
        "connection.refused",
        "link.refused",
        "message.rejected",
        "wiring.declared",
        "wiring.deleted",
        "wiring.bound",
        "wiring.unbound",
        "management.request",
        "queue.expired",
        "client.settled",
        "connection.accept_failed",
    }
)
HA_EVENTS: Final = frozenset(
    {
        "ha.state",
        "ha.state.illegal",
        "ha.membership",
        "ha.primary.connected",
        "ha.primary.lost",
        "ha.backup.connected",
        "ha.backup.lost",
        "ha.backup.ready",
        "ha.catchup.start",
        "ha.catchup.end",
        "ha.promoted",
        "ha.active",
        "ha.demoted",
        "ha.guard.timeout",
        "ha.epoch.refused",
        "ha.lag",
    }
)
KNOWN_EVENTS: Final = BROKER_EVENTS | HA_EVENTS

# Fields an event must carry (valid, after conversion) for the report to use it. ``ha.lag`` needs a lag, which is
# ``lag_ms`` or, when that is absent, ``(ack_ts - enqueue_ts) * 1000``; that rule lives in reader.py.
REQUIRED: Final[dict[str, tuple[str, ...]]] = {
    "ha.lag": ("queue", "backup"),
    "ha.catchup.start": ("queue", "backup"),
    "ha.catchup.end": ("queue", "backup"),
    "ha.state": ("to_state",),
    "ha.primary.lost": ("primary",),
    "ha.promoted": ("epoch",),
    "ha.active": ("epoch",),
    "ha.backup.ready": ("backup",),
    "client.settled": ("first_ts", "last_ts"),
}


class Quality(StrEnum):
    """What the reader decided about one input line (counted in the report's input-quality table)."""

    OK = "ok"
    MALFORMED = "malformed_json"  # not a JSON object
    MISSING_COMMON = "missing_common_field"  # no event/broker, or ts absent or not ISO 8601
    UNKNOWN_EVENT = "unknown_event"
    MISSING_FIELD = "missing_field"  # a required field absent or of the wrong type
    NEGATIVE_LAG = "negative_lag"  # clock step between enqueue and ack: excluded from the lag statistics
    OUT_OF_RANGE = "outside_date_range"  # valid, but not in [--date, --until]: skipped, not an error


BAD_QUALITIES: Final = (
    Quality.MALFORMED,
    Quality.MISSING_COMMON,
    Quality.UNKNOWN_EVENT,
    Quality.MISSING_FIELD,
    Quality.NEGATIVE_LAG,
)
