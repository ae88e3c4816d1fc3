"""Queue and exchange arguments: names, types and validation in one table.

The same arguments arrive as management attributes, as AMQP 1.0 (dynamic) node properties and from a replicating
backup; they are validated here once so each path reports the same precise error.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

REPLICATE_KEY = "qpid.replicate"
REPLICATE_VALUES = ("all", "configuration", "none")
EXCHANGE_TYPES = ("direct", "fanout", "topic")


class BadArgument(ValueError):
    """An argument has a wrong type or value. `name` is the argument, `reason` says why."""

    def __init__(self, name: str, reason: str) -> None:
        super().__init__(f"{name}: {reason}")
        self.name = name
        self.reason = reason


# Integers go back out as AMQP longs (management replies, replication to backups, events): a ulong above this cannot
# (proton refuses to encode it, and one such value would break every QUERY and every backup's catch-up after it).
LONG_MIN, LONG_MAX = -(2**63), 2**63 - 1


def _int(minimum: int) -> Callable[[str, Any], int]:
    def conv(name: str, v: Any) -> int:
        if isinstance(v, bool) or not isinstance(v, int):
            if isinstance(v, str) and v.strip().lstrip("-").isdigit():
                v = int(v)
            else:
                raise BadArgument(name, f"must be an integer, got {type(v).__name__} {v!r}")
        if v < minimum:
            raise BadArgument(name, f"must be >= {minimum}, got {v}")
        if v > LONG_MAX:
            raise BadArgument(name, f"must be <= {LONG_MAX} (a signed 64-bit integer), got {v}")
        return int(v)

    return conv


def _bool(name: str, v: Any) -> bool:
    if isinstance(v, bool):
        return v
    if isinstance(v, str) and v.lower() in ("true", "false"):
        return v.lower() == "true"
    if isinstance(v, int) and v in (0, 1):
        return bool(v)
    raise BadArgument(name, f"must be a boolean, got {v!r}")


def _str(name: str, v: Any) -> str:
    if not isinstance(v, str) or not v:
        raise BadArgument(name, f"must be a non-empty string, got {v!r}")
    return v


def _choice(*choices: str) -> Callable[[str, Any], str]:
    def conv(name: str, v: Any) -> str:
        if not isinstance(v, str) or v not in choices:
            raise BadArgument(name, f"must be one of {', '.join(choices)}, got {v!r}")
        return v

    return conv


QUEUE_ARGUMENTS: dict[str, Callable[[str, Any], Any]] = {
    "max-count": _int(1),
    "max-size": _int(1),
    "limit-policy": _choice("reject", "ring"),
    "default-ttl": _int(1),  # milliseconds
    "priority-levels": _int(1),
    "lvq-key": _str,
    "exclusive": _bool,
    "auto-delete": _bool,
    "auto-delete-timeout": _int(0),  # seconds
    "alternate-exchange": _str,
    "delivery-limit": _int(1),  # failed deliveries, then the message is dead-lettered
    "durable": _bool,
    "duplicate-window": _int(1),  # message-ids remembered (broker.dedup)
    "duplicate-window-seconds": _int(1),  # ... for this long
    REPLICATE_KEY: _choice(*REPLICATE_VALUES),
}

# Arguments that may change after creation (management UPDATE).
QUEUE_UPDATABLE = frozenset(
    {"max-count", "max-size", "limit-policy", "default-ttl", "alternate-exchange", "delivery-limit", REPLICATE_KEY}
)

EXCHANGE_ARGUMENTS: dict[str, Callable[[str, Any], Any]] = {
    "alternate-exchange": _str,
    "durable": _bool,
    "auto-delete": _bool,
    REPLICATE_KEY: _choice(*REPLICATE_VALUES),
}

BINDING_ARGUMENTS: dict[str, Callable[[str, Any], Any]] = {
    REPLICATE_KEY: _choice(*REPLICATE_VALUES),
}


def normalize(arguments: Mapping[Any, Any] | None, table: Mapping[str, Callable[[str, Any], Any]]) -> dict[str, Any]:
    """Validate known arguments (converting types), keep unknown ones as they are (string keys only)."""
    out: dict[str, Any] = {}
    for k, v in (arguments or {}).items():
        if not isinstance(k, str):
            raise BadArgument(repr(k), "argument names must be strings")
        out[k] = table[k](k, v) if k in table else _plain(k, v)
    return out


MAX_DEPTH = 32  # lists and maps inside an unknown argument, at most this deep


def _plain(name: str, v: Any, depth: int = 0) -> Any:
    """Unknown arguments are kept, but only as simple values that survive a round trip over management."""
    if isinstance(v, int) and not isinstance(v, bool) and not LONG_MIN <= v <= LONG_MAX:
        raise BadArgument(name, f"integer {v} is out of range (a signed 64-bit integer is kept)")
    if v is None or isinstance(v, str | bool | int | float):
        return v
    if isinstance(v, list | tuple | dict) and depth >= MAX_DEPTH:
        raise BadArgument(name, f"lists and maps nested more than {MAX_DEPTH} deep")
    if isinstance(v, list | tuple):
        return [_plain(name, x, depth + 1) for x in v]
    if isinstance(v, dict):
        return {str(k): _plain(name, x, depth + 1) for k, x in v.items()}
    raise BadArgument(name, f"unsupported value type {type(v).__name__}")


@dataclass(frozen=True, slots=True)
class QueueOptions:
    max_count: int | None = None
    max_size: int | None = None
    ring: bool = False
    default_ttl: float | None = None  # seconds
    priority_levels: int = 1
    lvq_key: str | None = None
    exclusive: bool = False
    auto_delete: bool = False
    auto_delete_timeout: float = 0.0
    alternate_exchange: str | None = None
    delivery_limit: int | None = None
    durable: bool = False
    duplicate_window: int | None = None  # ids (broker.dedup)
    duplicate_window_seconds: float | None = None

    @property
    def deduplicates(self) -> bool:
        return self.duplicate_window is not None or self.duplicate_window_seconds is not None

    @classmethod
    def from_arguments(cls, args: Mapping[str, Any]) -> QueueOptions:
        levels = args.get("priority-levels", 1)
        if levels > 10:
            raise BadArgument("priority-levels", f"must be <= 10, got {levels}")
        ttl = args.get("default-ttl")
        return cls(
            max_count=args.get("max-count"),
            max_size=args.get("max-size"),
            ring=args.get("limit-policy", "reject") == "ring",
            default_ttl=ttl / 1000.0 if ttl else None,
            priority_levels=levels,
            lvq_key=args.get("lvq-key"),
            exclusive=args.get("exclusive", False),
            auto_delete=args.get("auto-delete", False),
            auto_delete_timeout=float(args.get("auto-delete-timeout", 0)),
            alternate_exchange=args.get("alternate-exchange"),
            delivery_limit=args.get("delivery-limit"),
            durable=args.get("durable", False),
            duplicate_window=args.get("duplicate-window"),
            duplicate_window_seconds=float(secs) if (secs := args.get("duplicate-window-seconds")) else None,
        )
