"""A management operation whose reply proton cannot encode, as a bug in an operation might produce: `ha-broker
--plugin tests.support.reply_plugin:install`. `UNENCODABLE` on type `test-reply` succeeds and answers a body with an
integer no AMQP type holds. Test-only: the broker process must be able to import `tests`.
"""

from __future__ import annotations

from broker.management import Request, Response
from broker.server import Server

TYPE = "test-reply"


def install(server: Server) -> None:
    def unencodable(req: Request) -> Response:
        return Response(200, "done", body={"n": 2**64})

    server.management.register(TYPE, "UNENCODABLE", unencodable, write=False)
