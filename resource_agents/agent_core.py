"""Decisions of the ``understudy`` OCF agent, without I/O (unit-tested in tests/pacemaker/test_agent_core.py).

The agent (``resource_agents/understudy``) gathers facts -- the broker's ``ha-admin query`` answer, whether its
process is alive, the statuses other instances published as private node attributes -- and asks this module what
to return to Pacemaker, which promotion score to set, and whether a promote may go ahead.

Standard library only: the agent runs under the system ``python3`` that Pacemaker's executor starts.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum

# OCF exit codes (the values of resource-agents' ocf.py, repeated so this module imports without it).
OCF_SUCCESS = 0
OCF_ERR_GENERIC = 1
OCF_ERR_ARGS = 2
OCF_ERR_UNIMPLEMENTED = 3
OCF_ERR_INSTALLED = 5
OCF_ERR_CONFIGURED = 6
OCF_NOT_RUNNING = 7
OCF_RUNNING_PROMOTED = 8
OCF_FAILED_PROMOTED = 9

# Promotion scores. Only a primary or a ready backup ever gets one (see promotion_score).
PRIMARY_SCORE = 1001
BEST_READY_SCORE = 1000
RANK_STEP = 10
MIN_READY_SCORE = 10
BOOTSTRAP_SCORE = 1
ABORTED_SCORE = 1

BACKUP_STATES = frozenset({"joining", "catchup", "ready"})
PRIMARY_STATES = frozenset({"recovering", "active"})


@dataclass(frozen=True, order=False)
class BrokerStatus:
    """What an instance reports about itself: ``ha-admin query`` or a published node attribute."""

    role: str  # primary | backup | standalone
    state: str  # joining | catchup | ready | recovering | active | standalone
    epoch: int
    position: int
    lost_primary: bool = False  # see effective_status: was ready until its primary vanished

    @property
    def is_primary(self) -> bool:
        return self.role == "primary" and self.state in PRIMARY_STATES

    @property
    def is_ready_backup(self) -> bool:
        return self.role == "backup" and self.state == "ready"

    @property
    def currency(self) -> tuple[int, int]:
        """How current the data is: compare epoch first, position only within an epoch."""
        return (self.epoch, self.position)

    def encode(self) -> str:
        """Compact form stored in a node attribute: ``role:state:epoch:position[:lost]``."""
        text = f"{self.role}:{self.state}:{self.epoch}:{self.position}"
        return text + ":lost" if self.lost_primary else text

    @classmethod
    def decode(cls, text: str) -> BrokerStatus:
        parts = text.strip().split(":")
        if len(parts) not in (4, 5) or (len(parts) == 5 and parts[4] != "lost"):
            raise ValueError(f"bad published status {text!r}")
        return cls(
            role=parts[0],
            state=parts[1],
            epoch=int(parts[2]),
            position=int(parts[3]),
            lost_primary=len(parts) == 5,
        )


def status_from(data: object) -> BrokerStatus:
    """The broker's STATUS answer (contract: name, role, state, epoch, position, ...) as a BrokerStatus."""
    if not isinstance(data, dict):
        raise ValueError(f"unexpected status answer: not an object: {str(data)[:200]!r}")
    try:
        return BrokerStatus(
            role=str(data["role"]),
            state=str(data["state"]),
            epoch=int(data["epoch"]),
            position=int(data["position"]),
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"unexpected status answer: {exc!r}: {str(data)[:200]!r}") from exc


_ATTRD_LINE = re.compile(r'host="(?P<host>[^"]*)"\s+value="(?P<value>[^"]*)"')


def parse_attrd_query(text: str) -> dict[str, str]:
    """``attrd_updater -Q -A -n NAME`` output -> {node: value} (nodes without a value are left out)."""
    values: dict[str, str] = {}
    for line in text.splitlines():
        m = _ATTRD_LINE.search(line)
        if m and m.group("value"):
            values[m.group("host")] = m.group("value")
    return values


def decode_published(raw: Mapping[str, str]) -> dict[str, BrokerStatus]:
    """Decode published statuses, dropping unreadable ones (an old agent version, a torn write)."""
    out: dict[str, BrokerStatus] = {}
    for node, text in raw.items():
        try:
            out[node] = BrokerStatus.decode(text)
        except ValueError:
            continue
    return out


@dataclass(frozen=True)
class ReadyMark:
    """Written by monitor whenever the broker reports ``ready``: the epoch and when (monotonic-free wall time)."""

    epoch: int
    at: float

    def encode(self) -> str:
        return f"{self.epoch} {self.at:.3f}"

    @classmethod
    def decode(cls, text: str) -> ReadyMark:
        epoch, at = text.split()
        return cls(epoch=int(epoch), at=float(at))


READY_MARK_WINDOW = 60.0  # seconds a ready mark vouches for a backup that has just lost its primary


