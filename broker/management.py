"""The `$management` node, after the AMQP Management draft.

A request carries `operation`, `type` and `name` in its application properties and a map of attributes as its body;
the reply carries `statusCode` and `statusDescription`. This module is the pure request -> response part; the server
only moves messages.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from proton import Endpoint

from broker.errors import MalformedMessage
from broker.exchange import BindingKey, parse_binding_name
from broker.links import ConsumerLink, EventsLink, LinkHandler, PublisherLink
from broker.log import get_logger
from broker.message import current_key, decode
from broker.options import EXCHANGE_ARGUMENTS, QUEUE_ARGUMENTS, BadArgument, normalize
from broker.queue import AVAILABLE, DequeueReason, Queue
from broker.wiring import Conflict, InvalidRequest, NotFound, Wiring, WiringError

if TYPE_CHECKING:
    from broker.connections import ConnectionState
    from broker.server import Server

log = get_logger("broker")

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
            "duplicates": q.stats.duplicates,
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


# ----- operator actions on the running broker ---------------------------------------------------------------------
class BrokerOperations:
    """PURGE and MOVE on queues, QUERY and DELETE (close) on connections: operator actions that need the running
    server (its role, the consumers to wake, the connections), registered beside the CRUD operations by
    `install_operations`. A refusal changes nothing and is logged (`management.refused`) with its reason.

    On a backup these writes are refused (409): its queues are replicas that only its primary changes. On the
    primary they replicate like any consumer's work: a purge or a move is a dequeue of each message (sent to the
    backups as dequeue ranges), and a move enqueues on the destination through the ordinary queue API.
    """

    def __init__(self, server: Server) -> None:
        self.server = server
        self.queues = server.wiring.queues

    def install(self) -> None:
        m = self.server.management
        m.register("queue", "PURGE", self._logged(self.purge), write=True)
        m.register("queue", "MOVE", self._logged(self.move), write=True)
        m.register("connection", "QUERY", self._logged(self.query_connections), write=False)
        m.register("connection", "DELETE", self._logged(self.close_connection), write=True)

    @staticmethod
    def _logged(fn: ExtensionOp) -> ExtensionOp:
        def op(req: Request) -> Response:
            try:
                return fn(req)
            except WiringError as e:
                log.warning("management.refused", operation=req.operation, type=req.type, name=req.name,
                            status=e.status, description=str(e), user=req.user)
                return Response(e.status, str(e))

        return op

    # ----- queues -------------------------------------------------------------------------------------------------
    def _queue(self, name: Any, what: str = "queue") -> Queue:
        if not isinstance(name, str) or not name:
            raise InvalidRequest(f"{what} name missing (application property 'name')")
        q = self.queues.get(name)
        if q is None:
            raise NotFound(f"{what} {name!r} not found")
        return q

    def _writable(self, q: Queue) -> None:
        role, _ = self.server.role_epoch()
        if role == "backup":
            raise Conflict(f"this broker is a backup: queue {q.name!r} is a replica; do this on the primary")

    @staticmethod
    def _body(req: Request, allowed: tuple[str, ...]) -> dict[str, Any]:
        if req.body is None:
            return {}
        if not isinstance(req.body, dict):
            raise InvalidRequest(f"request body must be a map, got {type(req.body).__name__}")
        unknown = sorted(str(k) for k in req.body if k not in allowed)
        if unknown:
            raise InvalidRequest(f"unknown attribute {unknown[0]!r} (expected {', '.join(allowed) or 'none'})")
        return dict(req.body)

    def purge(self, req: Request) -> Response:
        """Remove every available message (acquired ones stay with their consumers)."""
        q = self._queue(req.name)
        self._body(req, ())
        self._writable(q)
        n = q.purge(acquired=False)
        log.info("queue.purged", queue=q.name, count=n, user=req.user)
        return Response(200, f"purged {n} messages from {q.name}", {"purged": n, "depth": q.depth})

    def move(self, req: Request) -> Response:
        """Move the oldest `count` available messages (all without a count) to the queue `destination`, each keeping
        its body, properties and expiry; all or nothing (refused when the destination has no room for them). With
        --max-memory, of messages paged to disk about 40 % of the bound per request: then `more` is true, and the
        caller asks again for the rest (ha-admin move does)."""
        src = self._queue(req.name)
        body = self._body(req, ("destination", "count"))
        count = body.get("count")
        if count is not None and (isinstance(count, bool) or not isinstance(count, int) or count < 1):
            raise InvalidRequest(f"count must be an integer >= 1, got {count!r}")
        if "destination" not in body:
            raise InvalidRequest("destination missing (attribute 'destination': a queue name)")
        dst = self._queue(body["destination"], "destination queue")
        if dst is src:
            raise InvalidRequest(f"source and destination are the same queue {src.name!r}")
        self._writable(src)
        self._writable(dst)
        wanted: list[int] = []
        # Paged messages are read back into memory (and enqueued there on the destination, paged out again only
        # once journaled): about 40 % of --max-memory of them per request, and `more` says the caller asks again.
        memory = self.server.memory
        limit, paged_bytes, more = (memory.share_low if memory is not None else 0), 0, False
        for pos in src.positions_after(0):  # paged messages too (read back below)
            e = src.get(pos)
            if e is None or e.state == AVAILABLE:
                if e is None and limit and src.paged is not None and (p := src.paged.find(pos)) is not None:
                    if wanted and paged_bytes + p[2] > limit:
                        more = True
                        break
                    paged_bytes += p[2]
                wanted.append(pos)
                if count is not None and len(wanted) == count:
                    break
        found = src.read(wanted)
        taken = [found[p] for p in wanted if p in found]
        room = _room(dst, len(taken), sum(e.size for e in taken))
        if room is not None:
            raise Conflict(f"destination queue {dst.name!r} has no room for {len(taken)} messages: {room}")
        lvq = dst.options.lvq_key
        metas = []
        for e in taken:  # every message's header and last-value key first: a refusal moves nothing
            meta = decode(e.data, trusted=True)
            try:
                metas.append((meta, current_key(lvq) if lvq is not None else None))
            except MalformedMessage as err:
                raise Conflict(f"message {e.position} of {src.name!r} cannot go to last-value queue {dst.name!r}: "
                               f"{err.description}; nothing moved") from None
        for e, (meta, key) in zip(taken, metas, strict=True):
            dst.enqueue(e.data, meta.priority, e.expires, meta.durable, key)
            if src.get(e.position) is e:
                src.dequeue(e, DequeueReason.PURGED)  # gone from this queue by an operator's hand
            else:  # read back from disk
                src.dequeue_positions([e.position], DequeueReason.PURGED)
        if taken:
            self.server.wake_queue(dst)
        log.info("queue.moved", queue=src.name, destination=dst.name, count=len(taken), user=req.user)
        return Response(200, f"moved {len(taken)} messages from {src.name} to {dst.name}" +
                        (" (more are paged to disk: ask again)" if more else ""),
                        {"moved": len(taken), "depth": src.depth, "destination_depth": dst.depth, "more": more})

    # ----- connections --------------------------------------------------------------------------------------------
    def query_connections(self, req: Request) -> Response:
        body = self._body(req, ("attributeNames",))
        rows = [connection_read(st) for st in self.server.connections.states()]
        names = body.get("attributeNames")
        if names is not None and (not isinstance(names, list) or not all(isinstance(n, str) for n in names)):
            raise InvalidRequest("attributeNames must be a list of strings")
        if not names:
            names = sorted({k for r in rows for k in r}) or sorted(CONNECTION_ATTRIBUTES)
        return Response(200, "OK", {"attributeNames": names, "results": [[r.get(n) for n in names] for r in rows]},
                        {"count": len(rows)})

    def close_connection(self, req: Request) -> Response:
        """Close one connection (name: its id) with amqp:connection:forced; its unsettled messages go back."""
        text = req.name
        if not isinstance(text, str) or not text.strip().isdigit():
            raise InvalidRequest(f"connection name must be its id (an integer, see QUERY connection), got {text!r}")
        ident = int(text)
        st = next((s for s in self.server.connections.states() if s.id == ident), None)
        if st is None:
            raise NotFound(f"connection {ident} not found")
        if not st.connection.state & Endpoint.LOCAL_ACTIVE:
            raise Conflict(f"connection {ident} is already closing")
        row = connection_read(st)
        for h in list(st.links):  # now, not when the peer answers: what its consumers held goes back at once
            self.server.connections.link_gone(h.link)
        self.server.connections.close(st, "amqp:connection:forced",
                                      f"closed by an operator (management, user {req.user})")
        log.warning("connection.closed_by_operator", connection=ident, remote=st.remote, kind=st.kind,
                    user=req.user)  # the operator's user; the connection's own is in its connection.opened
        return Response(200, f"connection {ident} ({st.remote}, {st.kind}) closed", row)


CONNECTION_ATTRIBUTES = ("id", "remote", "user", "kind", "admin", "container", "links", "consumers", "publishers")


def connection_read(st: ConnectionState) -> dict[str, Any]:
    links = sorted((_link_read(h) for h in st.links), key=lambda r: r["name"])
    return {
        "id": st.id,
        "remote": st.remote,
        "user": st.user,
        "kind": st.kind,
        "admin": st.admin,
        "container": st.connection.remote_container,
        "links": links,
        "consumers": sum(1 for r in links if r["kind"] in ("consumer", "browser")),
        "publishers": sum(1 for r in links if r["kind"] == "publisher"),
    }


def _link_read(h: LinkHandler) -> dict[str, Any]:
    row: dict[str, Any] = {"name": h.link.name, "kind": type(h).__name__, "address": None}
    if isinstance(h, PublisherLink):
        row.update(kind="publisher", address=h.address, unsettled=h.unsettled)
    elif isinstance(h, ConsumerLink):
        row.update(kind="browser" if h.browse else "consumer", address=h.queue.name, unsettled=len(h.unacked),
                   credit=h.credit)
    elif isinstance(h, EventsLink):
        row.update(kind="events", address="$events")
    else:
        ends = (h.link.remote_target if h.link.is_receiver else h.link.remote_source)
        row["address"] = ends.address if ends is not None else None
    return row


def _room(q: Queue, n: int, size: int) -> str | None:
    """Why `n` more messages of `size` bytes in all do not fit `q` (limits with policy reject), or None."""
    o = q.options
    if o.ring or o.lvq_key is not None:
        return None
    if o.max_count is not None and q.depth + n > o.max_count:
        return f"max-count {o.max_count}, depth {q.depth}"
    if o.max_size is not None and q.bytes + size > o.max_size:
        return f"max-size {o.max_size}, {q.bytes} bytes queued, {size} to move"
    return None


def install_operations(server: Server) -> None:
    """Register the operator actions (queue PURGE/MOVE, connection QUERY/DELETE) on a server before it starts."""
    BrokerOperations(server).install()
