"""Terminus fields of an attach (dynamic-node properties, source filters) as plain Python values."""

from __future__ import annotations

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


def binding_key_from_filter(filt: Any) -> str | None:
    try:
        obj = data_object(filt)
    except Exception:
        return None
    if not isinstance(obj, dict):
        return None
    for v in obj.values():
        value = getattr(v, "value", v)
        if isinstance(value, str):
            return value
    return None


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
