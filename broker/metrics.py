"""Prometheus metrics (`--metrics-port`): what management READ and STATUS say, as metric families, on scrape.

Nothing is counted for the metrics on the hot path. The figures are the broker's own (queue depth and counters,
`broker_attributes`, the journal's and the memory bound's attributes, the HA node's `status()`), read when a scrape
asks for them, in three steps:

1. `take_snapshot(server)` runs **on the event loop** and copies those figures into a frozen `Snapshot` (plain
   numbers and strings; O(queues + backups), nothing per message).
2. `SnapshotPublisher.get()` runs in the HTTP thread: it hands `take_snapshot` to the loop
   (`call_soon_threadsafe`) and waits for it, at most `timeout` seconds. A snapshot younger than `max_age` is
   reused, so any number of scrapers cost the loop at most one snapshot per `max_age`. A loop that does not answer
   in time (blocked, or still recovering the journal) gets the previous snapshot served, and
   `understudy_metrics_snapshot_age_seconds` says how old it is.
3. `families(snapshot)` (pure) turns the snapshot into metric families; `MetricsServer` serves them with
   prometheus_client's HTTP server in its own daemon thread, which never touches a broker structure.

docs/metrics.md lists every metric and why the server is a thread and not part of the loop.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
)
from prometheus_client.exposition import start_http_server
from prometheus_client.registry import Collector, CollectorRegistry

from broker.log import get_logger

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

    from broker.server import Server

log = get_logger("broker")

SNAPSHOT_MAX_AGE = 0.5  # seconds a snapshot is reused for further scrapes
LOOP_TIMEOUT = 2.0  # seconds a scrape waits for the loop before serving the previous snapshot
PREFIX = "understudy"


@dataclass(frozen=True, slots=True)
class QueueFigures:
    name: str
    depth: int
    acquired: int
    bytes: int
    consumers: int
    enqueued: int
    dequeued: int
    expired: int
    duplicates: int
    rejected_full: int
    ring_evicted: int


@dataclass(frozen=True, slots=True)
class BackupFigures:
    """One other member of the cluster as this broker knows it (replication figures only on a primary)."""

    name: str
    role: str
    state: str
    backlog: int | None  # None: the primary has no replication session with it (yet)
    lag_seconds: float | None
    queues: int | None
    catchup_fraction: float | None
    lag_histogram: dict[str, Any] | None = None  # bounds, counts, sum, count (ha.core.lag.LagHistogram.to_wire)


@dataclass(frozen=True, slots=True)
class Snapshot:
    monotonic: float  # when it was taken (time.monotonic)
    broker: str
    version: str
    uptime: float
    role: str
    epoch: int
    connections: int
    queues_total: int
    exchanges: int
    loop_passes: int
    queues: tuple[QueueFigures, ...]
    ha_state: str | None = None  # None: not an HA broker
    ha_position: int | None = None
    backups: tuple[BackupFigures, ...] = ()
    journal: dict[str, Any] | None = None  # the store's attributes (None: no journal)
    memory: dict[str, Any] | None = None  # the memory bound's attributes (None: no --max-memory)


def take_snapshot(server: Server) -> Snapshot:
    """The broker's figures now. On the event loop thread only."""
    attrs = server.broker_attributes()
    queues = tuple(
        QueueFigures(q.name, q.depth, q.acquired_count, q.bytes, q.consumer_count, q.stats.enqueued,
                     q.stats.dequeued, q.stats.expired, q.stats.duplicates, q.stats.rejected_full,
                     q.stats.ring_evicted)
        for q in server.wiring.queues.values()
        if not q.temporary  # reply queues of management clients come and go with every call: no series for them
    )
    ha_state = ha_position = None
    backups: list[BackupFigures] = []
    status = _ha_status(server)
    if status is not None:
        ha_state = str(status["state"])
        ha_position = int(status["position"])
        for m in status.get("members", ()):
            if m.get("name") == server.id:
                continue
            lag_ms = m.get("lag_ms")
            catchup = m.get("catchup") or {}
            backups.append(BackupFigures(
                str(m["name"]), str(m["role"]), str(m["state"]), m.get("backlog"),
                None if lag_ms is None else float(lag_ms) / 1000.0, m.get("queues"), catchup.get("fraction"),
                m.get("lag_histogram")))
    return Snapshot(
        monotonic=time.monotonic(), broker=str(attrs["name"]), version=str(attrs["version"]),
        uptime=float(attrs["uptime"]), role=str(attrs["role"]), epoch=int(attrs["epoch"]),
        connections=int(attrs["connections"]), queues_total=int(attrs["queues"]),
        exchanges=int(attrs["exchanges"]), loop_passes=int(attrs["loop-passes"]), queues=queues,
        ha_state=ha_state, ha_position=ha_position, backups=tuple(backups),
        journal=attrs.get("journal"), memory=attrs.get("memory"))