def effective_status(
    status: BrokerStatus, mark: ReadyMark | None, now: float, sole_member: bool = False
) -> BrokerStatus:
    """The status promotion decisions use.

    A ready backup that loses its primary stays ``ready`` in the broker itself (docs/states.md), so it remains a
    candidate without help from the agent; a ``joining`` broker is never vouched for (the ready mark is kept for
    the operator's information only: a backup that went back to joining may have been dropped by a primary that
    carried on without it).

    A broker whose ``brokers_url`` names only itself (``sole_member``) is always a candidate: no other broker can
    hold a message it lacks.
    """
    if sole_member and status.role == "backup" and status.state in BACKUP_STATES:
        return BrokerStatus(
            "backup", "ready", status.epoch, status.position, lost_primary=status.state != "ready"
        )
    return status


# ---- monitor -------------------------------------------------------------------------------------------------


def monitor_code(process_alive: bool, status: BrokerStatus | None, expected_promoted: bool) -> int:
    """OCF code for monitor: 7 stopped, 8 primary, 0 backup, 9/1 when the process lives but does not answer.

    A hung (SIGSTOPped) broker is alive but cannot answer ``ha-admin query`` within the timeout, so it fails
    monitor instead of passing it.
    """
    if not process_alive:
        return OCF_NOT_RUNNING
    if status is None:
        return OCF_FAILED_PROMOTED if expected_promoted else OCF_ERR_GENERIC
    if status.is_primary:
        return OCF_RUNNING_PROMOTED
    if status.role == "backup" and status.state in BACKUP_STATES:
        return OCF_SUCCESS
    return OCF_ERR_GENERIC  # standalone (no --ha-cluster) or a state we do not know


def promotion_score(node: str, own: BrokerStatus, published: Mapping[str, BrokerStatus]) -> int | None:
    """The promotion score this node should carry, or None to delete it.

    - the primary keeps PRIMARY_SCORE (a promoted instance without a score would be demoted);
    - ready backups are ranked by (epoch, position) among all ready instances: the most current gets
      BEST_READY_SCORE, each rank below loses RANK_STEP (equal currency, equal score);
    - joining/catchup backups get none, so Pacemaker never promotes a backup that lacks acknowledged messages;
    - bootstrap exception: a brand-new backup (``joining``, epoch 0) gets BOOTSTRAP_SCORE while no instance
      anywhere is primary or ready, so that a new cluster gets its first primary at all. A cluster restarted
      after a total outage (epoch > 0, nobody ready) gets no score: the operator picks the newest data
      (docs/runbook.md).
    """
    if own.is_primary:
        return PRIMARY_SCORE
    if own.is_ready_backup:
        ready = {n: s for n, s in published.items() if s.is_ready_backup and n != node}
        better = sorted({s.currency for s in ready.values() if s.currency > own.currency}, reverse=True)
        return max(BEST_READY_SCORE - RANK_STEP * len(better), MIN_READY_SCORE)
    if _brand_new(own) and not _anyone_serving(node, published):
        return BOOTSTRAP_SCORE
    return None


def _brand_new(status: BrokerStatus) -> bool:
    """Never followed a primary (epoch 0): holds nothing a client was promised."""
    return status.role == "backup" and status.state == "joining" and status.epoch == 0


def _anyone_serving(node: str, published: Mapping[str, BrokerStatus]) -> bool:
    return any(s.is_primary or s.is_ready_backup for n, s in published.items() if n != node)


# ---- promote -------------------------------------------------------------------------------------------------


class PromoteAction(Enum):
    ALREADY_PRIMARY = "already-primary"
    PROMOTE = "promote"
    ABORT_FOR_BETTER = "abort-for-better"
    REFUSE = "refuse"


@dataclass(frozen=True)
class PromoteDecision:
    action: PromoteAction
    reason: str
    epoch: int = 0  # the epoch to promote with (PROMOTE)
    force: bool = False  # promote from joining (bootstrap only)
    better_node: str | None = None  # ABORT_FOR_BETTER: the node that should be promoted instead


def decide_promote(node: str, own: BrokerStatus, published: Mapping[str, BrokerStatus]) -> PromoteDecision:
    """Decide a promote on ``node``, given what every instance published in the pre-promote notification.

    The new epoch is one above the highest epoch any instance reported, so it outranks every older primary.
    """
    others = {n: s for n, s in published.items() if n != node}
    new_epoch = max([own.epoch, *(s.epoch for s in others.values())]) + 1
    if own.is_primary:
        return PromoteDecision(PromoteAction.ALREADY_PRIMARY, "already primary", epoch=own.epoch)
    other_primary = sorted(n for n, s in others.items() if s.is_primary)
    if other_primary:
        return PromoteDecision(PromoteAction.REFUSE, f"{other_primary[0]} reports itself primary")
    if own.is_ready_backup:
        ahead = _most_current(
            {n: s for n, s in others.items() if s.is_ready_backup and s.currency > own.currency}
        )
        if ahead is not None:
            return _abort_for(ahead, own, others[ahead])
        reason = "most current ready backup" + (" (it lost its primary)" if own.lost_primary else "")
        return PromoteDecision(PromoteAction.PROMOTE, reason, epoch=new_epoch, force=own.lost_primary)
    if _brand_new(own) and not _anyone_serving(node, published):
        ahead = _most_current(
            {n: s for n, s in others.items() if _brand_new(s) and s.currency > own.currency}
        )
        if ahead is not None:
            return _abort_for(ahead, own, others[ahead])
        return PromoteDecision(
            PromoteAction.PROMOTE, "bootstrap: brand-new cluster, nobody serving", epoch=new_epoch
        )
    return PromoteDecision(
        PromoteAction.REFUSE,
        f"broker is {own.role}/{own.state}, not a ready backup: it may lack acknowledged messages",
    )


