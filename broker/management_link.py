"""The `$management` node's link: requests in, replies to each request's `reply-to`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from proton import Condition, Delivery, Link, Message

from broker.links import LinkHandler, reject
from broker.log import get_logger
from broker.management import Request, Response

if TYPE_CHECKING:
    from broker.connections import ConnectionState
    from broker.server import Server

log = get_logger("broker")


class ManagementLink(LinkHandler):
    """Requests to `$management`; replies go to each request's `reply-to`."""

    def __init__(self, server: Server, link: Link, conn: ConnectionState) -> None:
        super().__init__(server, link, conn)
        self.receiver = link
        link.flow(100)

    def on_delivery(self, d: Any) -> None:
        delivery = Delivery.wrap(d)
        if delivery.partial:
            return
        link = self.receiver
        data = link.recv(delivery.pending)
        link.advance()
        req_msg = Message()
        try:
            req_msg.decode(data or b"")
        except Exception as e:
            delivery.local.condition = Condition("amqp:decode-error", f"cannot decode request: {e}")
            delivery.update(Delivery.REJECTED)
            delivery.settle()
            link.flow(1)
            return
        props: dict[Any, Any] = req_msg.properties or {}
        op = props.get("operation")
        type_ = props.get("type")
        name = props.get("name")
        srv = self.server
        reply_to = req_msg.reply_to
        refused = srv.router.reply_refusal(reply_to, self.conn) if reply_to else None
        if refused is not None:  # before anything is carried out: its outcome could not be told
            condition, description = refused
            if condition != "amqp:unauthorized-access":  # that one is logged as acl.denied
                log.warning("management.reply_refused", operation=op, type=type_, name=name, reply_to=reply_to,
                            condition=condition, description=description, user=self.conn.user)
            reject(d, condition, description)
            link.flow(1)
            return
        if not isinstance(op, str) or not isinstance(type_, str):
            resp = Response(400, "request needs application properties 'operation' and 'type' (strings)")
        elif name is not None and not isinstance(name, str):
            resp = Response(400, "application property 'name' must be a string")
        else:
            req = Request(op, type_, name, req_msg.body, self.conn.user, self.conn.admin, props)
            resp = srv.access.management(self.conn, req) or srv.handle_management(req)
        correlation = req_msg.id if req_msg.id is not None else req_msg.correlation_id
        delivery.update(Delivery.ACCEPTED)
        delivery.settle()
        link.flow(1)
        if not reply_to:
            return
        try:
            delivered = srv.deliver_reply(reply_to, _reply(resp, correlation, reply_to))
        except Exception as e:  # a reply proton cannot encode (a bug: the arguments are checked to fit)
            log.error("management.error", operation=op, type=type_, name=name, exc_info=True)
            done = Response(500, f"{op} {type_} was carried out ({resp.status} {resp.description}), but its reply "
                            f"cannot be encoded: {type(e).__name__}: {e}")
            delivered = srv.deliver_reply(reply_to, _reply(done, correlation, reply_to))
        if not delivered:  # the reply queue went (a DELETE of itself) or is full: the request was carried out
            log.warning("management.reply_refused", operation=op, type=type_, name=name, reply_to=reply_to,
                        condition="amqp:resource-limit-exceeded" if reply_to in srv.wiring.queues
                        else "amqp:not-found",
                        description=f"{op} {type_} was carried out ({resp.status}), but its reply could not be put "
                                    f"on {reply_to!r}", user=self.conn.user)


def _reply(resp: Response, correlation: Any, reply_to: str) -> Message:
    return Message(properties={"statusCode": resp.status, "statusDescription": resp.description, **resp.properties},
                   body=resp.body, correlation_id=correlation, address=reply_to)
