"""A backup that lets go of one of its primary's links on demand: `ha-broker --plugin
tests.support.status_plugin:install`.

Management operations on type `test-status`, as a bug on either side or a peer of another release might (its
connection and its other links stay): `DETACH` closes the backup's status link; `DETACH-QUEUE` (name: a queue)
closes that queue's replication link and never attaches it again. Test-only: the broker process must be able to
import `tests`.
"""

from __future__ import annotations

from broker.management import Request, Response
from broker.server import Server
from ha.backup import Backup
from ha.node import HaNode

TYPE = "test-status"


def install(server: Server) -> None:
    def this_backup() -> Backup | None:
        node = next((e for e in server.extensions if isinstance(e, HaNode)), None)
        return node.backup if node is not None else None

    def detach(req: Request) -> Response:
        backup = this_backup()
        if backup is None or backup.status_link is None:
            return Response(409, "not a backup with a status link")
        backup.status_link.close()
        return Response(200, "detached")

    def detach_queue(req: Request) -> Response:
        backup = this_backup()
        r = backup.replicators.pop(str(req.name), None) if backup is not None else None
        if r is None:
            return Response(409, f"not a backup replicating {req.name!r}")
        r.close()  # out of `replicators` first: nothing attaches it again
        return Response(200, "detached")

    server.management.register(TYPE, "DETACH", detach, write=True)
    server.management.register(TYPE, "DETACH-QUEUE", detach_queue, write=True)