def _ha_status(server: Server) -> dict[str, Any] | None:
    """The HA node's STATUS body, if an HA extension is installed (broker/ does not import ha/: duck typing on
    the one method management STATUS calls)."""
    for ext in server.extensions:
        status = getattr(ext, "status", None)
        if callable(status):
            result: dict[str, Any] = status()
            return result
    return None


# ----- snapshot -> metric families (pure) ---------------------------------------------------------------------------
def _n(name: str) -> str:
    return f"{PREFIX}_{name}"


def families(s: Snapshot | None, now: float) -> Iterator[Metric]:
    """The metric families of one snapshot (`now`: time.monotonic(), for the snapshot's age)."""
    age = GaugeMetricFamily(_n("metrics_snapshot_age_seconds"),
                            "Age of the figures served (large: the event loop did not answer the scrape)")
    age.add_metric([], -1.0 if s is None else max(0.0, now - s.monotonic))
    yield age
    if s is None:
        return
    info = InfoMetricFamily(_n("broker"), "The broker's id and version", labels=["broker", "version"])
    info.add_metric([s.broker, s.version], {})
    yield info
    yield _gauge("broker_uptime_seconds", "Seconds since the broker started", s.uptime)
    role = GaugeMetricFamily(_n("broker_role"), "1 for the broker's current role (standalone, primary, backup)",
                             labels=["role"])
    role.add_metric([s.role], 1)
    yield role
    yield _gauge("broker_epoch", "The HA epoch the broker is in (0: standalone)", s.epoch)
    yield _gauge("connections", "Open AMQP connections (clients and other brokers)", s.connections)
    yield _gauge("queues", "Queues, temporary ones included", s.queues_total)
    yield _gauge("exchanges", "Exchanges", s.exchanges)
    yield _counter("loop_passes", "Passes of the event loop", s.loop_passes)
    yield from _queue_families(s.queues)
    if s.ha_state is not None:
        state = GaugeMetricFamily(_n("ha_state"), "1 for the broker's HA state", labels=["state"])
        state.add_metric([s.ha_state], 1)
        yield state
        yield _gauge("ha_position", "Sum of the highest positions of replicated queues", s.ha_position or 0)
        yield from _backup_families(s.backups)
    if s.journal is not None:
        yield from _journal_families(s.journal)
    if s.memory is not None:
        m = s.memory
        yield _gauge("memory_used_bytes", "Bytes queued messages take in memory (--max-memory accounting)", m["used"])
        yield _gauge("memory_limit_bytes", "--max-memory", m["limit"])
        yield _gauge("memory_over", "1 while memory use is over --max-memory (messages refused)", int(bool(m["over"])))


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(_n(name), doc, value=value)


def _counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(_n(name), doc, value=value)


