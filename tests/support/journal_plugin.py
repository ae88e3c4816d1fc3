"""A journal whose writes fail on demand, as an I/O error would make them: `ha-broker --plugin
tests.support.journal_plugin:install`. Management operations on type `test-journal`: `BREAK` puts a read-only
descriptor of the current segment in place of the journal's own (every write fails with EBADF until `MEND` puts the
own back; the broker's probe then finds the journal writable again). `BREAK-READS` makes every read of a paged
message fail (a write-only descriptor in place of each segment's reader: EBADF, as an I/O error would) until
`MEND-READS`. Test-only: the broker process must be able to import `tests`.
"""

from __future__ import annotations

import os

from broker.management import Request, Response
from broker.server import Server
from broker.store.journal import segment_name

TYPE = "test-journal"


def install(server: Server) -> None:
    kept: list[int] = []

    def break_(req: Request) -> Response:
        j = server.store.journal if server.store is not None else None
        if j is None or j.fd < 0 or kept:
            return Response(409, "no journal open, or already broken")
        kept.append(j.fd)
        j.fd = os.open(j.directory / segment_name(j.segment), os.O_RDONLY)
        return Response(200, "broken")

    def mend(req: Request) -> Response:
        j = server.store.journal if server.store is not None else None
        if j is None or not kept:
            return Response(409, "not broken")
        os.close(j.fd)
        j.fd = kept.pop()
        return Response(200, "mended")

    def break_reads(req: Request) -> Response:
        store = server.store
        if store is None:
            return Response(409, "no journal")
        store._reader = lambda segment: os.open(store.directory / segment_name(segment), os.O_WRONLY)  # type: ignore
        return Response(200, "reads broken")

    def mend_reads(req: Request) -> Response:
        store = server.store
        if store is None or "_reader" not in vars(store):
            return Response(409, "reads not broken")
        del store._reader  # type: ignore[attr-defined]
        return Response(200, "reads mended")

    server.management.register(TYPE, "BREAK", break_, write=True)
    server.management.register(TYPE, "MEND", mend, write=True)
    server.management.register(TYPE, "BREAK-READS", break_reads, write=True)
    server.management.register(TYPE, "MEND-READS", mend_reads, write=True)
