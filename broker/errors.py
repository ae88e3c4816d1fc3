"""One error tree for the broker and the layers above it.

Every error a peer (client, backup, operator) can cause derives from `BrokerError`, which carries the AMQP condition
to answer with (h11's `error_status_hint`, for AMQP) and, for management, the status code. Where the error is
raised decides what is closed or refused: a link attach (`LinkError`), a connection (`Refusal`), one message
(`MessageRefused` and below: the transfer is rejected and the link stays), a management request (`WiringError`).

Misuse of the API by our own code is not a `BrokerError`: it raises `ValueError`/`AssertionError` and is logged as
`broker.error` (a bug), never answered as if the peer were at fault.

    BrokerError                     amqp:internal-error
    ├── LinkError                   refuse or close a link (any condition)
    ├── Refusal                     refuse a connection (any condition)
    ├── WiringError (status 400)    a management request that cannot be done
    │   ├── InvalidRequest          400 amqp:invalid-field
    │   ├── NotFound                404 amqp:not-found
    │   └── Conflict                409 amqp:resource-locked
    ├── MessageRefused              one transfer is rejected, the link stays
    │   ├── MalformedMessage        amqp:decode-error
    │   ├── QueueFull               amqp:resource-limit-exceeded
    │   ├── JournalRefusal          amqp:resource-limit-exceeded (the journal cannot write)
    │   ├── MemoryRefusal           amqp:resource-limit-exceeded (over --max-memory, cannot page to disk)
    │   └── NoRoute                 amqp:not-found / amqp:precondition-failed
    └── ProtocolError               a replication peer broke the protocol (amqp:decode-error); the link is closed
        └── BatchError              a malformed replication batch
"""

from __future__ import annotations

from typing import Any


class BrokerError(Exception):
    """Root of every error a peer can cause. `condition` is the AMQP error condition to send back."""

    condition = "amqp:internal-error"

    def __init__(self, description: str, condition: str | None = None, info: dict[str, Any] | None = None) -> None:
        super().__init__(description)
        self.description = description
        if condition is not None:
            self.condition = condition
        self.info = info


class LinkError(BrokerError):
    """Refuse an attach, or close an attached link, with `condition`."""

    def __init__(self, condition: str, description: str) -> None:
        super().__init__(description, condition)


class Refusal(BrokerError):
    """Refuse a connection (at open) with `condition`; `info` goes into the close (e.g. a redirect's address)."""

    def __init__(self, condition: str, description: str, info: dict[str, Any] | None = None) -> None:
        super().__init__(description, condition, info)


class WiringError(BrokerError):
    """A wiring request that cannot be done. `status` is the management status code to answer with."""

    status = 400
    condition = "amqp:invalid-field"

    def __init__(self, description: str) -> None:
        super().__init__(description)


class InvalidRequest(WiringError):
    status = 400
    condition = "amqp:invalid-field"


class NotFound(WiringError):
    status = 404
    condition = "amqp:not-found"


class Conflict(WiringError):
    status = 409
    condition = "amqp:resource-locked"


class MessageRefused(BrokerError):
    """One message cannot be taken: its transfer is rejected with `condition`, the link stays attached."""


class MalformedMessage(MessageRefused, ValueError):
    """The bytes are not a valid AMQP 1.0 message."""

    condition = "amqp:decode-error"

    def __init__(self, description: str) -> None:
        super().__init__(description)


class QueueFull(MessageRefused):
    """The queue is at max-count/max-size with policy reject."""

    condition = "amqp:resource-limit-exceeded"

    def __init__(self, description: str) -> None:
        super().__init__(description)


class JournalRefusal(MessageRefused):
    """A durable message for a durable queue while the journal cannot write (disk full, I/O error)."""

    condition = "amqp:resource-limit-exceeded"

    def __init__(self, description: str) -> None:
        super().__init__(description)


class MemoryRefusal(MessageRefused):
    """Queued messages are over --max-memory and this message cannot be paged to disk (not durable, or a queue
    that cannot page)."""

    condition = "amqp:resource-limit-exceeded"

    def __init__(self, description: str) -> None:
        super().__init__(description)


class NoRoute(MessageRefused):
    """The message names no queue or exchange that exists (anonymous relay, or a deleted node)."""

    def __init__(self, condition: str, description: str) -> None:
        super().__init__(description, condition)


class ProtocolError(BrokerError):
    """A replication peer sent something the protocol does not allow: the link is closed, nothing is applied."""

    condition = "amqp:decode-error"

    def __init__(self, description: str, condition: str | None = None) -> None:
        super().__init__(description, condition)


class BatchError(ProtocolError):
    """A replication batch that cannot be applied (truncated, oversize, wrong positions)."""
