"""A broker plugin for tests of the settlement hold: `ha-broker --plugin tests.support.holder_plugin:install`.

It holds every client delivery that reached a queue, and adds management operations on type `test-holder`:
`READ` answers how many are held, `RELEASE` (admin) releases them all at once. The broker process must be able to
import `tests` (run it from the repository root or with PYTHONPATH set to it).
"""

from __future__ import annotations

from broker.extension import Extension
from broker.links import Completion
from broker.management import Request, Response
from broker.queue import Entry, Queue
from broker.server import Server

TYPE = "test-holder"


class HoldEverything(Extension):
    """An extension that holds every completion until told to let go."""

    def __init__(self) -> None:
        self.held: list[Completion] = []
        self.released = 0

    def hold(self, completion: Completion, routed: list[tuple[Queue, Entry]]) -> bool:
        self.held.append(completion)
        return True

    def read(self, req: Request) -> Response:
        return Response(200, "OK", {"held": len(self.held), "released": self.released})

    def release_all(self, req: Request) -> Response:
        batch, self.held = self.held, []
        for c in batch:
            c.release()
        self.released += len(batch)
        return Response(200, f"released {len(batch)}", {"released": len(batch)})


def install(server: Server) -> None:
    holder = HoldEverything()
    server.add_extension(holder)
    server.management.register(TYPE, "READ", holder.read, write=False)
    server.management.register(TYPE, "RELEASE", holder.release_all, write=True)
