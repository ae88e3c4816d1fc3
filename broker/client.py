"""A small blocking management client (`$management` requests), used by `ha-admin`, `ha-status` and tests."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any

from proton import Message, SSLDomain
from proton.utils import BlockingConnection, SyncRequestResponse

from broker.tls import explain

KIND_PROPERTY = "x-understudy-kind"


class ManagementError(Exception):
    """A request failed: transport trouble, or a non-2xx status (then `status` is set)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class Reply:
    status: int
    description: str
    body: Any
    properties: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    def rows(self) -> list[dict[str, Any]]:
        """QUERY results as a list of dicts."""
        names = self.body["attributeNames"]
        return [dict(zip(names, r, strict=False)) for r in self.body["results"]]


def connect(
    url: str,
    timeout: float = 5.0,
    kind: str = "admin",
    user: str | None = None,
    password: str | None = None,
    ssl_domain: SSLDomain | None = None,
) -> BlockingConnection:
    """With `ssl_domain` (broker.tls.client_domain) the connection is TLS (`amqps://`) whatever `url` says."""
    props = {KIND_PROPERTY: kind}
    kw: dict[str, Any] = {"properties": props, "reconnect": False}
    if ssl_domain is not None:
        url = "amqps://" + url.split("://", 1)[-1]
        kw["ssl_domain"] = ssl_domain
    if user is not None:
        kw.update(user=user, password=password, allow_insecure_mechs=True, sasl_enabled=True)
        kw["allowed_mechs"] = "PLAIN"
    return BlockingConnection(url, timeout=timeout, **kw)


class ManagementClient:
    def __init__(
        self,
        url: str,
        timeout: float = 5.0,
        user: str | None = None,
        password: str | None = None,
        kind: str = "admin",
        ssl_domain: SSLDomain | None = None,
    ) -> None:
        self.url = url
        try:
            self.conn = connect(url, timeout, kind, user, password, ssl_domain)
            self.rpc = SyncRequestResponse(self.conn, "$management")
        except Exception as e:
            text = _describe(e)
            if ssl_domain is None and ("no protocol header found" in text or "TLS connections only" in text):
                text += " (a TLS-only broker: give --ssl-ca)"
            self.close()  # a connection that opened but whose links did not: not left behind
            raise ManagementError(f"cannot reach {url}: {text}") from None

    def request(self, operation: str, type_: str, name: str | None = None, body: Any = None, **props: Any) -> Reply:
        ap: dict[str, Any] = {"operation": operation, "type": type_}
        if name is not None:
            ap["name"] = name
        ap.update(props)
        try:
            resp = self.rpc.call(Message(properties=ap, body=body))
        except Exception as e:
            raise ManagementError(f"{operation} {type_} on {self.url} failed: {_describe(e)}") from None
        p: dict[str, Any] = dict(resp.properties or {})
        return Reply(int(p.pop("statusCode", 500)), str(p.pop("statusDescription", "")), resp.body, p)

    def call(self, operation: str, type_: str, name: str | None = None, body: Any = None, **props: Any) -> Reply:
        """Like request(), but a non-2xx status raises ManagementError."""
        r = self.request(operation, type_, name, body, **props)
        if not r.ok:
            raise ManagementError(f"{operation} {type_} {name or ''}: {r.status} {r.description}".strip(), r.status)
        return r

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.conn.close()
        # proton keeps a link's handler in the C link, and SyncRequestResponse, its reply receiver's handler, holds
        # the connection: a cycle through C that the garbage collector cannot see, ~1.7 MB per client (measured).
        # A long-running caller (understudy-cluster, a monitor) grew by that for every request.
        with contextlib.suppress(Exception):
            self.rpc.receiver.link.handler = None

    def __enter__(self) -> ManagementClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _describe(e: Exception) -> str:
    text = str(e) or type(e).__name__
    cond = getattr(getattr(e, "link", None), "remote_condition", None) or getattr(
        getattr(e, "connection", None), "remote_condition", None
    )
    if cond is not None:
        text = f"{cond.name}: {cond.description}"
    if "SSL Failure" in text:  # proton's text of a failed handshake (a ConnectionException carries no condition)
        detail = text[text.index("SSL Failure"):].rstrip("')\"")
        text = f"TLS: {explain(detail)} ({detail})"
    return text
