"""The broker's connections: the handler of every accepted connection's rare events (open, sessions, link attach
and detach, close, transport errors), and each connection's state. The hot path (a link's deliveries and credit)
does not come here: the engine hands it straight to the link's handler (broker.links)."""

from __future__ import annotations

import functools
import itertools
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from proton import Condition, Endpoint, Link, Terminus

from broker import __version__
from broker.access import AccessDenied
from broker.attach import MANAGEMENT
from broker.auth import Admission, Kind, SaslSetup, Trust, admit, login_name
from broker.engine import Conn
from broker.errors import LinkError, Refusal, WiringError
from broker.links import ConsumerLink, LinkHandler, PublisherLink
from broker.log import get_logger
from broker.tls import explain, is_tls_failure

if TYPE_CHECKING:
    from broker.server import Server

log = get_logger("broker")

_conn_ids = itertools.count(1)


@dataclass(eq=False)
class ConnectionState:
    conn: Conn
    id: int = field(default_factory=lambda: next(_conn_ids))
    remote: str = ""
    user: str | None = None
    admin: bool = False
    kind: str = "client"
    properties: dict[Any, Any] = field(default_factory=dict)
    links: set[LinkHandler] = field(default_factory=set)
    unsettled_returned: int = 0
    refused: bool = False
    counted: bool = False  # one of the client connections `--max-connections` (and `-per-user`) bound

    @property
    def connection(self) -> Any:
        return self.conn.connection


F = TypeVar("F", bound=Callable[..., None])


def guarded(fn: F) -> F:
    """A bug in one event must not take the broker down: log it, close the link or connection involved."""

    @functools.wraps(fn)
    def wrapper(self: Connections, event: Any) -> None:
        try:
            fn(self, event)
        except Exception as e:
            log.error("broker.error", where=fn.__name__, exc_info=True)
            cond = Condition("amqp:internal-error", f"{type(e).__name__}: {e}")
            link = getattr(event, "link", None)
            try:
                if link is not None and link.state & Endpoint.LOCAL_ACTIVE:
                    self.link_gone(link)
                    link.condition = cond
                    link.close()
                elif event.connection is not None and not event.connection.state & Endpoint.LOCAL_CLOSED:
                    event.connection.condition = cond
                    if event.connection.state & Endpoint.LOCAL_UNINIT:  # its open unanswered: answer, then close
                        event.connection.open()
                    event.connection.close()
            except Exception:
                log.error("broker.error", where="cleanup", exc_info=True)

    return wrapper  # type: ignore[return-value]


