"""The disk's write+fdatasync latency, measured once per run on the disk that holds the brokers' data dirs.

What the journal does per commit (broker/store/journal.py): a write at the end of its data in a segment file that
was zero-filled (and fdatasynced) in advance, then `fdatasync`. Here: the same on a fresh file in the bench's work
directory (the parent of every broker's `--data-dir`), `count` times with `size` bytes each after a warm-up; the
figure is the median of write + fdatasync. Python's own cost per call (a few µs) is in it and is small against a
flush to the device. It prices the durable sync-latency goal: a durable message with one in flight waits for one
such commit. Beside it, `append_*`: the same appending to a file that grows (what the journal did before its
segments were zero-filled, and still does for the first megabytes after a start): that flush also commits the
file's new size.

`concurrent`: the same with 2 and 3 writers at once (threads, each on its own file; fdatasync releases the GIL), as
a primary and its backups on one machine flush their journals at the same moment: when the device serializes
flushes, their p50 is a multiple of the single writer's. Printed beside the goal figure, not used by it.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

from bench import stats

WARMUP = 50


def summarize(samples_us: list[float], path: str, size: int, filesystem: str) -> dict[str, Any]:
    """write+fdatasync samples (µs) -> p50/p99/mean (pure)."""
    if not samples_us:
        return {"samples": 0, "size": size, "path": path, "filesystem": filesystem, "p50_us": float("nan"),
                "p99_us": float("nan"), "mean_us": float("nan"), "error": "no samples"}
    return {"samples": len(samples_us), "size": size, "path": path, "filesystem": filesystem,
            "p50_us": stats.percentile(samples_us, 50), "p99_us": stats.percentile(samples_us, 99),
            "mean_us": sum(samples_us) / len(samples_us), "error": None}


def mount_of(path: str, mounts_text: str) -> str:
    """'device fstype on mountpoint' of the longest mount point containing `path`, from /proc/mounts text (pure)."""
    best: tuple[int, str] = (-1, "?")
    for line in mounts_text.splitlines():
        parts = line.split()
        if len(parts) < 3:
            continue
        dev, mnt, fstype = parts[0], parts[1].replace("\\040", " "), parts[2]
        inside = path == mnt or path.startswith(mnt.rstrip("/") + "/")
        if inside and len(mnt) > best[0]:
            best = (len(mnt), f"{dev} {fstype} on {mnt}")
    return best[1]


def _writes(path: Path, count: int, size: int, samples: list[float], errors: list[str],
            start: threading.Barrier | None = None, prepared: bool = True) -> None:
    data = b"\xa5" * size
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | (0 if prepared else os.O_APPEND), 0o600)
    try:
        if prepared:  # as the journal's Preparer does: zeros, on disk, then written over from the start
            total = size * (WARMUP + count)
            zeros = bytes(min(total, 1 << 20))
            done = 0
            while done < total:
                done += os.write(fd, zeros[: total - done])
            os.fdatasync(fd)
            os.lseek(fd, 0, os.SEEK_SET)
        if start is not None:
            start.wait(30)
        for i in range(WARMUP + count):
            t0 = time.perf_counter()
            os.write(fd, data)
            os.fdatasync(fd)
            if i >= WARMUP:
                samples.append((time.perf_counter() - t0) * 1e6)
    except (OSError, threading.BrokenBarrierError) as e:
        errors.append(f"{type(e).__name__}: {e}")
    finally:
        os.close(fd)
        path.unlink(missing_ok=True)


def _concurrent_p50(directory: Path, writers: int, count: int, size: int) -> float:
    samples: list[float] = []
    errors: list[str] = []
    start = threading.Barrier(writers)
    threads = [threading.Thread(target=_writes, args=(directory / f"fsync-probe-{writers}-{i}.bin", count, size,
                                                        samples, errors, start)) for i in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return float("nan") if errors else stats.percentile(samples, 50)


def measure(directory: Path, count: int = 2000, size: int = 256, concurrent: tuple[int, ...] = (2, 3)
            ) -> dict[str, Any]:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "fsync-probe.bin"
    try:
        filesystem = mount_of(str(path.resolve()), Path("/proc/mounts").read_text())
    except OSError:
        filesystem = "?"
    samples: list[float] = []
    errors: list[str] = []
    _writes(path, count, size, samples, errors)
    out = summarize(samples, str(path), size, filesystem)
    if errors:
        out["error"] = errors[0]
        return out
    appends: list[float] = []
    _writes(path, count, size, appends, errors, prepared=False)
    grown = summarize(appends, str(path), size, filesystem)
    out["append_p50_us"], out["append_p99_us"] = grown["p50_us"], grown["p99_us"]
    out["concurrent_p50_us"] = {str(w): _concurrent_p50(directory, w, max(1, count // 2), size) for w in concurrent}
    return out
