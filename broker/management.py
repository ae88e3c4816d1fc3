"""The `$management` node, after the AMQP Management draft.

A request carries `operation`, `type` and `name` in its application properties and a map of attributes as its body;
the reply carries `statusCode` and `statusDescription`. This module is the pure request -> response part; the server
only moves messages.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from broker.exchange import BindingKey, parse_binding_name
from broker.options import EXCHANGE_ARGUMENTS, QUEUE_ARGUMENTS, BadArgument, normalize
from broker.queue import Queue
from broker.wiring import InvalidRequest, NotFound, Wiring, WiringError

OPERATIONS = ("CREATE", "READ", "UPDATE", "DELETE", "QUERY")
TYPES = ("queue", "exchange", "binding", "broker")
WRITES = frozenset({"CREATE", "UPDATE", "DELETE"})


@dataclass(slots=True)
class Response:
    status: int
    description: str
    body: Any = None
    properties: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class Request:
    operation: str
    type: str
    name: str | None
    body: Any
    user: str | None
    admin: bool
    properties: Mapping[Any, Any] = field(default_factory=dict)


# An extension operation: (request) -> Response. Registered by layers above the broker (e.g. HA).
ExtensionOp = Callable[[Request], Response]


class Management:
    def __init__(self, wiring: Wiring, broker_attributes: Callable[[], dict[str, Any]]) -> None:
        self.wiring = wiring
        self.broker_attributes = broker_attributes
        self.extensions: dict[tuple[str, str], tuple[ExtensionOp, bool]] = {}

    def register(self, type_: str, operation: str, op: ExtensionOp, write: bool) -> None:
        self.extensions[(type_, operation.upper())] = (op, write)

    # ------------------------------------------------------------------------------------------------------------
    def handle(self, req: Request) -> Response:
        op = req.operation.upper() if isinstance(req.operation, str) else req.operation
        ext = self.extensions.get((req.type, op)) if isinstance(op, str) else None
        if ext is not None:
            fn, write = ext
            if write and not req.admin:
                return Response(403, f"{op} on {req.type} needs the admin role")
            try:
                return fn(req)
            except WiringError as e:
                return Response(e.status, str(e))
        ext_types = {t for t, _ in self.extensions}
        if req.type not in TYPES:
            known = sorted(set(TYPES) | ext_types)
            return Response(400, f"unknown type {req.type!r} (expected one of {', '.join(known)})")
        if op not in OPERATIONS:
            return Response(400, f"unknown operation {req.operation!r} (expected one of {', '.join(OPERATIONS)})")
        if op in WRITES and not req.admin:
            return Response(403, f"{op} needs the admin role")
        if req.body is not None and not isinstance(req.body, dict):
            return Response(400, f"request body must be a map of attributes, got {type(req.body).__name__}")
        body: dict[Any, Any] = dict(req.body or {})
        try:
            if op == "QUERY":
                return self._query(req.type, body)
            if req.type == "broker":
                if op != "READ":
                    return Response(400, f"{op} is not supported on type broker")
                return Response(200, "OK", self.broker_attributes())
            handler = getattr(self, f"_{op.lower()}_{req.type}")
            result: Response = handler(req.name, body)
            return result
        except WiringError as e:
            return Response(e.status, str(e))

    # ----- queue ------------------------------------------------------------------------------------------------
    def _create_queue(self, name: str | None, body: dict[Any, Any]) -> Response:
        name = self._name(name, body)
        args = self._arguments(body)
        existing = self.wiring.queues.get(name)
        if existing is not None:
            if existing.arguments != _normalized(args, QUEUE_ARGUMENTS):
                return Response(409, f"queue {name!r} exists with different arguments")
            return Response(200, "queue exists with the same arguments", self.queue_read(existing))
        q, _ = self.wiring.declare_queue(name, args)
        return Response(201, "Created", self.queue_read(q))

    def _read_queue(self, name: str | None, body: dict[Any, Any]) -> Response:
        return Response(200, "OK", self.queue_read(self.wiring.queue(self._name(name, body))))

    def _update_queue(self, name: str | None, body: dict[Any, Any]) -> Response:
        q = self.wiring.update_queue(self._name(name, body), self._arguments(body))
        return Response(200, "OK", self.queue_read(q))

    def _delete_queue(self, name: str | None, body: dict[Any, Any]) -> Response:
        self.wiring.delete_queue(self._name(name, body))
        return Response(204, "No Content")

    @staticmethod
    def queue_read(q: Queue) -> dict[str, Any]:
        return {
            "name": q.name,
            "type": "queue",
            "uuid": q.uuid,
            "arguments": dict(q.arguments),
            "temporary": q.temporary,
            "depth": q.depth,
            "bytes": q.bytes,
            "acquired": q.acquired_count,
            "consumers": q.consumer_count,
            "enqueued": q.stats.enqueued,
            "dequeued": q.stats.dequeued,
            "expired": q.stats.expired,
            "next-position": q.next_position,
        }

    # ----- exchange ---------------------------------------------------------------------------------------------
    def _create_exchange(self, name: str | None, body: dict[Any, Any]) -> Response:
        name = self._name(name, body)
        type_ = body.get("exchange-type", body.get("type-name", "direct"))
        if not isinstance(type_, str):
            raise InvalidRequest("exchange-type must be a string")
        args = self._arguments(body)
        existing = self.wiring.exchanges.get(name)
        if existing is not None:
            if existing.type != type_ or existing.arguments != _normalized(args, EXCHANGE_ARGUMENTS):
                return Response(409, f"exchange {name!r} exists with a different type or arguments")
            return Response(200, "exchange exists with the same type and arguments", self._exchange_read(name))
        self.wiring.declare_exchange(name, type_, args)
        return Response(201, "Created", self._exchange_read(name))

    def _read_exchange(self, name: str | None, body: dict[Any, Any]) -> Response:
        return Response(200, "OK", self._exchange_read(self._name(name, body)))

    def _update_exchange(self, name: str | None, body: dict[Any, Any]) -> Response:
        raise InvalidRequest("exchanges cannot be updated; delete and create")

    def _delete_exchange(self, name: str | None, body: dict[Any, Any]) -> Response:
        self.wiring.delete_exchange(self._name(name, body))
        return Response(204, "No Content")

    def _exchange_read(self, name: str) -> dict[str, Any]:
        ex = self.wiring.exchange(name)
        attrs = Wiring.exchange_attributes(ex)
        attrs["exchange-type"] = attrs.pop("type")
        attrs["type"] = "exchange"
        attrs["bindings"] = len(ex.bindings)
        attrs["routed"] = ex.routed
        attrs["unrouted"] = ex.unrouted
        return attrs

    # ----- binding ----------------------------------------------------------------------------------------------
    def _binding_ident(self, name: str | None, body: dict[Any, Any]) -> tuple[str, str, str]:
        if "source" in body or "destination" in body:
            src, dst, key = body.get("source"), body.get("destination"), body.get("binding-key", "")
            if not isinstance(src, str) or not isinstance(dst, str) or not isinstance(key, str):
                raise InvalidRequest("binding needs string attributes source, destination and binding-key")
            return src, dst, key
        if isinstance(name, str):
            parsed = parse_binding_name(name)
            if parsed is not None:
                return parsed
            raise InvalidRequest(f"binding name {name!r} is not exchange|queue|key")
        raise InvalidRequest("binding needs attributes source and destination (or a name exchange|queue|key)")

    def _create_binding(self, name: str | None, body: dict[Any, Any]) -> Response:
        src, dst, key = self._binding_ident(name, body)
        b, created = self.wiring.bind(src, dst, key, self._arguments(body))
        return Response(201 if created else 200, "Created" if created else "binding exists", Wiring.binding_attributes(b))

    def _read_binding(self, name: str | None, body: dict[Any, Any]) -> Response:
        src, dst, key = self._binding_ident(name, body)
        b = self.wiring.exchange(src).bindings.get(BindingKey(src, dst, key))
        if b is None:
            raise NotFound(f"binding {src}|{dst}|{key} not found")
        return Response(200, "OK", Wiring.binding_attributes(b))

    def _update_binding(self, name: str | None, body: dict[Any, Any]) -> Response:
        raise InvalidRequest("bindings cannot be updated; delete and create")

    def _delete_binding(self, name: str | None, body: dict[Any, Any]) -> Response:
        src, dst, key = self._binding_ident(name, body)
        self.wiring.unbind(src, dst, key)
        return Response(204, "No Content")

    # ----- query ------------------------------------------------------------------------------------------------
    def _query(self, type_: str, body: dict[Any, Any]) -> Response:
        rows: list[dict[str, Any]]
        if type_ == "queue":
            rows = [self.queue_read(q) for q in self.wiring.queues.values()]
        elif type_ == "exchange":
            rows = [self._exchange_read(n) for n in self.wiring.exchanges]
        elif type_ == "binding":
            rows = [Wiring.binding_attributes(b) for b in self.wiring.bindings()]
        else:
            rows = [self.broker_attributes()]
        names = body.get("attributeNames")
        if names is not None and (not isinstance(names, list) or not all(isinstance(n, str) for n in names)):
            raise InvalidRequest("attributeNames must be a list of strings")
        if not names:
            names = sorted({k for r in rows for k in r})
        results = [[r.get(n) for n in names] for r in rows]
        return Response(
            200,
            "OK",
            {"attributeNames": names, "results": results},
            {"count": len(results), "seq": self.wiring.seq},
        )

    # ----- helpers ----------------------------------------------------------------------------------------------
    @staticmethod
    def _name(name: str | None, body: dict[Any, Any]) -> str:
        n = name if name is not None else body.get("name")
        if not isinstance(n, str) or not n:
            raise InvalidRequest("missing name (application property 'name' or attribute 'name')")
        return n

    @staticmethod
    def _arguments(body: dict[Any, Any]) -> dict[str, Any]:
        args = body.get("arguments", {})
        if args is None:
            args = {}
        if not isinstance(args, dict):
            raise InvalidRequest(f"arguments must be a map, got {type(args).__name__}")
        # Allow the common attributes at top level too (e.g. {"max-count": 10}).
        merged = dict(args)
        for k, v in body.items():
            if isinstance(k, str) and k in QUEUE_ARGUMENTS and k not in merged:
                merged[k] = v
        return merged


def _normalized(args: dict[str, Any], table: Mapping[str, Callable[[str, Any], Any]]) -> dict[str, Any]:
    """Arguments validated as for a new object: a bad value is a 400 even when the object already exists."""
    try:
        return normalize(args, table)
    except BadArgument as e:
        raise InvalidRequest(str(e)) from None
