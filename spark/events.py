"""What the lag report reads from the event logs, derived from the event catalogue (broker/events.py).

The catalogue gives the known event names and the type of every field; this module picks the fields the report
reads and the ones each event needs. The reader type-checks exactly these fields (a field the report does not read
is never looked at, so the schema can grow without breaking old reports).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final

from broker import events as catalogue

KNOWN_EVENTS: Final = catalogue.NAMES

COMMON_FIELDS: Final = ("ts", "level", "event", "broker")
# Extra fields the report reads; their types come from the catalogue.
READ_FIELDS: Final = (
    "queue", "backup", "primary", "role", "from_state", "to_state", "reason", "timed_out",
    "lag_ms", "enqueue_ts", "ack_ts", "sample_rate", "seconds", "waited_seconds", "first_ts", "last_ts",
    "backlog", "epoch", "messages", "forced",
)


def field_type(name: str) -> catalogue.Type:
    """The catalogue's type of a common or extra field."""
    return catalogue.field(name).type


# Fields an event must carry (present, not null, of its type) for the report to use it. ``ha.lag`` also needs a
# lag: ``lag_ms`` or, when that is absent, both ``enqueue_ts`` and ``ack_ts``; that rule lives in reader.py.
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
    MALFORMED = "malformed_json"  # not one JSON object
    MISSING_COMMON = "missing_common_field"  # no event/broker, or ts absent or not ISO 8601 with a zone
    UNKNOWN_EVENT = "unknown_event"
    MISSING_FIELD = "missing_field"  # a needed field absent, or a read field of the wrong type
    NEGATIVE_LAG = "negative_lag"  # clock step between enqueue and ack: excluded from the lag statistics
    OUT_OF_RANGE = "outside_date_range"  # ts not in [--date, --until]: skipped, not an error


BAD_QUALITIES: Final = (
    Quality.MALFORMED,
    Quality.MISSING_COMMON,
    Quality.UNKNOWN_EVENT,
    Quality.MISSING_FIELD,
    Quality.NEGATIVE_LAG,
)
