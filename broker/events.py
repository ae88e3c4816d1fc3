"""The event catalogue: every event an Understudy process writes to its JSON-lines log, as data.

This module is the contract between the code that logs, the operators and the nightly Spark report:

- ``docs/events.md`` is generated from it (``python -m broker.events > docs/events.md``; a test catches drift);
- ``spark/`` imports it for the known event names and the type of every field;
- a test scans ``broker/``, ``ha/`` and ``resource_agents/`` for logging calls and fails on an event name (or a
  field) that is not here.

Standard library only (no proton, no structlog): the Spark driver and the documentation generator import it.

Each field name has one type and one meaning wherever it appears (``FIELDS``); an event lists the fields it
carries, with a note where the meaning narrows (``Use``). ``check(record)`` says what is wrong with one parsed log
line, for tests and tools.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType
from typing import Any, Final


class Level(StrEnum):
    DEBUG = "debug"
    INFO = "info"
    WARNING = "warning"
    ERROR = "error"
    CRITICAL = "critical"


class Type(StrEnum):
    """JSON type of a field. ``float`` accepts any JSON number; ``int`` only integers."""

    STRING = "string"
    INT = "int"
    FLOAT = "float"
    BOOL = "bool"
    LIST = "list"
    OBJECT = "object"


class Section(StrEnum):
    BROKER = "Broker events"
    STORE = "Durable store and memory"
    HA = "HA events"
    COORDINATOR = "Coordinator events (ZooKeeper)"
    LIBRARY = "Library log lines"


@dataclass(frozen=True)
class Field:
    name: str
    type: Type
    meaning: str
    nullable: bool = False  # may be JSON null


@dataclass(frozen=True)
class Use:
    """A field as one event carries it: ``note`` narrows the meaning; ``optional`` fields may be absent."""

    name: str
    note: str = ""
    optional: bool = False


@dataclass(frozen=True)
class Event:
    name: str
    level: Level
    section: Section
    when: str
    fields: tuple[Use, ...] = ()
    also: tuple[Level, ...] = ()  # other levels it is sometimes written at (the ``when`` text says when)

    @property
    def levels(self) -> tuple[Level, ...]:
        return (self.level, *self.also)

    def field_names(self) -> tuple[str, ...]:
        return tuple(u.name for u in self.fields)

    def required(self) -> tuple[str, ...]:
        return tuple(u.name for u in self.fields if not u.optional)


def _fields(*rows: Field) -> Mapping[str, Field]:
    table = {f.name: f for f in rows}
    assert len(table) == len(rows), "a field name is defined twice"
    return MappingProxyType(table)


S, N, F, B, L, D = Type.STRING, Type.INT, Type.FLOAT, Type.BOOL, Type.LIST, Type.OBJECT  # N: integer, D: dict

COMMON: Final = _fields(
    Field("ts", S, "time the event happened, ISO 8601 UTC with microseconds and a `Z`: `2026-11-22T02:30:00.123456Z`"),
    Field("level", S, "`debug`, `info`, `warning`, `error`, `critical`"),
    Field("event", S, "the event name (tables below); dotted, lower case"),
    Field("broker", S, "the broker id (`--name`, or the generated id kept in the data dir)"),
)

FIELDS: Final = _fields(
    Field("ack_ts", F, "when the backup acknowledged the message (Unix seconds, primary's clock)"),
    Field("action", S, "what the election decided: `contend`, `withdraw`, `promote`, `demote`, `pause`, `carry_on`"),
    Field("address", S, "a `host:port`"),
    Field("arguments", D, "declare or bind arguments", nullable=True),
    Field("backlog", N, "messages sent to that backup and not yet acknowledged"),
    Field("backup", S, "a backup's broker id"),
    Field("batches", N, "a number of replication batches"),
    Field("bindings", N, "bindings recovered"),
    Field("brokers_url", S, "the HA brokers URL (`--ha-brokers-url`): every broker of the cluster"),
    Field("bytes", N, "a number of bytes"),
    Field("condition", S, "an AMQP error condition (`amqp:...`)", nullable=True),
    Field("connection", N, "connection id (unique within the process)"),
    Field("client_cert", B, "clients must present a certificate signed by `--ssl-ca` (`--ssl-require-client-cert`)"),
    Field("count", N, "how many"),
    Field("data_dir", S, "the data directory", nullable=True),
    Field("description", S, "human-readable detail"),
    Field("destination", S, "the queue messages were moved to"),
    Field("enqueue_ts", F, "when the primary enqueued the message (Unix seconds)"),
    Field("epoch", N, "the cluster epoch (increases with every promotion)"),
    Field("error", S, "the AMQP condition the connection closed with", nullable=True),
    Field("exception", S, "the Python traceback"),
    Field("exchange", S, "an exchange name"),
    Field("exchanges", N, "exchanges recovered"),
    Field("failures", N, "tries that failed"),
    Field("expected_backups", L, "broker ids the new primary waits for"),
    Field("first_ts", F, "first settlement of the window (Unix seconds)"),
    Field("forced", B, "the operator forced it (`ha-admin promote --force`)"),
    Field("format", S, "replication format of this browser: `batch` or `message`"),
    Field("free", N, "bytes free on the journal's file system"),
    Field("from_state", S, "the state left (null on the first `ha.state` of a process)", nullable=True),
    Field("ha_cluster", B, "started with `--ha-cluster`"),
    Field("handler", S, "the class of the event handler that failed"),
    Field("held_seconds", F, "how long settlements were held"),
    Field("key", S, "a binding key", nullable=True),
    Field("kind", S, "`client`, `admin` or `ha`"),
    Field("lag_ms", F, "`(ack_ts - enqueue_ts) * 1000`"),
    Field("last_ts", F, "last settlement of the window (Unix seconds)"),
    Field("leader", S, "the current leader's broker id", nullable=True),
    Field("limit", N, "a bound in bytes (`--max-memory`, `--min-disk-free`)"),
    Field("link", S, "a link name"),
    Field("logger", S, "the Python logger's name (`kazoo.client`, `proton`, ...)"),
    Field("max_open_files", N, "the soft limit of open files (RLIMIT_NOFILE) in force"),
    Field("members", L, "list of `{name, address, state}`"),
    Field("names", L, "broker ids (the ready set: backups that hold everything the primary confirmed)"),
    Field("message", S, "the library's message text"),
    Field("message_id", S, "a message's AMQP `message-id` (a string id as it is, any other type as hex of its "
          "window key: type letter `L`/`U`/`B` then the bytes)"),
    Field("messages", N, "a number of messages"),
    Field("mode", S, "how the backup acknowledges: `batched`"),
    Field("moved", N, "live messages written again at the end of the journal"),
    Field("name", S, "an object name"),
    Field("off_seconds", F, "how long something stays off (seconds)"),
    Field("operation", S, "a management operation (`CREATE`, `DELETE`, ...)"),
    Field("path", S, "a file path"),
    Field("peer", S, "the other broker's id"),
    Field("peer_epoch", N, "the epoch the other broker claims"),
    Field("permission", S, "an access-control action (docs/access-control.md): `publish`, `consume`, `browse`, "
          "`create`, `delete`, `manage`"),
    Field("pid", N, "a process id"),
    Field("position", N, "a message's position in its queue"),
    Field("positions", L, "message positions in their queue (at most the first 20)"),
    Field("primary", S, "the primary's broker id"),
    Field("public_url", S, "the URL clients are redirected to (`--ha-public-url`)", nullable=True),
    Field("queue", S, "a queue name"),
    Field("queues", N, "queues recovered"),
    Field("reason", S, "why"),
    Field("refused", N, "messages refused (`amqp:resource-limit-exceeded`)"),
    Field("ready", N, "backups ready now"),
    Field("released", N, "guarded messages released"),
    Field("required", N, "backups that must be ready (`--ha-min-ready-backups`)"),
    Field("remote", S, "the peer's `host:port`"),
    Field("reply_to", S, "a management request's `reply-to` address"),
    Field("role", S, "`primary`, `backup` or `standalone`"),
    Field("rule", N, "the number of the `--acl-file` rule that decided (1: the first `[[rule]]`); null: none "
          "matched (default deny)", nullable=True),
    Field("sample_rate", F, "fraction of acknowledgements logged, in (0, 1]"),
    Field("seconds", F, "a duration in seconds"),
    Field("segment", N, "a journal segment number (the journal file `NNNNNNNN.jnl`)"),
    Field("segments", N, "journal segment files read"),
    Field("seq", N, "wiring sequence number"),
    Field("size", N, "a file size in bytes"),
    Field("subject", S, "a certificate's subject (`CN=...`)"),
    Field("status", N, "the management answer's status code"),
    Field("timed_out", L, "broker ids of backups that did not return in time"),
    Field("tls", S, "the listener's TLS mode: `only` (plain connections refused) or `optional` (TLS or plain on "
          "one port)"),
    Field("to_state", S, "the state entered"),
    Field("type", S, "an object type: `queue`, `exchange`, `binding`"),
    Field("unsettled_returned", N, "deliveries returned to their queues"),
    Field("used", N, "bytes of memory queued messages take (body plus per-message cost)"),
    Field("user", S, "the authenticated user", nullable=True),
    Field("version", S, "the software version"),
    Field("via", S, "where an access check was made: `attach`, `management`, `relay` (a message's `to` on the "
          "anonymous relay), `reload` (a link attached before SIGHUP, detached)"),
    Field("waited_seconds", F, "how long the new primary waited for its backups"),
    Field("waiting", S, "why a leaderless cluster has no leader yet", nullable=True),
    Field("where", S, "what the broker was doing"),
)

_B, _S, _H, _C, _X = Section.BROKER, Section.STORE, Section.HA, Section.COORDINATOR, Section.LIBRARY
_INFO, _WARN, _ERR, _DEBUG = Level.INFO, Level.WARNING, Level.ERROR, Level.DEBUG


U = Use


def _o(name: str, note: str = "") -> Use:
    """An optional field."""
    return Use(name, note, optional=True)


_EVENTS: tuple[Event, ...] = (
    # ----- broker ---------------------------------------------------------------------------------------------
    Event("broker.started", _INFO, _B, "listener is open",
          (U("address", "host:port listened on"), U("version"), U("ha_cluster"), U("data_dir"),
           U("max_open_files", "the soft limit of open files in force: the start raises it to the hard limit; a "
                               "connection takes one"))),
    Event("broker.stopping", _INFO, _B, "shutdown begins", (U("reason", "`sigterm`, `sigint`"),)),
    Event("broker.stopped", _INFO, _B, "shutdown complete"),
    Event("broker.log.reopened", _INFO, _B, "the log file was reopened after SIGHUP (logrotate); first line of the "
          "new file", (U("path"),)),
    Event("broker.log.reopen_failed", _ERR, _B, "SIGHUP, but the log file could not be reopened: the broker keeps "
          "writing to the file it had", (U("path"), U("description"))),
    Event("connection.opened", _INFO, _B, "",
          (U("connection"), U("remote", "host:port"), U("user"), U("kind"))),
    Event("connection.closed", _INFO, _B, "",
          (U("connection"), U("error", "AMQP condition or null"), U("unsettled_returned"))),
    Event("connection.refused", _WARN, _B, "e.g. redirect from a backup, failed login",
          (U("remote"), U("condition"), U("description"), _o("user"))),
    Event("access.refused", _WARN, _B, "who the peer is does not allow what it asked (docs/replication.md, "
          "\"Who may do what\"): a connection asking to be a backup (`kind` `ha`) without the replication user's "
          "login (refused at open), or a publisher attaching to a backup, or attached when the broker became one "
          "(detached); the peer gets `amqp:unauthorized-access` with the same description",
          (U("remote", "host:port"), U("user", "the authenticated user (`anonymous` for ANONYMOUS)"),
           U("kind", "the role asked for (at open) or granted (links)"), U("condition"), U("description"),
           _o("connection", "links only"), _o("address", "links only: the link's node address"))),
    Event("access.open", _WARN, _B, "an `--ha-cluster` broker with neither `--users-file` nor `--ha-username` "
          "becomes a backup (at start-up, and again after a demotion): replication is not authenticated, any "
          "connection may act as a backup (development on loopback only)", (U("description"),)),
    Event("tls.enabled", _INFO, _B, "at start-up, after `broker.started`: the listener speaks TLS (docs/tls.md)",
          (U("address", "host:port listened on"), U("tls"), U("client_cert"), U("subject", "of `--ssl-cert`"),
           U("path", "`--ssl-cert`"))),
    Event("tls.reloaded", _INFO, _B, "SIGHUP: the certificate, key and CA files were read again; connections accepted "
          "from now on (and a backup's next connection to its primary) use them, open ones keep theirs",
          (U("subject", "of `--ssl-cert`"), U("path", "`--ssl-cert`"))),
    Event("tls.reload_failed", _ERR, _B, "SIGHUP: the certificate files did not pass the start-up checks; the "
          "broker keeps using the ones it has", (U("description"),)),
    Event("tls.refused", _WARN, _B, "an accepted connection failed its TLS handshake: wrong CA, expired or missing "
          "client certificate, a plain client on a TLS-only port, or the peer refused this broker's certificate "
          "(docs/tls.md lists the reasons); nothing was exchanged on it",
          (U("remote", "host:port"), U("reason", "what went wrong, in the words of docs/tls.md"),
           U("description", "OpenSSL's own text"))),
    Event("connection.accept_failed", _ERR, _B, "the listening socket could not accept a new connection (out of "
          "file descriptors: EMFILE, ENFILE): it rests 0.1 s, then twice as long after each failure up to 2 s, "
          "while new peers wait in the listen backlog; once per episode",
          (U("description", "the system's reason, the connections open and the limit of open files"),)),
    Event("connection.accept_resumed", _INFO, _B, "the listening socket accepts again after `connection."
          "accept_failed`", (U("failures", "tries that failed"), U("seconds", "since the first"))),
    Event("acl.loaded", _INFO, _B, "the `--acl-file` rules are in force (docs/access-control.md): at start-up, "
          "and after each SIGHUP that read a valid file",
          (U("path", "`--acl-file`"), U("count", "rules"), U("reason", "`start` or `sighup`"))),
    Event("acl.reload_failed", _ERR, _B, "SIGHUP, but `--acl-file` could not be read or is not valid: the rules "
          "loaded before stay in force", (U("path", "`--acl-file`"), U("description", "the file's problem"))),
    Event("acl.denied", _WARN, _B, "the `--acl-file` rules do not allow what a user asked: an attach refused, a "
          "management request answered 403, a message on the anonymous relay rejected (once per link and "
          "address), or a link detached after a reload; the peer gets `amqp:unauthorized-access` (403 for "
          "management) with the same description",
          (U("user", "the authenticated user (`anonymous` for ANONYMOUS)"), U("permission"),
           U("type", "the object's kind: `queue`, `exchange`, or `broker` (broker-wide: `$events`, "
                     "`connection`, `ha-broker`)"), U("name", "the object's name"), U("rule"), U("via"),
           U("connection"), U("remote", "host:port"), U("description"),
           _o("operation", "management only"))),
    Event("link.refused", _WARN, _B, "attach to unknown node, bad properties",
          (U("connection"), U("address", "the link's node address"), U("condition"), U("description"))),
    Event("message.rejected", _WARN, _B, "oversize, malformed, queue full (rate limited: at most one line per link "
          "per second, `count` says how many)",
          (U("connection"), U("address", "the link's node address"), U("condition"), U("description"),
           U("count"))),
    Event("wiring.declared", _INFO, _B, "a queue or exchange was created (`debug` for `temp.*` reply queues)",
          (U("type", "`queue`, `exchange`"), U("name"), U("seq"), U("arguments")), also=(_DEBUG,)),
    Event("wiring.deleted", _INFO, _B, "a queue or exchange was deleted (`debug` for `temp.*` reply queues)",
          (U("type"), U("name"), U("seq"), U("arguments")), also=(_DEBUG,)),
    Event("wiring.bound", _INFO, _B, "a binding was created",
          (U("exchange"), U("queue"), U("key"), U("seq"), U("arguments"))),
    Event("wiring.unbound", _INFO, _B, "a binding was deleted",
          (U("exchange"), U("queue"), U("key"), U("seq"), U("arguments"))),
    Event("management.request", _INFO, _B, "every management write (not QUERY/READ)",
          (U("operation"), U("type"), U("name"), U("status"), U("user"))),
    Event("management.reply_refused", _WARN, _B, "a management request whose `reply-to` names no queue is "
          "rejected `amqp:not-found` and not carried out (one naming a queue its user may not send to is rejected "
          "`amqp:unauthorized-access`, logged as `acl.denied`); or a request was carried out but its reply could "
          "not be put on its queue (full, or deleted by the request itself)",
          (U("operation"), U("type"), U("name"), U("reply_to"), U("condition"), U("description"), U("user"))),
    Event("management.error", _ERR, _B, "a bug in a management operation: answered 500",
          (U("operation"), U("type"), U("name"), U("exception"))),
    Event("metrics.started", _INFO, _B, "the Prometheus endpoint (`--metrics-port`, docs/metrics.md) listens",
          (U("address", "host:port of the HTTP endpoint (GET /metrics)"),)),
    Event("metrics.refused", _ERR, _B, "the Prometheus endpoint cannot listen (port taken, address not local): "
          "the broker does not start (exit code 2)", (U("description", "the address and the system's reason"),)),
    Event("admin_socket.bad_request", _WARN, _B, "the admin socket received a request it could not read "
          "(answered 400; 404, 405, 501, 411 or 413 for a wrong path or method, no length, too long)",
          (U("user", "the peer's Unix user"), U("reason"))),
    Event("queue.expired", _INFO, _B, "TTL expiry sweep removed messages (one line per sweep, not per message)",
          (U("queue"), U("count"))),
    Event("broker.error", _ERR, _B, "a bug in an event handler: the link or connection involved is closed, the "
          "broker carries on", (U("where"), _o("handler"), U("exception"))),
    Event("client.settled", _INFO, _B, "the broker settled (accepted) client transfers; one line per second at "
          "most, covering every client settlement in [`first_ts`, `last_ts`]; `role` and `epoch` are those at "
          "settlement (a window never spans a change). Used to prove that two brokers never settle at once.",
          (U("count", "client transfers settled"), U("first_ts"), U("last_ts"), U("epoch"), U("role"))),
    Event("management.refused", _WARN, _B, "an operator's PURGE, MOVE or connection operation was refused (bad "
          "request, unknown queue or connection, no room), or a write to what a backup mirrors from its primary "
          "(409): answered with `status`",
          (U("operation"), U("type"), U("name"), U("status"), U("description"), U("user"))),
    Event("queue.purged", _INFO, _B, "an operator purged a queue (`ha-admin purge`): `count` available messages "
          "removed; acquired ones stay with their consumers", (U("queue"), U("count"), U("user"))),
    Event("queue.moved", _INFO, _B, "an operator moved messages from `queue` to `destination` (`ha-admin move`)",
          (U("queue"), U("destination"), U("count", "messages moved"), U("user"))),
    Event("connection.closed_by_operator", _WARN, _B, "an operator closed a connection (`ha-admin "
          "close-connection`) with `amqp:connection:forced`; its unsettled messages go back to their queues",
          (U("connection"), U("remote"), U("kind"), U("user", "the operator's user"))),
    Event("queue.duplicate", _DEBUG, _B, "a transfer whose `message-id` is in the queue's duplicate window was "
          "accepted and not enqueued there (a publisher resending after a failover); `count`: duplicates dropped "
          "by this queue since the broker started", (U("queue"), U("message_id"), U("count"))),
    Event("queue.delivery_limit", _WARN, _B, "a message failed its `delivery-limit`-th delivery: dead-lettered "
          "through the alternate exchange, or dropped when `exchange` is null",
          (U("queue"), U("position"), U("count", "failed deliveries (the limit)"),
           U("exchange", "the alternate exchange; null: the message was dropped"))),
    Event("transaction.committed", _DEBUG, _B, "a client committed a transaction (docs/transactions.md): its "
          "messages were enqueued and the messages it accepted dequeued, in one pass",
          (U("connection"), U("messages", "messages the transaction enqueued"),
           U("count", "consumer outcomes (accepted, rejected) it applied"))),
    Event("transaction.rolled_back", _INFO, _B, "a transaction ended without a commit: its held messages were "
          "dropped and the messages it had taken released (delivery-count + 1). `debug` when the client asked "
          "(`reason` `discharge`)",
          (U("connection"), U("reason", "`discharge` (the client rolled back), `detached` (its coordinator link, "
                                        "session or connection ended first), `commit_failed`"),
           U("messages", "held messages dropped"), U("count", "messages released to their queues")),
          also=(_DEBUG,)),
    Event("transaction.commit_failed", _WARN, _B, "a commit could not be applied whole (a queue gone or full, the "
          "journal or --max-memory refusing): nothing of it was applied, it was rolled back and the client's "
          "discharge rejected with `amqp:transaction:rollback`; or its journal write failed (the journal's first "
          "failure, in the commit's pass): what it applied was undone before anyone saw it, the same way",
          (U("connection"), U("condition", "why a message could not be taken"), U("description"))),
    # ----- durable store and memory ---------------------------------------------------------------------------
    Event("journal.recovered", _INFO, _S, "the journal under `--data-dir` was read at start; the broker listens "
          "next", (U("segments"), U("queues"), U("messages"), U("bytes", "of the recovered message bodies"),
                   U("exchanges"), U("bindings"), U("seconds", "recovery took"))),
    Event("journal.torn_tail", _WARN, _S, "the last segment ends in a write a crash cut short (a partial or bad "
          "record that no later commit saw on disk, or whole records with no MARK after them): cut off at start "
          "from where that write begins, with everything after it; only unconfirmed messages can be in it",
          (U("bytes", "cut off the last segment (up to its last byte that is not zero)"),
           U("description", "what was incomplete"))),
    Event("journal.refused", _ERR, _S, "the journal is damaged (not a torn tail), of a newer format, or a file of it "
          "cannot be opened or read (named with the system's reason): the broker does not start (exit code 2); "
          "`description` says where, and for damage how to cut it",
          (U("description"),)),
    Event("journal.failed", _ERR, _S, "a journal write or fdatasync failed (e.g. disk full): durable messages "
          "are refused until a write succeeds again (probed every second); non-durable traffic carries on",
          (U("description"), U("refused", "durable messages waiting for that write, refused"))),
    Event("journal.writable", _WARN, _S, "journal writes succeed again after `journal.failed`: durable messages "
          "are accepted again", (U("description", "the failure that ended"),)),
    Event("journal.disk.low", _WARN, _S, "the journal's disk has less free space than `--min-disk-free` (looked at "
          "every second): durable messages for durable queues are refused with `amqp:resource-limit-exceeded` "
          "until it has room again; non-durable traffic and consumers carry on",
          (U("free"), U("limit", "`--min-disk-free` in bytes"), U("description"))),
    Event("journal.disk.ok", _WARN, _S, "the journal's disk has `--min-disk-free` again after `journal.disk.low`: "
          "durable messages are taken", (U("free"), U("limit", "`--min-disk-free` in bytes"), U("description"))),
    Event("journal.truncate_failed", _ERR, _S, "a write failed part-way and the partial record could not be cut "
          "back; it is cut as a torn tail at the next start", (U("size", "the segment's size before the write"),
                                                              U("exception"))),
    Event("journal.sync.slow", _WARN, _S, "an fdatasync made on the event loop (a small commit with nothing else in "
          "flight) took long: the disk is slow or busy (another process's bulk writes). The loop waited meanwhile "
          "(no heartbeats), so such syncs go to the syncer for `off_seconds` (doubling while it recurs)",
          (U("seconds", "the sync took"), U("off_seconds", "inline syncs stay off this long"))),
    Event("journal.sync.stalled", _WARN, _S, "a journal write has waited more than 5 s for its fdatasync: the disk "
          "hangs (a stalled network volume, a failing device) or the sync process is stopped; durable messages are "
          "not settled meanwhile. `ha-status` shows it (JOURNAL SYNC STALLED). Also logged (by a watchdog thread) "
          "when the event loop itself has waited 5 s in a journal write or fdatasync: the broker then answers "
          "nothing, `ha-status` included, until the disk returns", (U("description"),
                                                                    U("seconds", "waited so far"))),
    Event("journal.sync.resumed", _WARN, _S, "the journal's fdatasyncs return again after `journal.sync.stalled`",
          (U("description"),)),
    Event("journal.stall.halt", _ERR, _S, "no journal fdatasync has returned, or the event loop has waited in a "
          "journal write or fdatasync, for `--journal-stall-halt` seconds: the broker ends itself (exit code 3) so "
          "that a ready backup takes over; a thread stuck in the kernel ends when the disk returns",
          (U("description"), U("seconds", "waited"))),
    Event("journal.syncer.started", _INFO, _S, "the journal's fdatasyncs run in a process of their own (a child of "
          "the broker, `python -I .../broker/store/syncproc.py`); it exits with the broker", (U("pid"),)),
    Event("journal.syncer.lost", _ERR, _S, "the journal's sync process could not be started or exited while the "
          "broker runs (killed by hand, the OOM killer): a thread of the broker makes the fdatasyncs instead, "
          "everything written is synced again, nothing is lost; a restart of the broker brings the process back",
          (U("description"),)),
    Event("journal.prepare.skipped", _WARN, _S, "the next journal segment could not be zero-filled in advance "
          "(the disk lacks room for two spare segments, or a write failed): the journal goes on in a segment that "
          "grows, whose fdatasyncs cost more; once per reason until one is prepared again", (U("description"),)),
    Event("journal.segment.dropped", _INFO, _S, "a journal segment without live messages was deleted",
          (U("segment"),)),
    Event("journal.segment.compacted", _INFO, _S, "the few live messages of an old segment were written again "
          "at the end of the journal; the segment is dropped at the next roll", (U("segment"), U("moved"))),
    Event("journal.read_error", _ERR, _S, "paged messages (`--max-memory`) of `queue` could not be read back from "
          "journal segment `segment` (an I/O error): they stay paged and are read again a second later; a backup "
          "catching up on the queue is disconnected and tries again",
          (U("queue"), U("count", "messages not read"), U("segment"), U("description"))),
    Event("journal.read_failed", _ERR, _S, "messages paged to disk (`--max-memory`) could not be read back from "
          "the journal: their records are damaged, and they are lost from `queue`",
          (U("queue"), U("count", "messages lost"), U("positions"), U("description"))),
    Event("memory.over", _WARN, _S, "queued messages take more than `--max-memory`: durable queues page their "
          "newest messages to the journal; what cannot be paged is refused (`amqp:resource-limit-exceeded`); one "
          "line per episode", (U("used"), U("limit", "`--max-memory` in bytes"), U("description"))),
    Event("memory.under", _INFO, _S, "queued memory is under `--max-memory` again: nothing is refused any more",
          (U("used"), U("limit", "`--max-memory` in bytes"), U("refused", "messages refused while over"))),
    # ----- HA -------------------------------------------------------------------------------------------------
    Event("ha.state", _INFO, _H, "every state transition",
          (U("from_state"), U("to_state"), U("role"), U("epoch"), U("reason"))),
    Event("ha.state.illegal", _ERR, _H, "a transition not in the table was attempted (refused)",
          (U("from_state"), U("to_state"), U("reason"))),
    Event("ha.membership", _INFO, _H, "the primary changed the member list (logged by primary and backups)",
          (U("epoch"), U("members"))),
    Event("ha.primary.connected", _INFO, _H, "(backup) connected to the primary",
          (U("primary"), U("address"), U("epoch"))),
    Event("ha.primary.lost", _WARN, _H, "(backup) lost the primary connection",
          (U("primary"), U("address"), U("reason"))),
    Event("ha.backup.connected", _INFO, _H, "(primary) a backup connected", (U("backup"), U("address"))),
    Event("ha.backup.acks", _INFO, _H, "(primary) a backup attached its acknowledgement link",
          (U("backup"), U("mode"))),
    Event("ha.backup.lost", _WARN, _H, "(primary) a backup was dropped; its guards released",
          (U("backup"), U("address"),
           U("reason", "`disconnected`, `heartbeat`, `replaced by a new connection`, `its $ha.status link was detached`, "
                       "`its replication link for queue 'NAME' was not attached again in 5 s`"),
           U("released"))),
    Event("ha.backup.disk.low", _WARN, _H, "(primary) a backup reported its journal's disk under its "
          "`--min-disk-free`: durable messages for durable queues are refused here (a primary with a journal) with "
          "`amqp:resource-limit-exceeded` until it reports room again or leaves (RabbitMQ's cluster-wide disk alarm)",
          (U("backup"), U("description", "the backup's own `journal.disk.low` description"))),
    Event("ha.backup.disk.ok", _WARN, _H, "(primary) a backup's journal disk has its `--min-disk-free` again after "
          "`ha.backup.disk.low`: durable messages are taken (unless another disk is low)", (U("backup"),)),
    Event("ha.view.confirmed", _INFO, _H, "(primary, without a coordinator) every ready backup holds the member "
          "list without the ready backup dropped last: the settlements held for it go out (docs/replication.md)",
          (U("seq", "the member list's number (Membership.seq)"), U("names", "the ready backups"),
           U("held_seconds"))),
    Event("ha.backup.ready", _INFO, _H, "(primary) a backup became ready",
          (U("backup"), U("address"), U("seconds", "since it connected"))),
    Event("ha.catchup.start", _INFO, _H, "(primary) catch-up of one queue began",
          (U("backup"), U("queue"), U("messages", "to send"), U("format"))),
    Event("ha.catchup.end", _INFO, _H, "(primary) catch-up of one queue ended",
          (U("backup"), U("queue"), U("messages", "sent"), U("seconds"))),
    Event("ha.promoted", _WARN, _H, "a backup was promoted to primary",
          (U("epoch"), U("from_state"), U("forced"), U("expected_backups"))),
    Event("ha.active", _INFO, _H, "recovering primary became active",
          (U("epoch"), U("waited_seconds"), U("timed_out"))),
    Event("ha.demoted", _WARN, _H, "a primary stepped down", (U("epoch"), U("reason"))),
    Event("ha.settle.held", _WARN, _H, "(primary) clients' settlements are held: fewer backups ready than "
          "`--ha-min-ready-backups`", (U("ready"), U("required"))),
    Event("ha.settle.resumed", _INFO, _H, "(primary) enough backups are ready again: held settlements go out",
          (U("ready"), U("required"), U("held_seconds"))),
    Event("ha.guard.timeout", _WARN, _H, "expected backup did not return in `--ha-backup-timeout`",
          (U("backup"), U("released"))),
    Event("ha.epoch.refused", _ERR, _H, "a replication link from/to a stale-epoch broker was refused",
          (U("peer"), U("peer_epoch"), U("epoch"))),
    Event("ha.lag", _INFO, _H, "a replication-lag sample (see below)",
          (U("queue"), U("backup"), U("position"), U("enqueue_ts"), U("ack_ts"), U("lag_ms"), U("backlog"),
           U("sample_rate"))),
    Event("ha.connect.failed", _WARN, _H, "(backup) a connection attempt failed (refused login, not a primary, "
          "timeout); once per address and reason", (U("address"), U("reason"))),
    Event("ha.link.error", _WARN, _H, "(backup) the primary closed a control link with an error",
          (U("link"), U("condition"), U("description"))),
    Event("ha.replication.closed", _WARN, _H, "(backup) the primary closed a replicating browser (e.g. queue "
          "deleted)", (U("queue"), U("condition"), U("description"))),
    Event("ha.replication.error", _ERR, _H, "(backup) a replicated message, batch, dequeue or control message "
          "could not be applied; for a damaged batch nothing of it was applied and the browser is attached again. "
          "(primary: with `backup`, an acknowledgement it could not read)",
          (_o("queue"), _o("position"), _o("backup"), U("description"))),
    Event("ha.transaction.discarded", _WARN, _H, "(backup) the connection to the primary ended (or a queue's "
          "replication did) while parts of replicated transactions were held waiting for the rest: none of them "
          "was applied or acknowledged (a backup applies a transaction all or none, docs/transactions.md)",
          (U("primary"), U("count", "incomplete transaction units (the commits of one pass of the primary)"),
           U("batches", "replication batches held and dropped, parts and what waited behind them"))),
    Event("ha.wiring.error", _ERR, _H, "(backup) a mirrored object could not be created",
          (U("type"), U("name"), U("description"))),
    Event("ha.membership.invalid", _ERR, _H, "(backup) the primary sent an unreadable membership list",
          (U("description"),)),
    Event("ha.settings.changed", _WARN, _H, "an operator changed the HA URLs at run time (`ha-admin set`; until "
          "restart); `description` has the old values",
          (U("brokers_url"), U("public_url"), U("description"), U("user"))),
    Event("ha.settings.refused", _WARN, _H, "an operator's `ha-admin set` was refused (bad value or field): "
          "answered with `status`", (U("status"), U("description"), U("user"))),
    # ----- coordinator ----------------------------------------------------------------------------------------
    Event("ha.coordinator.decision", _INFO, _C, "the election decision changed: one line per change",
          (U("action"), U("reason"), U("epoch"), U("leader"), U("waiting"))),
    Event("ha.coordinator.suspended", _WARN, _C, "connection to ZooKeeper lost; a primary settles nothing and "
          "hands nothing to consumers while suspended", (U("epoch"),)),
    Event("ha.coordinator.resumed", _INFO, _C, "connection to ZooKeeper back", (U("epoch"),)),
    Event("ha.coordinator.promote_refused", _ERR, _C, "elected, but the broker refused to promote (it withdraws)",
          (U("epoch"), U("description"))),
    Event("ha.zookeeper.elected", _INFO, _C, "this broker won the election (took the leader znode)",
          (U("epoch"),)),
    Event("ha.zookeeper.election_lost", _INFO, _C, "another broker won the race or bumped the epoch first",
          (U("description", "the failed operations"),)),
    Event("ha.zookeeper.leadership_lost", _WARN, _C, "this broker no longer leads", (U("reason"),)),
    Event("ha.zookeeper.ready_set", _INFO, _C, "(leader) the ready set of its epoch is in ZooKeeper: the backups "
          "that hold everything it confirmed; a primary settles nothing before the first of its epoch, nor "
          "while the last one names a backup it dropped",
          (U("epoch"), U("names"))),
    Event("ha.zookeeper.turn_failed", _WARN, _C, "a ZooKeeper round failed; retried with back-off",
          (U("description"),)),
    Event("ha.zookeeper.client_restarted", _WARN, _C, "kazoo's connection thread ended on an error of its own (its "
          "session is LOST and it would never connect again): the coordinator starts the client again, which then "
          "connects with a new session", (U("description"),)),
    Event("ha.zookeeper.resign_failed", _WARN, _C, "leaving ZooKeeper cleanly at stop failed (the session's "
          "ephemeral znodes expire anyway)", (U("description"),)),
    Event("ha.zookeeper.callback_failed", _ERR, _C, "a coordinator callback raised (a bug)", (U("exception"),)),
    # ----- other libraries ------------------------------------------------------------------------------------
    Event("python.log", _WARN, _X, "a library (kazoo, proton) wrote through Python's standard `logging`, "
          "warnings and above (custom levels round down); Python `warnings` too (logger `py.warnings`)", (U("logger"), U("message"), _o("exception")), also=(_ERR, Level.CRITICAL)),
)

EVENTS: Final[Mapping[str, Event]] = MappingProxyType({e.name: e for e in _EVENTS})
NAMES: Final = frozenset(EVENTS)


def field(name: str) -> Field:
    """A common or extra field by name."""
    return COMMON[name] if name in COMMON else FIELDS[name]


def _type_ok(value: Any, f: Field) -> bool:
    if value is None:
        return f.nullable
    match f.type:
        case Type.STRING:
            return isinstance(value, str)
        case Type.INT:
            return isinstance(value, int) and not isinstance(value, bool)
        case Type.FLOAT:
            return isinstance(value, int | float) and not isinstance(value, bool)
        case Type.BOOL:
            return isinstance(value, bool)
        case Type.LIST:
            return isinstance(value, list)
        case Type.OBJECT:
            return isinstance(value, dict)


def check(record: Mapping[str, Any]) -> list[str]:
    """What is wrong with one parsed log line (empty: it follows the catalogue).

    Fields a reader does not know are allowed by the contract ("fields are only ever added"), but the code must not
    write any: this check reports them.
    """
    problems = [f"common field {name!r} missing" for name in COMMON if name not in record]
    problems += [f"{name}={record[name]!r}: not a {f.type}" for name, f in COMMON.items()
                 if name in record and not _type_ok(record[name], f)]
    event = EVENTS.get(record.get("event"))  # type: ignore[arg-type]
    if event is None:
        return [*problems, f"unknown event {record.get('event')!r}"]
    if record.get("level") not in event.levels:
        problems.append(f"{event.name} at level {record.get('level')!r}, documented {'/'.join(event.levels)}")
    uses = {u.name: u for u in event.fields}
    for name, value in record.items():
        if name in COMMON:
            continue
        if name not in uses:
            problems.append(f"{event.name}: undocumented field {name!r}")
        elif not _type_ok(value, FIELDS[name]):
            problems.append(f"{event.name}: {name}={value!r} is not a {FIELDS[name].type}")
    problems += [f"{event.name}: field {name!r} missing" for name in event.required() if name not in record]
    return problems


# ----- docs/events.md ---------------------------------------------------------------------------------------------

_INTRO = """\
Every Understudy process (`ha-broker`) writes its event log as **JSON lines** through structlog: one JSON object
per line, UTF-8, to `--log-file` (default: stderr). This page is the contract between the broker, the operators and
the nightly Spark report (`ha-lag-report`), which reads exactly these fields. Fields are only ever added, never
renamed; a reader must ignore fields it does not know.

