"""Access control at the broker's edges: the rules of `--acl-file` (broker.acl) applied where a peer asks for
something, reloaded on SIGHUP.

Checked once per attach (publish, consume, browse, and create when the attach would create a queue), once per
management write (create, delete, manage), and on the anonymous relay once per message address (a cached decision).
A denial answers `amqp:unauthorized-access` (an attach is refused; a relayed message is rejected; a management
request gets 403) and is logged as `acl.denied` with the user and the object.

Granted without rules: to the replication user (`--ha-username`: the brokers themselves) exactly what replication
needs - browsing the `$events` stream (a backup's first link); its `$ha.*` links are the HA extension's, which admits
only that user, and wiring mirroring uses management reads - and nothing else unless the file grants it (a leaked
replication password does not open the client queues); `manage` on broker-wide objects (connections, the HA
operations) to admin users (the replication user is one), so an operator is never locked out of `ha-admin`; to
anyone, dynamic (temporary reply) queues, attaching to `$management` and management reads.

A reload (SIGHUP) that fails keeps the rules in force and logs `acl.reload_failed`; one that succeeds logs
`acl.loaded` and detaches, with `amqp:unauthorized-access`, every link the new rules no longer allow.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from broker.acl import EVENTS, Acl, AclError, Action, Decision, Kind, load
from broker.auth import ANONYMOUS
from broker.errors import LinkError, MessageRefused
from broker.exchange import parse_binding_name
from broker.log import get_logger
from broker.management import Request, Response

if TYPE_CHECKING:
    from broker.connections import ConnectionState
    from broker.links import LinkHandler, PublisherLink
    from broker.server import Server

log = get_logger("broker")

CONDITION = "amqp:unauthorized-access"


class AccessDenied(LinkError):
    """An attach the rules do not allow (already logged as `acl.denied`)."""

    def __init__(self, description: str) -> None:
        super().__init__(CONDITION, description)


class RelayDenied(MessageRefused):
    """A message on the anonymous relay to an address the rules do not allow."""

    condition = CONDITION


@dataclass(frozen=True, slots=True)
class Grant:
    """What an attached link was allowed to do: checked again when the rules are reloaded."""

    action: Action
    kind: Kind
    name: str


def describe(user: str, action: Action, kind: Kind, name: str, decision: Decision, source: str) -> str:
    what = f"{kind.value} {name!r}" if kind != Kind.BROKER else name
    return f"user {user!r} may not {action.value} {what}: {decision.explain()} in {source}"


class Access:
    def __init__(self, server: Server) -> None:
        self.server = server
        self.path: Path | None = server.config.acl_file
        self.acl: Acl | None = None
        self._granted: weakref.WeakKeyDictionary[LinkHandler, Grant] = weakref.WeakKeyDictionary()
        self._relay_logged: weakref.WeakKeyDictionary[PublisherLink, set[str]] = weakref.WeakKeyDictionary()

    # ----- loading ------------------------------------------------------------------------------------------------
    def install(self, acl: Acl, reason: str) -> None:
        self.acl = acl
        log.info("acl.loaded", path=str(self.path), count=len(acl.rules), reason=reason)

    def reload(self) -> None:
        """SIGHUP (on the loop thread): read the file again; a bad file keeps the rules in force."""
        if self.path is None:
            return
        try:
            acl = load(self.path)
        except AclError as e:
            log.error("acl.reload_failed", path=str(self.path), description=f"{e}; the previous rules stay")
            return
        self.install(acl, "sighup")
        self._recheck()

    def _recheck(self) -> None:
        for st in self.server.connections.states():
            for h in list(st.links):
                grant = self._granted.get(h)
                if grant is None or h.closed:
                    continue
                description = self._denied(st, grant.action, grant.kind, grant.name, "reload")
                if description is not None:
                    self.server.close_link(h.link, CONDITION, description)

    # ----- decisions ----------------------------------------------------------------------------------------------
    def _implicit(self, st: ConnectionState, action: Action, kind: Kind, name: str) -> bool:
        if kind != Kind.BROKER:
            return False
        if action == Action.MANAGE:
            return st.admin
        replication_user = self.server.config.ha_username
        return action == Action.BROWSE and name == EVENTS and replication_user is not None \
            and st.user == replication_user

    def _denied(self, st: ConnectionState, action: Action, kind: Kind, name: str, via: str,
                operation: str | None = None) -> str | None:
        """None when allowed; else the reason, logged as `acl.denied`."""
        acl = self.acl
        if acl is None or self._implicit(st, action, kind, name):
            return None
        user = st.user or ANONYMOUS
        d = acl.decide(user, action, kind, name)
        if d.allowed:
            return None
        description = describe(user, action, kind, name, d, acl.source)
        extra = {"operation": operation} if operation is not None else {}
        log.warning("acl.denied", user=user, permission=action.value, type=kind.value, name=name, rule=d.rule,
                    via=via, connection=st.id, remote=st.remote, description=description, **extra)
        return description

    def attach(self, st: ConnectionState, action: Action, kind: Kind, name: str) -> Grant:
        """Check one attach; raises AccessDenied (logged). The grant is remembered with `track`."""
        description = self._denied(st, action, kind, name, "attach")
        if description is not None:
            raise AccessDenied(description)
        return Grant(action, kind, name)

    def track(self, h: LinkHandler, grant: Grant) -> None:
        if self.acl is not None:
            self._granted[h] = grant

    def relay(self, pub: PublisherLink, address: str) -> None:
        """A message on the anonymous relay to `address`; raises RelayDenied. Logged once per link and address
        (the rejections themselves are counted by `message.rejected`)."""
        st = pub.conn
        kind = Kind.EXCHANGE if address in self.server.wiring.exchanges else Kind.QUEUE
        acl = self.acl
        if acl is None or self._implicit(st, Action.PUBLISH, kind, address):
            return
        user = st.user or ANONYMOUS
        d = acl.decide(user, Action.PUBLISH, kind, address)
        if d.allowed:
            return
        description = describe(user, Action.PUBLISH, kind, address, d, acl.source)
        seen = self._relay_logged.setdefault(pub, set())
        if address not in seen and len(seen) < 100:
            seen.add(address)
            log.warning("acl.denied", user=user, permission="publish", type=kind.value, name=address, rule=d.rule,
                        via="relay", connection=st.id, remote=st.remote, description=description)
        raise RelayDenied(description)

    # ----- management -----------------------------------------------------------------------------------------------
    def reply(self, st: ConnectionState, queue: str) -> str | None:
        """A management reply to `queue` (not a temporary one) puts a message on it: the requesting user needs
        `publish` on it, as a sender would. None when allowed; else the reason (logged as `acl.denied`)."""
        return self._denied(st, Action.PUBLISH, Kind.QUEUE, queue, "management-reply")

    def management(self, st: ConnectionState, req: Request) -> Response | None:
        """A 403 for a management write the rules do not allow (logged), else None. Reads are open."""
        if self.acl is None:
            return None
        op = req.operation.upper()
        for action, kind, name in self._needs(op, req):
            description = self._denied(st, action, kind, name, "management", op)
            if description is not None:
                return Response(403, description)
        return None

    def _needs(self, op: str, req: Request) -> list[tuple[Action, Kind, str]]:
        """What a management request needs. A request too malformed to name its object needs nothing here: the
        handler answers it 400 without doing anything."""
        body = req.body if isinstance(req.body, dict) else {}
        name = req.name if req.name is not None else body.get("name")
        t = req.type
        if op in ("READ", "QUERY"):
            return []
        if t in ("queue", "exchange"):
            kind = Kind(t)
            if not isinstance(name, str):
                return []
            if op == "CREATE":
                return [(Action.CREATE, kind, name)]
            if op == "DELETE":
                return [(Action.DELETE, kind, name)]
            needs = [(Action.MANAGE, kind, name)]  # UPDATE, PURGE, MOVE
            dst = body.get("destination")
            if op == "MOVE" and isinstance(dst, str):
                needs.append((Action.MANAGE, Kind.QUEUE, dst))
            return needs
        if t == "binding":
            src = body.get("source")
            if not isinstance(src, str):
                parsed = parse_binding_name(req.name) if isinstance(req.name, str) else None
                src = parsed[0] if parsed is not None else None
            if src is None:
                return []
            action = {"CREATE": Action.CREATE, "DELETE": Action.DELETE}.get(op, Action.MANAGE)
            return [(action, Kind.EXCHANGE, src)]
        ext = self.server.management.extensions.get((t, op))
        if ext is not None and ext[1]:  # an extension's write: broker-wide (connection close, HA operations)
            return [(Action.MANAGE, Kind.BROKER, t)]
        return []
