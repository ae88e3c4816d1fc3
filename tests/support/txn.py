"""proton's transactional client (`Container.declare_transaction`) driven from a BlockingConnection, for tests."""

from __future__ import annotations

from typing import Any

from proton import Delivery, Message, Timeout
from proton.handlers import TransactionHandler
from proton.utils import BlockingConnection, BlockingReceiver, BlockingSender


class _Events(TransactionHandler):
    def __init__(self) -> None:
        super().__init__()
        self.txn: Any = None
        self.declare_failed: Any = None
        self.result: str | None = None
        self.condition: Any = None

    def on_transaction_declared(self, event: Any) -> None:
        self.txn = event.transaction

    def on_transaction_declare_failed(self, event: Any) -> None:
        self.declare_failed = event.delivery.remote.condition or "rejected"

    def on_transaction_committed(self, event: Any) -> None:
        self.result = "committed"

    def on_transaction_aborted(self, event: Any) -> None:
        self.result = "aborted"

    def on_transaction_commit_failed(self, event: Any) -> None:
        self.result = "failed"
        self.condition = event.delivery.remote.condition


class Txn:
    """One declared transaction on `conn`: `send`, `accept`, then `commit()` or `abort()` (each returns the
    outcome: `committed`, `aborted` or `failed`; `condition` holds the error of a failed commit)."""

    def __init__(self, conn: BlockingConnection, timeout: float = 10.0) -> None:
        self.conn = conn
        self.timeout = timeout
        self.events = _Events()
        conn.container.declare_transaction(conn.conn, handler=self.events)
        conn.wait(lambda: self.events.txn is not None or self.events.declare_failed is not None,
                  timeout=timeout, msg="declare")
        if self.events.declare_failed is not None:
            raise RuntimeError(f"declare failed: {self.events.declare_failed}")
        self.id = bytes(self.events.txn.id)

    @property
    def condition(self) -> Any:
        return self.events.condition

    def send(self, sender: BlockingSender, msg: Message) -> Delivery:
        """Send under the transaction; waits for the broker's answer (the delivery's remote state)."""
        d = self.events.txn.send(sender.link, msg)
        self.conn.wait(lambda: d.remote_state != 0 or d.settled, timeout=self.timeout, msg="transactional transfer")
        return d  # type: ignore[no-any-return]

    def accept(self, receiver: BlockingReceiver) -> None:
        """Accept the oldest message `receiver` holds unsettled, under the transaction."""
        assert receiver.fetcher is not None
        d = receiver.fetcher.unsettled.popleft()
        self.events.txn.accept(d)

    def commit(self) -> str:
        self.events.txn.commit()
        return self._result()

    def start_commit(self) -> None:
        """Send the discharge (commit) without waiting for its answer: see `answered`."""
        self.events.txn.commit()

    def answered(self, timeout: float) -> str | None:
        """The outcome of a discharge sent, once the broker answered it within `timeout` seconds, else None."""
        try:
            self.conn.wait(lambda: self.events.result is not None, timeout=timeout, msg="discharge")
        except Timeout:
            return None
        return self.events.result

    def abort(self) -> str:
        self.events.txn.abort()
        return self._result()

    def _result(self) -> str:
        self.conn.wait(lambda: self.events.result is not None, timeout=self.timeout, msg="discharge")
        assert self.events.result is not None
        return self.events.result
