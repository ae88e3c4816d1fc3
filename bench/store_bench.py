"""Which storage engine for the journal? `python -m bench.store_bench [--dir DIR]` measures, on this machine's disk:

- `segment-log`: an append-only log of our own (length, CRC, record); a batch = one write + one fdatasync;
  dequeues appended as position ranges; recovery reads the files once;
- `sqlite-wal`: SQLite (the standard library's sqlite3) in WAL mode with synchronous=FULL (durable at each commit);
  a batch = one transaction of inserts; dequeues as range deletes; recovery = one ordered SELECT;
- `lmdb` (if the `lmdb` package is installed): a batch = one write transaction (durable at commit); dequeues as
  deletes; recovery = a cursor scan.

For each: durable appends of 128-byte messages in batches of 1, 10, 100 and 1000 (a batch stands for what one pass
of the broker gathers: one group commit), msg/s and CPU µs/msg; dequeue of everything in batches; recovery of 1M
live messages. Prints one markdown table. Not in CI.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import sqlite3
import struct
import tempfile
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

BODY = b"m" * 128
_REC = struct.Struct(">IIBIQ")  # length, crc, kind, queue, position


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


class SegmentLog:
    name = "segment-log"

    def __init__(self, d: Path) -> None:
        self.path = d / "00000001.log"
        self.fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)

    def append(self, batch: list[tuple[int, int, bytes]]) -> None:
        parts = []
        for q, pos, body in batch:
            head = struct.pack(">BIQ", 1, q, pos)
            parts.append(_REC.pack(13 + len(body), zlib.crc32(body, zlib.crc32(head)), 1, q, pos))
            parts.append(body)
        os.write(self.fd, b"".join(parts))
        os.fdatasync(self.fd)

    def dequeue(self, q: int, lo: int, hi: int) -> None:
        rec = struct.pack(">BIQQ", 2, q, lo, hi)
        os.write(self.fd, struct.pack(">II", len(rec), zlib.crc32(rec)) + rec)
        os.fdatasync(self.fd)

    def recover(self) -> int:
        data = self.path.read_bytes()
        off, n, live = 0, len(data), {}
        while off < n:
            length, crc = struct.unpack_from(">II", data, off)
            rec = data[off + 8 : off + 8 + length]
            if zlib.crc32(rec) != crc:
                raise ValueError("crc")
            kind = rec[0]
            if kind == 1:
                q, pos = struct.unpack_from(">IQ", rec, 1)
                live[(q, pos)] = rec[13:]
            off += 8 + length
        return len(live)

    def close(self) -> None:
        os.close(self.fd)


class SqliteWal:
    name = "sqlite-wal"

    def __init__(self, d: Path) -> None:
        self.db = sqlite3.connect(d / "store.db", isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=FULL")
        self.db.execute("CREATE TABLE IF NOT EXISTS m (q INTEGER, pos INTEGER, body BLOB, PRIMARY KEY (q, pos)) WITHOUT ROWID")

    def append(self, batch: list[tuple[int, int, bytes]]) -> None:
        self.db.execute("BEGIN")
        self.db.executemany("INSERT INTO m VALUES (?, ?, ?)", batch)
        self.db.execute("COMMIT")

    def dequeue(self, q: int, lo: int, hi: int) -> None:
        self.db.execute("DELETE FROM m WHERE q = ? AND pos BETWEEN ? AND ?", (q, lo, hi))

    def recover(self) -> int:
        return sum(1 for _ in self.db.execute("SELECT q, pos, body FROM m ORDER BY q, pos"))

    def close(self) -> None:
        self.db.close()


class Lmdb:
    name = "lmdb"

    def __init__(self, d: Path) -> None:
        import lmdb  # type: ignore[import-not-found]

        self.env = lmdb.open(str(d), map_size=8 << 30, sync=True, metasync=True)

    def append(self, batch: list[tuple[int, int, bytes]]) -> None:
        with self.env.begin(write=True) as txn:
            for q, pos, body in batch:
                txn.put(struct.pack(">IQ", q, pos), body)

    def dequeue(self, q: int, lo: int, hi: int) -> None:
        with self.env.begin(write=True) as txn:
            for pos in range(lo, hi + 1):
                txn.delete(struct.pack(">IQ", q, pos))

    def recover(self) -> int:
        with self.env.begin() as txn:
            return sum(1 for _ in txn.cursor())

    def close(self) -> None:
        self.env.close()


def run(make: Callable[[Path], Any], root: Path, messages: int, recover_n: int) -> list[str]:
    rows = []
    for batch in (1, 10, 100, 1000):
        n = min(messages, 2000 * batch)  # batch 1 is one fsync per message: keep it short
        d = Path(tempfile.mkdtemp(dir=root))
        s = make(d)
        c0, t0 = cpu(), time.perf_counter()
        for start in range(1, n + 1, batch):
            s.append([(1, p, BODY) for p in range(start, min(start + batch, n + 1))])
        t1, c1 = time.perf_counter(), cpu()
        for start in range(1, n + 1, batch):
            s.dequeue(1, start, min(start + batch - 1, n))
        t2, c2 = time.perf_counter(), cpu()
        s.close()
        shutil.rmtree(d)
        rows.append(f"| {s.name} | {batch} | {n / (t1 - t0):,.0f} | {(c1 - c0) / n * 1e6:.1f} | "
                    f"{n / (t2 - t1):,.0f} | {(c2 - c1) / n * 1e6:.1f} | |")
    d = Path(tempfile.mkdtemp(dir=root))
    s = make(d)
    for start in range(1, recover_n + 1, 1000):
        s.append([(1, p, BODY) for p in range(start, min(start + 1000, recover_n + 1))])
    s.close()
    s = make(d)  # reopened, as a restarted broker would
    t0 = time.perf_counter()
    got = s.recover()
    t1 = time.perf_counter()
    s.close()
    size = sum(f.stat().st_size for f in d.iterdir())
    shutil.rmtree(d)
    rows.append(f"| {s.name} | recovery of {got:,} | | | | | {t1 - t0:.2f} s, {size / 2**20:.0f} MiB on disk |")
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--dir", type=Path, default=Path(__file__).resolve().parent / "results",
                   help="where to write (the disk under test) [bench/results]")
    p.add_argument("--messages", type=int, default=200_000)
    p.add_argument("--recover", type=int, default=1_000_000)
    a = p.parse_args()
    a.dir.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(dir=a.dir, prefix="store-bench-"))
    engines: list[Callable[[Path], Any]] = [SegmentLog, SqliteWal]
    try:
        import lmdb  # type: ignore[import-not-found]  # noqa: F401

        engines.append(Lmdb)
    except ImportError:
        print("(lmdb not installed: `pip install lmdb` to include it)")
    print("| engine | batch (msgs per commit) | durable append msg/s | CPU µs/msg | dequeue msg/s | CPU µs/msg | |")
    print("|---|---:|---:|---:|---:|---:|---|")
    try:
        for make in engines:
            for row in run(make, root, a.messages, a.recover):
                print(row, flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
