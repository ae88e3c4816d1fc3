"""The broker's wiring: queues, exchanges and bindings, with a broker-wide event sequence.

Every declare/delete/bind/unbind gets the next sequence number and is reported to the wiring observers (the `$events`
node, replication). A subscriber that attaches to the event stream first and then QUERYs knows that the query covers
every event with a sequence number up to the one the query reports.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from broker.errors import Conflict, InvalidRequest, NotFound, WiringError
from broker.exchange import Binding, BindingKey, Exchange
from broker.options import (
    BINDING_ARGUMENTS,
    EXCHANGE_ARGUMENTS,
    EXCHANGE_TYPES,
    QUEUE_ARGUMENTS,
    QUEUE_UPDATABLE,
    BadArgument,
    QueueOptions,
    normalize,
)
from broker.queue import Queue

__all__ = ["Conflict", "InvalidRequest", "NotFound", "Wiring", "WiringError", "WiringEvent", "WiringObserver"]


@dataclass(frozen=True, slots=True)
class WiringEvent:
    seq: int
    kind: str  # declared, deleted, bound, unbound
    type: str  # queue, exchange, binding
    name: str
    attributes: dict[str, Any] = field(default_factory=dict)

    def to_properties(self) -> dict[str, Any]:
        return {"seq": self.seq, "kind": self.kind, "type": self.type, "name": self.name}


class WiringObserver(Protocol):
    def wiring_changed(self, event: WiringEvent) -> None: ...


QUEUE_PREFIX_RESERVED = "$"


def check_name(name: Any, what: str) -> str:
    if not isinstance(name, str) or not name:
        raise InvalidRequest(f"{what} name must be a non-empty string")
    if len(name) > 255:
        raise InvalidRequest(f"{what} name longer than 255 characters")
    if name.startswith(QUEUE_PREFIX_RESERVED):
        raise InvalidRequest(f"{what} names starting with '$' are reserved")
    return name


class Wiring:
    def __init__(self) -> None:
        self.queues: dict[str, Queue] = {}
        self.exchanges: dict[str, Exchange] = {}
        self.seq = 0
        self.observers: list[WiringObserver] = []
        self.queue_observer_factories: list[Any] = []  # callables(queue) -> QueueObserver | None
        # True while this broker mirrors a primary's wiring (an HA backup): then an auto-delete exchange is not
        # deleted here when its last binding goes; the primary decides (its bindings to queues that do not
        # replicate are not mirrored) and its "deleted" event replicates.
        self.mirroring = False

    # ----- events -----------------------------------------------------------------------------------------------
    def _emit(self, kind: str, type_: str, name: str, attributes: dict[str, Any]) -> WiringEvent:
        self.seq += 1
        ev = WiringEvent(self.seq, kind, type_, name, attributes)
        for o in list(self.observers):
            o.wiring_changed(ev)
        return ev

    # ----- queues -----------------------------------------------------------------------------------------------
    def declare_queue(
        self,
        name: str,
        arguments: dict[str, Any] | None = None,
        uuid: str | None = None,
        temporary: bool = False,
        allow_reserved: bool = False,
    ) -> tuple[Queue, bool]:
        """Create a queue; if it exists with the same arguments return it (created=False), else Conflict."""
        if not allow_reserved:
            check_name(name, "queue")
        if name in self.exchanges:
            raise Conflict(f"an exchange named {name!r} exists")
        try:
            args = normalize(arguments, QUEUE_ARGUMENTS)
            opts = QueueOptions.from_arguments(args)
        except BadArgument as e:
            raise InvalidRequest(str(e)) from None
        existing = self.queues.get(name)
        if existing is not None:
            if existing.arguments != args and arguments is not None and args:
                raise Conflict(f"queue {name!r} exists with different arguments")
            return existing, False
        q = Queue(name, args, opts, uuid=uuid, temporary=temporary)
        self.queues[name] = q
        for f in self.queue_observer_factories:
            obs = f(q)
            if obs is not None:
                q.observers.append(obs)
        self._emit("declared", "queue", name, self.queue_attributes(q))
        return q, True

    def update_queue(self, name: str, changes: dict[str, Any]) -> Queue:
        q = self.queue(name)
        bad = sorted(set(changes) - QUEUE_UPDATABLE)
        if bad:
            raise InvalidRequest(f"cannot update {', '.join(bad)} of a queue (updatable: {sorted(QUEUE_UPDATABLE)})")
        merged = dict(q.arguments)
        merged.update(changes)
        try:
            args = normalize(merged, QUEUE_ARGUMENTS)
            q.update_options(args, QueueOptions.from_arguments(args))
        except (BadArgument, ValueError) as e:
            raise InvalidRequest(str(e)) from None
        self._emit("declared", "queue", name, self.queue_attributes(q))
        return q

    def queue(self, name: str) -> Queue:
        q = self.queues.get(name)
        if q is None:
            raise NotFound(f"queue {name!r} not found")
        return q

    def delete_queue(self, name: str) -> Queue:
        q = self.queue(name)
        for ex in list(self.exchanges.values()):  # an auto-delete exchange may go with its last binding
            for ident in [k for k in ex.bindings if k.queue == name]:
                self.unbind(ident.exchange, ident.queue, ident.key)
        del self.queues[name]
        q.deleted = True
        q.drop_all()  # observers learn it from the "deleted" event, not message by message (1M would block)
        self._emit("deleted", "queue", name, {"uuid": q.uuid})
        return q

    @staticmethod
    def queue_attributes(q: Queue) -> dict[str, Any]:
        return {
            "name": q.name,
            "uuid": q.uuid,
            "arguments": dict(q.arguments),
            "temporary": q.temporary,
        }

    # ----- exchanges --------------------------------------------------------------------------------------------
    def declare_exchange(
        self, name: str, type_: str, arguments: dict[str, Any] | None = None, uuid: str | None = None
    ) -> tuple[Exchange, bool]:
        check_name(name, "exchange")
        if type_ not in EXCHANGE_TYPES:
            raise InvalidRequest(f"exchange type must be one of {', '.join(EXCHANGE_TYPES)}, got {type_!r}")
        if name in self.queues:
            raise Conflict(f"a queue named {name!r} exists")
        try:
            args = normalize(arguments, EXCHANGE_ARGUMENTS)
        except BadArgument as e:
            raise InvalidRequest(str(e)) from None
        if args.get("alternate-exchange") == name:
            raise InvalidRequest(f"alternate-exchange: exchange {name!r} cannot be its own alternate")
        existing = self.exchanges.get(name)
        if existing is not None:
            if existing.type != type_ or (arguments is not None and args and existing.arguments != args):
                raise Conflict(f"exchange {name!r} exists with a different type or arguments")
            return existing, False
        ex = Exchange(name, type_, args, uuid=uuid)
        self.exchanges[name] = ex
        self._emit("declared", "exchange", name, self.exchange_attributes(ex))
        return ex, True

    def exchange(self, name: str) -> Exchange:
        ex = self.exchanges.get(name)
        if ex is None:
            raise NotFound(f"exchange {name!r} not found")
        return ex

    def delete_exchange(self, name: str) -> Exchange:
        ex = self.exchange(name)
        for ident in list(ex.bindings):
            self._unbind(ex, ident, auto_delete=False)
        del self.exchanges[name]
        self._emit("deleted", "exchange", name, {"uuid": ex.uuid})
        return ex

    @staticmethod
    def exchange_attributes(ex: Exchange) -> dict[str, Any]:
        return {"name": ex.name, "type": ex.type, "uuid": ex.uuid, "arguments": dict(ex.arguments)}

    # ----- bindings ---------------------------------------------------------------------------------------------
    def bind(
        self, exchange: str, queue: str, key: str, arguments: dict[str, Any] | None = None, uuid: str | None = None
    ) -> tuple[Binding, bool]:
        ex = self.exchange(exchange)
        self.queue(queue)
        if not isinstance(key, str):
            raise InvalidRequest("binding-key must be a string")
        try:
            args = normalize(arguments, BINDING_ARGUMENTS)
        except BadArgument as e:
            raise InvalidRequest(str(e)) from None
        ident = BindingKey(exchange, queue, key)
        existing = ex.bindings.get(ident)
        if existing is not None:
            if arguments is not None and args and existing.arguments != args:
                raise Conflict(f"binding {existing.name!r} exists with different arguments")
            return existing, False
        b = Binding(exchange, queue, key, args, **({"uuid": uuid} if uuid else {}))
        ex.bind(b)
        self._emit("bound", "binding", b.name, self.binding_attributes(b))
        return b, True

    def unbind(self, exchange: str, queue: str, key: str) -> Binding:
        """Remove a binding; an auto-delete exchange goes with its last one (not while mirroring a primary)."""
        return self._unbind(self.exchange(exchange), BindingKey(exchange, queue, key), auto_delete=True)

    def _unbind(self, ex: Exchange, ident: BindingKey, auto_delete: bool) -> Binding:
        b = ex.unbind(ident)
        if b is None:
            raise NotFound(f"binding {ident.exchange}|{ident.queue}|{ident.key} not found")
        self._emit("unbound", "binding", b.name, self.binding_attributes(b))
        if auto_delete and ex.auto_delete and not ex.bindings and not self.mirroring \
                and self.exchanges.get(ex.name) is ex:
            self.delete_exchange(ex.name)
        return b

    # ----- routing ----------------------------------------------------------------------------------------------
    def route(self, exchange: str, subject: str | None) -> tuple[str, ...]:
        """Names of the queues a message sent to `exchange` with this subject goes to. When no binding of an
        exchange matches, the message goes through its `alternate-exchange` (if that exists), and so on down the
        chain; each exchange is tried once (a cycle ends unrouted). Counts `routed` on the exchange that routed it
        and `unrouted` on each one that did not."""
        ex = self.exchanges[exchange]
        tried = {exchange}
        while True:
            names = ex.route(subject)
            if names:
                ex.routed += 1
                return names
            ex.unrouted += 1
            alt = ex.alternate
            if alt is None or alt in tried or alt not in self.exchanges:
                return ()
            tried.add(alt)
            ex = self.exchanges[alt]

    def bindings(self) -> list[Binding]:
        return [b for ex in self.exchanges.values() for b in ex.bindings.values()]

    @staticmethod
    def binding_attributes(b: Binding) -> dict[str, Any]:
        return {
            "name": b.name,
            "source": b.exchange,
            "destination": b.queue,
            "binding-key": b.key,
            "arguments": dict(b.arguments),
            "uuid": b.uuid,
        }