def _most_current(candidates: Mapping[str, BrokerStatus]) -> str | None:
    """The most current node (ties: the lowest node name, so every node picks the same one)."""
    if not candidates:
        return None
    return min(candidates, key=lambda n: (tuple(-c for c in candidates[n].currency), n))


def _abort_for(better: str, own: BrokerStatus, theirs: BrokerStatus) -> PromoteDecision:
    return PromoteDecision(
        PromoteAction.ABORT_FOR_BETTER,
        f"{better} is more current (epoch {theirs.epoch}, position {theirs.position}) than this node "
        f"(epoch {own.epoch}, position {own.position})",
        better_node=better,
    )


# ---- validate-all --------------------------------------------------------------------------------------------

_HOSTPORT = re.compile(r"^(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):(?P<port>[0-9]{1,5})$")


@dataclass(frozen=True)
class Problem:
    code: int  # OCF_ERR_CONFIGURED or OCF_ERR_INSTALLED
    message: str


def check_host_port(value: str) -> bool:
    m = _HOSTPORT.match(value)
    return m is not None and 1 <= int(m.group("port")) <= 65535


def check_values(params: Mapping[str, str]) -> list[Problem]:
    """Checks that need no I/O: formats and ranges of the instance parameters."""
    problems: list[Problem] = []

    def bad(message: str) -> None:
        problems.append(Problem(OCF_ERR_CONFIGURED, message))

    port = params.get("port", "")
    if not (port.isdigit() and 1 <= int(port) <= 65535):
        bad(f"port: expected 1..65535, got {port!r}")
    urls = [u.strip() for u in params.get("brokers_url", "").split(",") if u.strip()]
    if not urls:
        bad("brokers_url: required, a comma-separated list of host:port (one per broker, not the VIP)")
    for url in urls:
        if not check_host_port(url):
            bad(f"brokers_url: {url!r} is not host:port")
    public = params.get("public_url", "")
    if public and not check_host_port(public):
        bad(f"public_url: {public!r} is not host:port")
    try:
        if float(params.get("monitor_timeout", "")) <= 0:
            bad("monitor_timeout: must be > 0 seconds")
    except ValueError:
        bad(f"monitor_timeout: expected seconds, got {params.get('monitor_timeout')!r}")
    for key in ("data_dir", "config", "bindir", "log_file", "pid_file", "admin_socket"):
        value = params.get(key, "")
        if value and not value.startswith("/"):
            bad(f"{key}: must be an absolute path, got {value!r}")
    if not params.get("data_dir"):
        bad("data_dir: required")
    elif len(admin_socket(params).encode()) > UNIX_SOCKET_PATH_MAX:
        bad(f"admin_socket: {admin_socket(params)!r} is longer than {UNIX_SOCKET_PATH_MAX} bytes")
    try:
        shlex.split(params.get("options", ""))
    except ValueError as exc:
        bad(f"options: {exc}")
    return problems


def broker_command(params: Mapping[str, str], ha_broker: str, node_name: str) -> list[str]:
    """The ``ha-broker`` command line that starts this instance as a backup."""
    data_dir = params["data_dir"]
    cmd = [
        ha_broker,
        "--ha-cluster",
        "--name", params.get("name") or node_name,
        "--host", params.get("host") or "0.0.0.0",
        "--port", params["port"],
        "--data-dir", data_dir,
        "--log-file", params.get("log_file") or f"{data_dir}/broker.log",
        "--pid-file", params.get("pid_file") or f"{data_dir}/broker.pid",
        "--admin-socket", admin_socket(params),
        "--ha-brokers-url", params["brokers_url"],
    ]  # fmt: skip
    if params.get("public_url"):
        cmd += ["--ha-public-url", params["public_url"]]
    if params.get("config"):
        cmd += ["--config", params["config"]]
    return cmd + shlex.split(params.get("options", ""))


UNIX_SOCKET_PATH_MAX = 107  # bytes (sockaddr_un), as broker.config checks it


def admin_socket(params: Mapping[str, str]) -> str:
    """The broker's admin socket: the ``admin_socket`` parameter, else DATA_DIR/admin.sock."""
    return params.get("admin_socket") or os.path.join(params["data_dir"], "admin.sock")
