"""A broker plugin for tests of the settlement hold: `ha-broker --plugin tests.support.holder_plugin:install`.

It holds every client delivery that reached a queue, and adds management operations on type `test-holder`:
`READ` answers how many are held and the positions in the order they were held, `RELEASE` (admin) releases them
all at once. `install_even` holds, through the group hook (`Extension.hold_group`), only deliveries at even
positions: the others are settled at once. The broker process must be able to
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
        self.order: list[int] = []  # positions, in the order they were held

    def hold(self, completion: Completion, routed: list[tuple[Queue, Entry]]) -> bool:
        self.held.append(completion)
        self.order.extend(e.position for _, e in routed)
        return True

    def read(self, req: Request) -> Response:
        return Response(200, "OK", {"held": len(self.held), "released": self.released, "order": self.order})

    def release_all(self, req: Request) -> Response:
        batch, self.held = self.held, []
        for c in batch:
            c.release()
        self.released += len(batch)
        return Response(200, f"released {len(batch)}", {"released": len(batch)})


class HoldEven(HoldEverything):
    """Holds, of each group, the deliveries at even positions only (the way to hold part of a group)."""

    def hold_group(self, queue: Queue, completions: list[Completion], entries: list[Entry]) -> bool:
        for c, e in zip(completions, entries, strict=True):
            if e.position % 2 == 0:
                c.pending += 1
                self.held.append(c)
                self.order.append(e.position)
        return False


def install(server: Server) -> None:
    _install(server, HoldEverything())


def install_even(server: Server) -> None:
    _install(server, HoldEven())


def _install(server: Server, holder: HoldEverything) -> None:
    server.add_extension(holder)
    server.management.register(TYPE, "READ", holder.read, write=False)
    server.management.register(TYPE, "RELEASE", holder.release_all, write=True)
