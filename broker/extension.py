"""The one way a layer above the broker (HA) plugs into it: an `Extension` the server calls at fixed points.

`broker/` never imports `ha/`; it calls these methods on every installed extension, in order. `Extension` is a base
class whose methods do nothing, so an extension overrides only what it needs. Everything is called on the event loop
thread. This replaces the eleven hook attributes the server used to have (qpid's broker::Cluster interface is the
model: the broker tells the cluster what happens, and asks it a few questions).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from broker.connections import ConnectionState
    from broker.links import AcceptToken, Completion, LinkHandler
    from broker.management import Request, Response
    from broker.queue import Entry, Queue
    from broker.server import Server


class Extension:
    # ----- lifecycle -------------------------------------------------------------------------------------------
    def started(self, server: Server) -> None:
        """The broker listens (its port is known)."""

    def stopping(self) -> None:
        """The broker is shutting down."""

    # ----- identity ----------------------------------------------------------------------------------------------
    def role_epoch(self) -> tuple[str, int] | None:
        """(role, epoch) for logs and management; None = no opinion (standalone, 0)."""
        return None

    def attributes(self) -> dict[str, Any]:
        """Extra attributes of the broker object in management."""
        return {}

    def connection_properties(self) -> dict[str, Any]:
        """Extra properties of the broker's open frame."""
        return {}

    # ----- connections and links -------------------------------------------------------------------------------
    def admit(self, conn: ConnectionState) -> None:
        """A connection is opening: raise `broker.errors.Refusal` to refuse it."""

    def connection_closed(self, conn: ConnectionState) -> None:
        """A connection is gone (closed or lost)."""

    def attach(self, server: Server, link: Any, conn: ConnectionState, address: str) -> LinkHandler | None:
        """A peer attaches a link to `address`: return a handler to claim it (raise LinkError to refuse), or None
        to leave it to the broker."""
        return None

    # ----- management --------------------------------------------------------------------------------------------
    def management_refusal(self, req: Request) -> Response | None:
        """Before the broker handles a management request: a response to refuse it with (logged by the server as
        `management.refused`), or None to let it through."""
        return None

    # ----- messages ----------------------------------------------------------------------------------------------
    def hold(self, completion: Completion, routed: list[tuple[Queue, Entry]]) -> bool:
        """A client's delivery was enqueued at `routed` (on queues that are not plain, or by a transaction; deliveries
        to plain queues come as groups, `hold_group`). Return True to hold its settlement (then call
        `completion.release()` exactly once later)."""
        return False

    def hold_group(self, queue: Queue, completions: list[Completion], entries: list[Entry]) -> bool:
        """The client deliveries a pass enqueued on the plain queue `queue` (`entries[i]` is `completions[i]`'s
        message, in position order), shown at the start of the pass's end-of-pass work. Return True to hold every
        one of them (then release each exactly once later); to hold only some, add 1 to their `pending` yourself
        and return False. The default asks `hold` about each (if the extension has its own `hold`)."""
        if type(self).hold is Extension.hold:
            return False
        for c, e in zip(completions, entries, strict=True):
            if self.hold(c, [(queue, e)]):
                c.pending += 1
        return False

    def hold_accept(self, token: AcceptToken, queue: Queue) -> bool:
        """A consumer that waits for the broker's settlement (receiver-settle-mode second) accepted a message of
        `queue`, already dequeued (an `AcceptCompletion`), or a committed transaction dequeued messages of `queue`
        (the discharge's `Completion`). Return True to hold the answer (then call `token.release()` exactly once
        later)."""
        return False

    def committed(self, queues: list[Queue]) -> None:
        """A transaction was committed in this pass: it enqueued to or dequeued from `queues` (each once), all of it
        now (broker.transactions). Called before its discharge is held."""

    def may_settle(self) -> bool:
        """Checked before each batch of client settlements; while False they wait (retried every 50 ms)."""
        return True

    def dispatch_fence(self) -> Callable[[Queue], bool] | None:
        """Checked before a pass hands queued messages to client consumers: None lets every queue go; a predicate
        holds the queues it is true of (their messages stay queued; retried every 50 ms). Replication is not
        held."""
        return None

    def end_of_pass(self) -> bool:
        """At the end of each event-loop pass, after the broker's own work (batch what the pass gathered). Return
        True when something happened (e.g. completions were released): the server then goes round once more."""
        return False