_QUEUE_GAUGES: tuple[tuple[str, str, str], ...] = (
    ("queue_depth", "depth", "Messages on the queue (available, acquired and paged to disk)"),
    ("queue_acquired", "acquired", "Messages delivered to consumers and not yet settled"),
    ("queue_bytes", "bytes", "Bytes of the messages on the queue"),
    ("queue_consumers", "consumers", "Consumers and browsers attached"),
)
_QUEUE_COUNTERS: tuple[tuple[str, str, str], ...] = (
    ("queue_enqueued", "enqueued", "Messages enqueued"),
    ("queue_dequeued", "dequeued", "Messages removed for any reason (acknowledged, rejected, expired, evicted, purged)"),
    ("queue_expired", "expired", "Messages removed by their TTL"),
    ("queue_duplicates", "duplicates", "Transfers dropped as duplicates (duplicate-window)"),
    ("queue_rejected_full", "rejected_full", "Transfers refused because the queue was full (reject policy)"),
    ("queue_ring_evicted", "ring_evicted", "Messages evicted by a ring queue to make room"),
)


def _queue_families(queues: Iterable[QueueFigures]) -> Iterator[Metric]:
    qs = list(queues)
    for name, attr, doc in _QUEUE_GAUGES:
        g = GaugeMetricFamily(_n(name), doc, labels=["queue"])
        for q in qs:
            g.add_metric([q.name], getattr(q, attr))
        yield g
    for name, attr, doc in _QUEUE_COUNTERS:
        c = CounterMetricFamily(_n(name), doc, labels=["queue"])
        for q in qs:
            c.add_metric([q.name], getattr(q, attr))
        yield c


def _backup_families(backups: Iterable[BackupFigures]) -> Iterator[Metric]:
    bs = list(backups)
    state = GaugeMetricFamily(_n("ha_member_state"), "1 for each other member's role and state as this broker "
                              "knows them (a primary: its own view; a backup: its primary's list)",
                              labels=["member", "role", "state"])
    lag = GaugeMetricFamily(_n("ha_backup_lag_seconds"),
                            "Age of the oldest replicated message this backup has not acknowledged (0: none)",
                            labels=["backup"])
    backlog = GaugeMetricFamily(_n("ha_backup_backlog"), "Replicated messages the backup has not acknowledged",
                                labels=["backup"])
    queues = GaugeMetricFamily(_n("ha_backup_queues"), "Queues replicated to the backup", labels=["backup"])
    catchup = GaugeMetricFamily(_n("ha_backup_catchup_fraction"),
                                "Share of the catch-up the backup has acknowledged (1: caught up)", labels=["backup"])
    hist = HistogramMetricFamily(_n("ha_backup_replication_lag_seconds"),
                                 "Replication lag (enqueue on the primary to the backup's acknowledgement) since "
                                 "this broker became primary; from the ha.lag samples, each weighted by 1/sample_rate",
                                 labels=["backup"])
    for b in bs:
        h = b.lag_histogram
        if h is not None:
            running, buckets = 0.0, []
            for le, c in zip([*h["bounds"], "+Inf"], h["counts"], strict=True):
                running += c
                buckets.append((str(le) if le == "+Inf" else repr(float(le)), running))
            hist.add_metric([b.name], buckets, float(h["sum"]))
    for b in bs:
        state.add_metric([b.name, b.role, b.state], 1)
        if b.lag_seconds is not None:
            lag.add_metric([b.name], b.lag_seconds)
        if b.backlog is not None:
            backlog.add_metric([b.name], b.backlog)
        if b.queues is not None:
            queues.add_metric([b.name], b.queues)
        if b.catchup_fraction is not None:
            catchup.add_metric([b.name], b.catchup_fraction)
    yield from (state, lag, backlog, queues, catchup, hist)


