"""Terminus fields of an attach (dynamic-node properties, source filters) as plain Python values."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from broker.errors import LinkError


def node_properties(properties: Any) -> dict[str, Any]:
    """Dynamic-node properties (a proton Data) -> queue arguments dict."""
    try:
        obj = data_object(properties)
    except Exception:
        raise LinkError("amqp:invalid-field", "cannot decode node properties") from None
    if not obj:
        return {}
    if not isinstance(obj, dict):
        raise LinkError("amqp:invalid-field", "node properties must be a map")
    out = {}
    for k, v in obj.items():
        out[str(k)] = v
    # These describe the node, not queue arguments.
    out.pop("lifetime-policy", None)
    out.pop("supported-dist-modes", None)
    return out


# The filters the broker honours: a binding key for the private queue of a receiver from an exchange (Qpid's
# legacy AMQP 0-10 binding filters, by name or by code). Anything else is refused, never echoed (see docs/broker.md).
BINDING_FILTERS: dict[str | int, str] = {
    "apache.org:legacy-amqp-direct-binding:string": "direct",
    0x0000468C00000000: "direct",
    "apache.org:legacy-amqp-topic-binding:string": "topic",
    0x0000468C00000001: "topic",
}


@dataclass(frozen=True, slots=True)
class SourceFilter:
    """One entry of a source's filter-set: its key, its descriptor (symbol or code; None if not described), its
    value."""

    key: str
    descriptor: str | int | None
    value: Any

    def describe(self) -> str:
        d = self.descriptor
        if d is None:
            return f"{self.key!r}"
        return f"{self.key!r} ({d if isinstance(d, str) else f'0x{d:016x}'})"

    @property
    def binding_key(self) -> str | None:
        """The binding key this entry asks for, or None if it is not a binding filter the broker honours. An
        undescribed string is taken as a binding key too (as the broker always did)."""
        if not isinstance(self.value, str):
            return None
        if self.descriptor is None or self.descriptor in BINDING_FILTERS:
            return self.value
        return None


def source_filters(filt: Any) -> list[SourceFilter]:
    """The entries of a source's filter-set (a proton Data or a plain value); LinkError if it is not a map."""
    try:
        obj = data_object(filt)
    except Exception:
        raise LinkError("amqp:invalid-field", "cannot decode the source filter") from None
    if obj is None:
        return []
    if not isinstance(obj, dict):
        raise LinkError("amqp:invalid-field", f"a source filter must be a map, got {type(obj).__name__}")
    out = []
    for k, v in obj.items():
        descriptor = getattr(v, "descriptor", None)
        if descriptor is not None:
            descriptor = int(descriptor) if isinstance(descriptor, int) else str(descriptor)
            v = v.value
        out.append(SourceFilter(str(k), descriptor, v))
    return out


NOT_HONOURED = ("the broker honours only a binding key (apache.org:legacy-amqp-direct-binding:string or "
                "apache.org:legacy-amqp-topic-binding:string) on a receiver from an exchange")


def binding_key_from_filter(filt: Any, node: str) -> str | None:
    """The binding key a receiver from exchange `node` asks for (None: none asked). Any other filter, or more than
    one binding key, raises LinkError amqp:not-implemented naming it: a filter is never echoed unless honoured."""
    keys = []
    for f in source_filters(filt):
        key = f.binding_key
        if key is None:
            raise LinkError("amqp:not-implemented",
                            f"source filter {f.describe()} is not supported on exchange {node!r}: {NOT_HONOURED}")
        keys.append(key)
    if len(keys) > 1:
        raise LinkError("amqp:not-implemented",
                        f"{len(keys)} binding keys in the source filter of a receiver from exchange {node!r}: one "
                        "receiver takes one binding key")
    return keys[0] if keys else None


def refuse_filters(filt: Any, node: str) -> None:
    """A receiver from a queue (`node` says which, e.g. "queue 'orders'") takes no filter: selectors are not
    implemented. LinkError amqp:not-implemented naming the first filter."""
    for f in source_filters(filt):
        raise LinkError("amqp:not-implemented",
                        f"source filter {f.describe()} is not supported on {node}: {NOT_HONOURED}")


def data_object(d: Any) -> Any:
    """The first value of a proton Data (terminus properties, filters), or None when empty."""
    if d is None:
        return None
    if not hasattr(d, "rewind"):
        return d
    d.rewind()
    if d.next() is None:
        return None
    return d.get_object()
