"""A primary that breaks its own replication batches on demand: `ha-broker --plugin tests.support.corrupt_plugin:install`.

Management operation `ARM` on type `test-corrupt` with body {"how": H} damages the next batch transfer the primary
sends (any queue), one of: truncate, oversize, zero, twice, version, junk. The backup must refuse the batch whole,
log it, close the link and catch up again: nothing lost, nothing applied twice. Test-only: the broker process must
be able to import `tests`.
"""

from __future__ import annotations

import struct
from typing import Any

import ha.replicating
from broker.management import Request, Response
from broker.server import Server

TYPE = "test-corrupt"
_HEAD = 11  # data section (8) + "UB" + version
_ENQ = struct.Struct(">cQBBIdI")


def _damage(payload: bytes, how: str) -> bytes:
    body = bytearray(payload)
    first = _HEAD  # the first record
    if how == "truncate":
        return bytes(body[:-3]) if len(body) > _HEAD + 3 else bytes(body)
    if how == "version":
        body[10] = 9
    elif how == "junk":
        body[first] = ord("Z")
    elif body[first : first + 1] == b"E":
        kind, pos, level, flags, count, expires, n = _ENQ.unpack_from(body, first)
        if how == "zero":
            _ENQ.pack_into(body, first, kind, 0, level, flags, count, expires, n)
        elif how == "oversize":
            _ENQ.pack_into(body, first, kind, pos, level, flags, count, expires, 1 << 31)
        elif how == "twice":  # the first record again at the end: a position twice in one batch
            record = bytes(body[first : first + _ENQ.size + n])
            body += record
            size = len(body) - 8
            body[4:8] = size.to_bytes(4, "big")
    return bytes(body)


def install(server: Server) -> None:
    armed: dict[str, Any] = {"how": None, "done": 0}
    original = ha.replicating.ReplicatingSender._send

    def send(self: ha.replicating.ReplicatingSender, payload: bytes) -> None:
        how = armed["how"]
        if how is not None and payload[8:10] == b"UB" and payload[_HEAD : _HEAD + 1] == b"E":
            armed["how"] = None
            armed["done"] += 1
            payload = _damage(payload, how)
        original(self, payload)

    ha.replicating.ReplicatingSender._send = send  # type: ignore[method-assign]

    def arm(req: Request) -> Response:
        body = req.body if isinstance(req.body, dict) else {}
        armed["how"] = body.get("how")
        return Response(200, f"armed {armed['how']}")

    def read(req: Request) -> Response:
        return Response(200, "OK", {"done": armed["done"], "armed": armed["how"]})

    server.management.register(TYPE, "ARM", arm, write=True)
    server.management.register(TYPE, "READ", read, write=False)