Every line is an event of the tables below, including what libraries write through Python's standard `logging`
(`python.log`). `SIGHUP` makes the broker reopen `--log-file` (for logrotate: move the file, then send `SIGHUP`;
no line is lost or split between the files)."""

_TIMES = """\
Times inside events (`enqueue_ts`, `ack_ts`, `first_ts`, `last_ts`) are **Unix seconds as floats** (`1795833000.123456`),
so that lag arithmetic needs no parsing. Durations are `*_ms` (float milliseconds) or `seconds` (float)."""

_ROLES = """\
`role` is `primary`, `backup` or `standalone`. States: backup `joining` → `catchup` → `ready`; primary `recovering` →
`active`; `standalone` without `--ha-cluster` ([states.md](states.md))."""

_LAG = """\
### Replication-lag samples (`ha.lag`)

Written by the **primary**. `enqueue_ts` is when the primary enqueued the message at `position` on `queue`;
`ack_ts` is when `backup` acknowledged holding it; `lag_ms = (ack_ts - enqueue_ts) * 1000`. Both times come from the
primary's clock, but readers must still tolerate negative lag (clock steps) by counting and excluding it.
`backlog` is the number of messages sent to that backup and not yet acknowledged at `ack_ts`.

Lag samples and `client.settled` windows are written in batches every 0.2 s (one write instead of one per
acknowledgement); a broker killed with SIGKILL loses at most the last 0.2 s of them.