def _journal_families(j: dict[str, Any]) -> Iterator[Metric]:
    yield _gauge("journal_segments", "Journal segment files", j["segments"])
    yield _gauge("journal_durable_queues", "Durable queues in the journal", j["durable-queues"])
    yield _counter("journal_written_bytes", "Bytes written to the journal since start", j["written"])
    yield _counter("journal_commits", "Journal commits (one write and fdatasync each) since start", j["commits"])
    yield _gauge("journal_failed", "1 while journal writes fail (durable messages refused)", int(j["failed"] is not None))
    yield _gauge("journal_disk_low", "1 while the journal's disk is under --min-disk-free (durable messages refused)",
                 int(j.get("low-disk") is not None))
    yield _gauge("journal_backups_disk_low", "Backups reporting their journal's disk under their --min-disk-free "
                 "(a primary refuses durable messages while any does)", len(j.get("backups-low-disk") or {}))
    if j.get("disk-free", -1) >= 0:
        yield _gauge("journal_disk_free_bytes", "Bytes free on the journal's file system (looked at every second "
                     "with --min-disk-free)", j["disk-free"])
    yield _gauge("journal_sync_wait_seconds", "How long the oldest journal write not yet on disk has waited for its "
                 "fdatasync (0: none waits; seconds mean a hung disk)", j["sync-wait"])
    yield _gauge("journal_paged_messages", "Messages paged to disk (flow to disk), not in memory", j["paged"])
    yield _counter("journal_paged_out", "Messages paged out to disk since start", j["paged-out"])
    yield _counter("journal_paged_in", "Messages read back from disk since start", j["paged-in"])
    yield _counter("journal_read_errors", "Reads of paged messages that failed with an I/O error (the messages stayed "
                   "paged and were read again later)", j.get("read-errors", 0))


# ----- threads -------------------------------------------------------------------------------------------------------
class SnapshotPublisher:
    """The loop publishes, the HTTP threads read. `get()` from any thread but the loop's."""

    def __init__(self, take: Callable[[], Snapshot], call_soon: Callable[[Callable[[], None]], None],
                 max_age: float = SNAPSHOT_MAX_AGE, timeout: float = LOOP_TIMEOUT) -> None:
        self.take = take
        self.call_soon = call_soon
        self.max_age = max_age
        self.timeout = timeout
        self.latest: Snapshot | None = None  # replaced whole by the loop; read whole by the HTTP threads
        self.taken = 0  # snapshots the loop has made (tests: at most one per max_age)
        self._asking = threading.Lock()  # one scrape at a time asks the loop; the others then reuse its answer

    def get(self) -> Snapshot | None:
        with self._asking:
            s = self.latest
            if s is not None and time.monotonic() - s.monotonic < self.max_age:
                return s
            done = threading.Event()

            def publish() -> None:  # on the loop
                try:
                    self.latest = self.take()
                    self.taken += 1
                finally:
                    done.set()

            self.call_soon(publish)
            done.wait(self.timeout)
            return self.latest


class BrokerCollector(Collector):
    def __init__(self, publisher: SnapshotPublisher) -> None:
        self.publisher = publisher

    def collect(self) -> Iterable[Metric]:
        return list(families(self.publisher.get(), time.monotonic()))


class MetricsError(Exception):
    """The metrics endpoint cannot be served (the port is taken, the address is not local)."""


class MetricsServer:
    """prometheus_client's HTTP server in a daemon thread, over one broker's snapshots."""

    def __init__(self, host: str, port: int, server: Server) -> None:
        self.host = host
        self.requested_port = port
        self.publisher = SnapshotPublisher(lambda: take_snapshot(server), server.call_soon_threadsafe)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(BrokerCollector(self.publisher))
        self.port: int | None = None
        self._httpd: Any = None
        self._thread: threading.Thread | None = None

    def open(self) -> None:
        """Bind and serve (before the loop runs, so a taken port stops the start-up with a clear error)."""
        try:
            self._httpd, self._thread = start_http_server(self.requested_port, self.host, self.registry)
        except OSError as e:
            raise MetricsError(f"cannot listen on {self.host}:{self.requested_port}: {e.strerror or e}") from None
        self.port = int(self._httpd.server_port)
        log.info("metrics.started", address=f"{self.host}:{self.port}")

    def close(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None
        if self._thread is not None:
            self._thread.join(5.0)
            self._thread = None