class Connections:
    """Every accepted connection and the links attached on them."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.conns: dict[Any, ConnectionState] = {}  # pn_connection_t* -> state
        self.links: dict[Any, LinkHandler] = {}  # pn_link_t* -> handler
        self.clients = 0  # client connections open (bounded by --max-connections)
        self.per_user: Counter[str] = Counter()  # of them, by user (bounded by --max-connections-per-user)

    def __len__(self) -> int:
        return len(self.conns)

    def states(self) -> list[ConnectionState]:
        return list(self.conns.values())

    def is_open(self, st: ConnectionState) -> bool:
        """Whether this connection is still served: its peer has not closed it and its socket is up."""
        return self.conns.get(st.connection._impl) is st

    @staticmethod
    def close(st: ConnectionState, condition: str, description: str) -> bool:
        """Close one accepted connection with an error condition; False when it is closing already."""
        c = st.connection
        if not c.state & Endpoint.LOCAL_ACTIVE:
            return False
        c.condition = Condition(condition, description)
        c.close()
        return True

    def accepted(self, conn: Conn) -> Connections:
        """A new socket: set up SASL before the first byte is read. This server handles its events."""
        sasl = conn.transport.sasl()
        sasl.allow_insecure_mechs = True
        if self.server.sasl_dir is not None:
            sasl.config_path(str(self.server.sasl_dir))
            sasl.config_name(SaslSetup.CONFIG_NAME)
        sasl.allowed_mechs(" ".join(self.server.config.sasl_mechanisms))
        return self

    @guarded
    def on_connection_remote_open(self, event: Any) -> None:
        c = event.connection
        conn = self.server.engine.conn_of(c)
        if conn is None or c._impl in self.conns:
            return
        st = ConnectionState(conn)
        conn.state = st
        st.remote = conn.remote
        st.user = login_name(event.transport) if event.transport else None
        try:
            props = c.remote_properties or {}
        except RecursionError:  # proton's Python reads them recursively
            refusal = Refusal("amqp:decode-error", "connection properties nested too deeply to read")
            self._refuse_connection(c, st, refusal)
            log.warning("connection.refused", remote=st.remote, condition=refusal.condition,
                        description=refusal.description)
            return
        st.properties = dict(props)
        # The role comes from who logged in; the properties only ask (broker.auth.admit).
        granted = admit(self.trust(), st.user, props)
        st.kind, st.admin = granted.kind.value, granted.admin
        if st.kind == Kind.HA and self.server.config.ha_cluster:
            # Only replication connections are declared dead after two silent heartbeats; a client that is
            # busy in its own code for a while must not lose its connection.
            event.transport.idle_timeout = self.server.config.ha_heartbeat * 2
        self.conns[c._impl] = st
        c.offered_capabilities = ["ANONYMOUS-RELAY"]
        props_out: dict[str, Any] = {"product": "understudy", "version": __version__, "x-understudy-broker": self.server.id}
        for ext in self.server.extensions:
            props_out.update(ext.connection_properties())
        c.properties = props_out
        if granted.refusal is not None:
            # Who logged in may not be what it asked to be: refused before any extension sees it.
            log.warning("access.refused", remote=st.remote, user=st.user, kind=granted.asked,
                        condition=Admission.CONDITION, description=granted.refusal)
            self._refuse_connection(c, st, Refusal(Admission.CONDITION, granted.refusal))
            return
        try:
            for ext in self.server.extensions:
                ext.admit(st)
            if st.kind == Kind.CLIENT:
                self._count_client(st)
        except Refusal as r:
            self._refuse_connection(c, st, r)
            log.warning("connection.refused", remote=st.remote, condition=r.condition, description=r.description)
            return
        c.open()
        log.info("connection.opened", connection=st.id, remote=st.remote, user=st.user, kind=st.kind)

    def _count_client(self, st: ConnectionState) -> None:
        """One more client connection, unless `--max-connections` of them are open, or
        `--max-connections-per-user` of its user's (Refusal). Backups and operators' tools are not counted: a
        client that leaks connections must not keep out replication or the tools that would show it; with a bound
        per user, it keeps out no other user's clients either."""
        config = self.server.config
        limit, per_user = config.max_connections, config.max_connections_per_user
        if limit and self.clients >= limit:
            raise Refusal("amqp:resource-limit-exceeded",
                          f"{self.clients} client connections are open, the broker's limit (--max-connections "
                          f"{limit}): try again later")
        user = st.user or "anonymous"
        if per_user and self.per_user[user] >= per_user:
            raise Refusal("amqp:resource-limit-exceeded",
                          f"user {user!r} has {self.per_user[user]} client connections open, the broker's limit "
                          f"per user (--max-connections-per-user {per_user}): try again later")
        st.counted = True
        self.clients += 1
        self.per_user[user] += 1

    def trust(self) -> Trust:
        return Trust.of(self.server.users, self.server.config.ha_username)

    @staticmethod
    def _refuse_connection(c: Any, st: ConnectionState, r: Refusal) -> None:
        st.refused = True
        c.condition = Condition(r.condition, r.description, r.info)  # type: ignore[arg-type]
        c.open()
        c.close()

    @guarded
    def on_session_remote_open(self, event: Any) -> None:
        if event.connection._impl in self.conns:
            event.session.open()

    @guarded
    def on_session_remote_close(self, event: Any) -> None:
        if event.connection._impl in self.conns:
            ssn = event.session
            for h in list(self.links.values()):
                if h.link.session == ssn:
                    self.link_gone(h.link)
            ssn.close()

    @guarded
    def on_connection_remote_close(self, event: Any) -> None:
        c = event.connection
        if c._impl in self.conns:
            self._connection_gone(c)
            c.close()

    @guarded
    def on_transport_error(self, event: Any) -> None:
        # Failed logins end here, before any connection opens: say so (the client only sees its own error).
        c, t = event.connection, event.transport
        cond = t.condition if t is not None else None
        conn = self.server.engine.conn_of(c) if c is not None else None
        if cond is not None and conn is not None and conn.tls is not None and c._impl not in self.conns \
                and is_tls_failure(cond.name, cond.description):
            # A failed handshake (wrong CA, expired or missing certificate, a plain client on a TLS-only port):
            # the peer only sees its own side of it.
            log.warning("tls.refused", remote=conn.remote, reason=explain(cond.description, "client"),
                        description=cond.description)
            return
        if cond is not None and cond.name == "amqp:unauthorized-access" and c is not None \
                and c._impl not in self.conns:
            conn = self.server.engine.conn_of(c)
            log.warning("connection.refused", remote=conn.remote if conn else "", condition=cond.name,
                        description=cond.description, user=t.user if t is not None else None)

    @guarded
    def on_transport_closed(self, event: Any) -> None:
        c = event.connection
        if c is not None and c._impl in self.conns:
            self._connection_gone(c)

    def _connection_gone(self, c: Any) -> None:
        st = self.conns.pop(c._impl, None)
        if st is None:
            return
        if st.counted:
            self.clients -= 1
            user = st.user or "anonymous"
            self.per_user[user] -= 1
            if not self.per_user[user]:
                del self.per_user[user]
        for h in [h for h in self.links.values() if h.conn is st]:
            self.link_gone(h.link)
        for ext in self.server.extensions:
            ext.connection_closed(st)
        if not st.refused:
            err = c.remote_condition.name if c.remote_condition else None
            log.info("connection.closed", connection=st.id, error=err, unsettled_returned=st.unsettled_returned)

    # ----- links ------------------------------------------------------------------------------------------------
    @guarded
    def on_link_remote_open(self, event: Any) -> None:
        link = event.link
        st = self.conns.get(event.connection._impl)
        if st is None or link._impl in self.links:
            return
        refusal = self._backup_refusal(link)
        if refusal is not None:
            self._refuse_link(link, st, Admission.CONDITION, refusal, access=True)
            return
        try:
            handler = self.server.attacher.attach(link, st)
        except AccessDenied as e:  # the rules of --acl-file: already logged as acl.denied
            self._refuse_link(link, st, e.condition, e.description, logged=True)
            return
        except (LinkError, WiringError) as e:
            self._refuse_link(link, st, e.condition, e.description, access=e.condition == Admission.CONDITION)
            return
        self.links[link._impl] = handler
        self.server.engine.add_fast(link, handler)
        st.links.add(handler)
        if link.state & Endpoint.LOCAL_UNINIT:
            link.open()
        if isinstance(handler, PublisherLink):
            handler.top_up()
        handler.on_flow()

    def _backup_refusal(self, link: Link) -> str | None:
        """A backup takes messages only from its primary's replication, which arrives on the backup's own
        connection to the primary, never on an accepted one: every publisher attaching here is refused, whoever it
        is (only requests to `$management` are sent to a backup)."""
        if not link.is_receiver or link.remote_target.address == MANAGEMENT or not self._is_backup():
            return None
        return (f"{self.server.id} is a backup: its queues take messages only from its primary's replication "
                "(publish to the primary)")

    def _is_backup(self) -> bool:
        return self.server.role_epoch()[0] == "backup"

    def refuse_publishers(self, description: str) -> int:
        """Detach every publisher attached on an accepted connection with `amqp:unauthorized-access` (the broker
        has just become a backup). Returns how many."""
        n = 0
        for st in self.states():
            for h in [h for h in st.links if isinstance(h, PublisherLink)]:
                addr = h.link.remote_target.address
                log.warning("access.refused", connection=st.id, remote=st.remote, user=st.user, kind=st.kind,
                            address=addr, condition=Admission.CONDITION, description=description)
                self.close_link(h.link, Admission.CONDITION, description)
                n += 1
        return n

    def close_clients(self, condition: str, description: str) -> int:
        """Close every client connection (the broker stopped being the primary): its links first, so that nothing
        arriving on them afterwards reaches a queue. Returns how many."""
        n = 0
        for st in self.states():
            if st.kind != "client":
                continue
            for h in list(st.links):
                self.close_link(h.link, condition, description)
            n += self.close(st, condition, description)
        return n

    def _refuse_link(self, link: Link, st: ConnectionState, condition: str, description: str,
                     access: bool = False, logged: bool = False) -> None:
        addr = (link.remote_target if link.is_receiver else link.remote_source).address
        if logged:
            pass
        elif access:  # who the peer is does not allow it
            log.warning("access.refused", connection=st.id, remote=st.remote, user=st.user, kind=st.kind,
                        address=addr, condition=condition, description=description)
        else:
            log.warning("link.refused", connection=st.id, address=addr, condition=condition,
                        description=description)
        # Attach with a null terminus then detach with the error, as the spec asks.
        if link.is_receiver:
            link.target.type = Terminus.UNSPECIFIED
        else:
            link.source.type = Terminus.UNSPECIFIED
        link.open()
        link.condition = Condition(condition, description)
        link.close()

    @guarded
    def on_link_remote_close(self, event: Any) -> None:
        self._remote_detach(event.link)

    @guarded
    def on_link_remote_detach(self, event: Any) -> None:
        self._remote_detach(event.link)

    def _remote_detach(self, link: Link) -> None:
        if link._impl in self.links:
            self.link_gone(link)
        if link.state & Endpoint.LOCAL_ACTIVE and link.connection._impl in self.conns:
            link.close()

    def link_gone(self, link: Link) -> None:
        h = self.links.pop(link._impl, None)
        self.server.engine.remove_fast(link)
        if h is None or h.closed:
            return
        h.closed = True
        h.conn.links.discard(h)
        self.server.woken.discard(h)
        h.on_detached()
        if isinstance(h, ConsumerLink):
            self.server.attacher.consumer_gone(h)

    def close_link(self, link: Link, condition: str, description: str) -> None:
        self.link_gone(link)
        if link.state & Endpoint.LOCAL_ACTIVE:
            link.condition = Condition(condition, description)
            link.close()