`sample_rate` is the fraction of acknowledgements that were logged (1.0 = every one). The broker logs every
acknowledgement while the rate of acknowledgements stays under `--ha-lag-sample-max` per second (default 1000) and
samples uniformly above it, so a reader can weight samples by `1/sample_rate` to recover counts."""

_NOT_EVENTS = """\
## Not events

Configuration errors are not logged as events: they are found before the event log is opened (the log's path and
level and the broker id are configuration too), so `ha-broker` prints one line per bad value on stderr and exits
with code 2 (`--validate-config` does the same without starting)."""

_EXAMPLE = """\
## Example

```json
{"ts": "2026-11-22T02:30:00.123456Z", "level": "info", "event": "ha.lag", "broker": "b1", "queue": "orders", "backup": "b2", "position": 17, "enqueue_ts": 1795833000.1201, "ack_ts": 1795833000.1234, "lag_ms": 3.3, "backlog": 4, "sample_rate": 1.0}
{"ts": "2026-11-22T02:31:10.000001Z", "level": "warning", "event": "ha.promoted", "broker": "b2", "epoch": 3, "from_state": "ready", "forced": false, "expected_backups": ["b3"]}
{"ts": "2026-11-22T02:31:12.500000Z", "level": "warning", "event": "python.log", "broker": "b2", "logger": "kazoo.client", "message": "Connection dropped: socket connection broken"}
```"""


def _use_text(u: Use) -> str:
    text = f"`{u.name}`"
    if u.note:
        text += f" ({u.note})"
    if u.optional:
        text += " (optional)"
    return text


def _event_row(e: Event) -> str:
    levels = " / ".join(e.levels)
    fields = ", ".join(_use_text(u) for u in e.fields)
    return f"| `{e.name}` | {levels} | {fields} | {e.when} |"


def render_markdown() -> str:
    """The whole docs/events.md page."""
    out = [
        "# Event log schema",
        "",
        "<!-- Generated from broker/events.py by `python -m broker.events > docs/events.md`; do not edit. -->",
        "",
        _INTRO,
        "",
        "## Common fields (on every line)",
        "",
        "| field    | type   | meaning |",
        "|----------|--------|---------|",
        *[f"| `{f.name}` | {f.type} | {f.meaning} |" for f in COMMON.values()],
        "",
        _TIMES,
    ]
    for section in Section:
        out += ["", f"## {section.value}", ""]
        if section is Section.HA:
            out += [_ROLES, ""]
        out += ["| event | level | extra fields | when |", "|-------|-------|--------------|------|"]
        out += [_event_row(e) for e in _EVENTS if e.section is section]
        if section is Section.HA:
            out += ["", _LAG]
    out += [
        "",
        "## Fields",
        "",
        "Every field has one type wherever it appears (`float`: any JSON number; `null` only where it says so).",
        "",
        "| field | type | meaning |",
        "|-------|------|---------|",
        *[f"| `{f.name}` | {f.type}{' or null' if f.nullable else ''} | {f.meaning} |"
          for f in sorted(FIELDS.values(), key=lambda f: f.name)],
        "",
        _NOT_EVENTS,
        "",
        _EXAMPLE,
        "",
    ]
    return "\n".join(out)


if __name__ == "__main__":
    sys.stdout.write(render_markdown())
