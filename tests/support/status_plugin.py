"""A backup that lets go of its primary's `$ha.status` link on demand: `ha-broker --plugin
tests.support.status_plugin:install`.

Management operation `DETACH` on type `test-status` closes the backup's status link and nothing else (its
connection and its other links stay), as a bug on either side or a peer of another release might. Test-only: the
broker process must be able to import `tests`.
"""

from __future__ import annotations

from broker.management import Request, Response
from broker.server import Server
from ha.node import HaNode

TYPE = "test-status"


def install(server: Server) -> None:
    def detach(req: Request) -> Response:
        node = next((e for e in server.extensions if isinstance(e, HaNode)), None)
        backup = node.backup if node is not None else None
        if backup is None or backup.status_link is None:
            return Response(409, "not a backup with a status link")
        backup.status_link.close()
        return Response(200, "detached")

    server.management.register(TYPE, "DETACH", detach, write=True)
