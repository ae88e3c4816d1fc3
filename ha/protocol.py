"""The replication protocol between brokers: addresses, connection properties, delivery tags, levels.

A backup opens one AMQP connection to the primary (connection property `x-understudy-kind: ha`) and on it:
- a receiver from `$events` (wiring events) and requests to `$management` (QUERY queue/exchange/binding);
- a receiver from `$ha.status`: the primary's membership list, re-sent whenever it changes;
- per replicated queue, a receiver from `$ha.queue:<name>`: the replicating browser. Its attach carries link
  properties `held` (the positions the backup already holds, as [lo, hi] ranges), `epoch` and `uuid`.

On a replicating browser the delivery tag says what a transfer is, so the message bytes travel untouched:
`e<position>` a live enqueue, `c<position>` a catch-up message (older, sent newest first), `d<n>` a control message
whose body is a list of [lo, hi] position ranges the primary dequeued.

Acknowledgements: when the primary's connection properties offer `x-understudy-acks: batched`, a backup attaches
its replicating browsers with link property `acks: batched` and then gets every transfer
pre-settled and acknowledges in batches instead: once per pass of its event loop it sends, on its sender link to
`$ha.acks`, one message whose body maps each queue name to the [lo, hi] ranges of positions it has applied since the
last batch. Otherwise (an older primary or backup) the backup settles each transfer once applied, and that
settlement is the acknowledgement. Either way the primary settles a client's message only after every ready backup acknowledged it;
batching saves the primary one delivery event per message per backup.

Dequeue acknowledgements: when the primary's connection properties also offer `x-understudy-dequeue-acks: 1` and
the backup uses the binary form, the backup attaches its replicating browsers with link property `dequeue-acks: 1`
and its acknowledgements (version 2) carry the dequeue ranges it applied too. The primary answers a consumer's accept
(receiver-settle-mode second) only once every such browser of the queue acknowledged the dequeue (ha.core.accepts).

Disk reports: when the primary's connection properties offer `x-understudy-disk-reports: 1`, a backup with batched
acknowledgements tells it on `$ha.acks` when its journal's disk goes under its --min-disk-free and when it is over it
again (DISK_LOW); while any backup is under, the primary refuses durable messages for durable queues as it does for
its own disk (RabbitMQ's disk alarm blocks publishers cluster-wide), before the backup's disk fills and it must leave.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from broker.client import KIND_PROPERTY
from broker.options import REPLICATE_KEY

if TYPE_CHECKING:  # (kept out of the import graph of ha-admin/ha-status: they start faster)
    from broker.queue import Queue

STATUS_ADDRESS = "$ha.status"
ACKS_ADDRESS = "$ha.acks"
ACKS_BATCHED = "batched"  # link property `acks` of a replicating browser; connection property PROP_ACKS
QUEUE_PREFIX = "$ha.queue:"

PROP_KIND = KIND_PROPERTY
PROP_BROKER = "x-understudy-broker"
PROP_ADDRESS = "x-understudy-address"
PROP_EPOCH = "x-understudy-epoch"
PROP_ROLE = "x-understudy-role"
PROP_REPLICATE = "x-understudy-replicate"
PROP_PUBLIC_URL = "x-understudy-public-url"
PROP_ACKS = "x-understudy-acks"  # a primary that takes batched acknowledgements says ACKS_BATCHED
PROP_ACKS_FORMAT = "x-understudy-acks-format"  # 1: the primary also reads binary acknowledgements (ha.core.batch)
PROP_DEQUEUE_ACKS = "x-understudy-dequeue-acks"  # 1: the primary reads version-2 acknowledgements (dequeues too)
PROP_DISK_REPORTS = "x-understudy-disk-reports"  # 1: the primary reads a backup's disk reports on `$ha.acks`

# A disk report on `$ha.acks`: a message with no body whose application property DISK_LOW is why the backup's journal
# disk is under its --min-disk-free, or "" once it is not. Sent when that changes (and at connect, if low).
DISK_LOW = "disk-low"

LINK_BATCH = "batch"  # link property of a replicating browser: the batch format version offered / accepted
BATCH_VERSION = 1  # ha.core.batch
LINK_DEQUEUE_ACKS = "dequeue-acks"  # link property of a replicating browser: 1 = its dequeues are acknowledged
LINK_BATCH_MAX = "batch-max"  # the newest batch format a backup reads / the primary sends (ha.core.batch: 2)

LINK_EXPIRY_TAGS = "expiry-tags"  # link property: 1 = the backup reads "<kind><position>@<expiry>" tags (below)

# The per-message format: each transfer's tag says what it is. A message with an expiry carries its absolute time
# (seconds since the epoch) after "@" for a backup that offered LINK_EXPIRY_TAGS (older backups: the plain tag, and
# the backup counts the TTL from its own arrival)
TAG_LIVE = "e"
TAG_CATCHUP = "c"
TAG_DEQUEUE = "d"

# The HA management type: `ha-broker` with operations STATUS, PROMOTE, DEMOTE, REPLICATE.
MGMT_TYPE = "ha-broker"

# Condition for "I am not the primary": a backup refusing another backup, with the primary in `info` if known.
NOT_PRIMARY = "amqp:connection:redirect"


def replicate_level(arguments: Mapping[str, Any], temporary: bool, default: str) -> str:
    """The effective `qpid.replicate` level of an object: explicit, else none for temporary queues, else default."""
    v = arguments.get(REPLICATE_KEY)
    if isinstance(v, str) and v:
        return v
    if temporary:
        return "none"
    return default


def queue_level(q: Queue, default: str) -> str:
    temporary = q.temporary or (q.options.exclusive and q.options.auto_delete)
    return replicate_level(q.arguments, temporary, default)


def described_queue_level(attributes: Mapping[str, Any], default: str) -> str:
    """The level of a queue as a QUERY row or a wiring event describes it (the same rule as `queue_level`):
    a queue declared exclusive + auto-delete through management is as temporary as a dynamic one."""
    args = attributes.get("arguments") or {}
    temporary = bool(attributes.get("temporary")) or (args.get("exclusive") is True and args.get("auto-delete") is True)
    return replicate_level(args, temporary, default)


def redirect_info(url: str | None) -> dict[str, Any] | None:
    """`amqp:connection:redirect` info for the first host:port of `url`."""
    if not url:
        return None
    first = url.split(",")[0].strip()
    if "://" in first:
        first = first.split("://", 1)[1]
    host, _, port = first.rpartition(":")
    try:
        return {"network-host": host, "port": int(port), "address": url}
    except ValueError:
        return None


def message_tag(kind: str, position: int, expires: float | None, with_expiry: bool) -> bytes:
    """The tag of a per-message transfer."""
    if with_expiry and expires:
        return f"{kind}{position}@{expires!r}".encode()
    return f"{kind}{position}".encode()


def parse_message_tag(rest: str) -> tuple[int, float | None] | None:
    """The position and absolute expiry in a per-message tag after its kind letter; None if it is not one."""
    pos, at, exp = rest.partition("@")
    if not pos.isdigit() or int(pos) < 1:
        return None
    if not at:
        return int(pos), None
    try:
        expires = float(exp)
    except ValueError:
        return None
    return (int(pos), expires) if expires > 0 and expires == expires and expires != float("inf") else None
