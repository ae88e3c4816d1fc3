"""Pacemaker setup for Understudy: the pcs commands that create the promotable clone and its virtual IP.

``setup_commands`` is pure: it turns a :class:`PacemakerSetup` into the list of ``pcs`` command lines that

1. copy the live CIB into a scratch file (``pcs cluster cib FILE``),
2. create the promotable clone of the OCF agent (one promoted instance, notifications on),
3. create an ``ocf:heartbeat:IPaddr2`` virtual IP,
4. colocate the VIP with the Promoted role, order ``promote clone then start vip`` (mandatory) and
   ``demote clone then stop vip`` (optional, see below); both non-symmetrical, like ClusterLabs PAF's primary IP,
5. push the file back in one step (``pcs cluster cib-push FILE --config``),

so the cluster sees the whole configuration at once, never half of it. ``run_setup`` executes (or, with
``dry_run``, only prints) those commands. ``ha-admin pacemaker-setup`` is the command-line front end.
"""

from __future__ import annotations

import ipaddress
import re
import shlex
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

DEFAULT_AGENT = "ocf:understudy:understudy"
_ID = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]*$")
_INTERVAL = re.compile(r"^[0-9]+(ms|s|m|h)?$")


@dataclass(frozen=True)
class PacemakerSetup:
    """Everything ``setup_commands`` needs. ``agent_params`` are the OCF agent's instance parameters."""

    vip: str
    agent_params: Mapping[str, str] = field(default_factory=dict)
    resource: str = "understudy"
    agent: str = DEFAULT_AGENT
    vip_resource: str = "understudy-vip"
    cidr_netmask: int = 24
    nic: str | None = None
    promoted_monitor_interval: str = "3s"
    unpromoted_monitor_interval: str = "4s"
    monitor_timeout: str = "15s"
    start_timeout: str = "60s"
    stop_timeout: str = "40s"
    promote_timeout: str = "30s"
    demote_timeout: str = "60s"
    notify_timeout: str = "30s"
    cib_file: str = "understudy-cib.xml"

    def __post_init__(self) -> None:
        widest = ipaddress.ip_address(self.vip).max_prefixlen  # ValueError names the bad address
        for name in (self.resource, self.vip_resource):
            if not _ID.match(name):
                raise ValueError(f"bad Pacemaker resource id {name!r}")
        if self.resource == self.vip_resource:
            raise ValueError("the clone and the VIP need different resource ids")
        if not 1 <= self.cidr_netmask <= widest:
            raise ValueError(f"cidr_netmask must be 1..{widest} for {self.vip}, got {self.cidr_netmask}")
        if self.agent.count(":") != 2 or not self.agent.startswith("ocf:"):
            raise ValueError(f"agent must be ocf:PROVIDER:TYPE, got {self.agent!r}")
        for key in self.agent_params:
            if not _ID.match(key):
                raise ValueError(f"bad agent parameter name {key!r}")
        for label in (
            "promoted_monitor_interval",
            "unpromoted_monitor_interval",
            "monitor_timeout",
            "start_timeout",
            "stop_timeout",
            "promote_timeout",
            "demote_timeout",
            "notify_timeout",
        ):
            if not _INTERVAL.match(getattr(self, label)):
                raise ValueError(f"{label}: expected a duration like 3s, got {getattr(self, label)!r}")
        if self.promoted_monitor_interval == self.unpromoted_monitor_interval:
            # Pacemaker identifies operations by (name, interval): two monitors with one interval collide.
            raise ValueError("promoted and unpromoted monitor intervals must differ")

    @property
    def clone(self) -> str:
        return f"{self.resource}-clone"


def setup_commands(setup: PacemakerSetup) -> list[list[str]]:
    """The pcs command lines, in order. Pure: no I/O."""
    f = ["pcs", "-f", setup.cib_file]
    params = [f"{k}={v}" for k, v in setup.agent_params.items()]
    vip_params = [f"ip={setup.vip}", f"cidr_netmask={setup.cidr_netmask}"]
    if setup.nic:
        vip_params.append(f"nic={setup.nic}")
    # fmt: off
    return [
        ["pcs", "cluster", "cib", setup.cib_file],
        [*f, "resource", "create", setup.resource, setup.agent, *params,
         "op", "start", f"timeout={setup.start_timeout}",
         "op", "stop", f"timeout={setup.stop_timeout}",
         "op", "promote", f"timeout={setup.promote_timeout}",
         "op", "demote", f"timeout={setup.demote_timeout}",
         "op", "notify", f"timeout={setup.notify_timeout}",
         "op", "monitor", f"interval={setup.promoted_monitor_interval}", "role=Promoted",
         f"timeout={setup.monitor_timeout}",
         "op", "monitor", f"interval={setup.unpromoted_monitor_interval}", "role=Unpromoted",
         f"timeout={setup.monitor_timeout}",
         "promotable", "promoted-max=1", "notify=true"],
        [*f, "resource", "create", setup.vip_resource, "ocf:heartbeat:IPaddr2", *vip_params,
         "op", "monitor", "interval=3s"],
        [*f, "constraint", "colocation", "add", setup.vip_resource, "with", "Promoted", setup.clone, "INFINITY"],
        [*f, "constraint", "order", "promote", setup.clone, "then", "start", setup.vip_resource,
         "symmetrical=false", "kind=Mandatory"],
        # Optional, not Mandatory: in a partition without quorum the clone's "notified" pseudo-action is
        # unrunnable, and a mandatory order would block the VIP stop ("Stop vip ... due to unrunnable
        # X-clone notified (blocked)"), leaving the VIP up on the minority side.
        [*f, "constraint", "order", "demote", setup.clone, "then", "stop", setup.vip_resource,
         "symmetrical=false", "kind=Optional"],
        ["pcs", "cluster", "cib-push", setup.cib_file, "--config"],
    ]
    # fmt: on


Runner = Callable[[Sequence[str]], int]


def _subprocess_runner(cmd: Sequence[str]) -> int:
    return subprocess.run(list(cmd), check=False).returncode


def run_setup(
    commands: Sequence[Sequence[str]],
    dry_run: bool,
    echo: Callable[[str], None],
    runner: Runner = _subprocess_runner,
) -> int:
    """Print each command, run it unless ``dry_run``; stop at the first failure and return its exit code."""
    for cmd in commands:
        echo(("(dry run) " if dry_run else "+ ") + shlex.join(cmd))
        if dry_run:
            continue
        rc = runner(cmd)
        if rc != 0:
            echo(f"failed (exit {rc}): {shlex.join(cmd)}; the live CIB was not changed")
            return rc
    return 0


def setup_from_options(
    vip: str,
    brokers_url: str,
    *,
    public_url: str | None = None,
    port: int = 5672,
    data_dir: str = "/var/lib/understudy",
    bindir: str | None = None,
    nic: str | None = None,
    cidr_netmask: int = 24,
    extra_params: Mapping[str, str] | None = None,
) -> PacemakerSetup:
    """The usual deployment: agent parameters from command-line style options (``ha-admin pacemaker-setup``).
    Raises ValueError naming the option, for what the agent would refuse later (`validate-all`) or Pacemaker never
    run: a VIP that is not an address, brokers or a public URL that are not host:port, a port out of range."""
    from broker.config import parse_address, split_list

    try:
        address = ipaddress.ip_address(vip)
    except ValueError:
        raise ValueError(f"--vip: {vip!r} is not an IPv4 or IPv6 address") from None
    if not 1 <= port <= 65535:
        raise ValueError(f"--port: expected 1..65535, got {port}")
    brokers = split_list(brokers_url)
    if not brokers:
        raise ValueError("--brokers-url: empty: give every broker's own host:port, comma separated")
    for flag, value in [*(("--brokers-url", b) for b in brokers), *([("--public-url", public_url)] if public_url else [])]:
        try:
            parse_address(value)
        except ValueError as e:
            raise ValueError(f"{flag}: {e}") from None
    host = f"[{vip}]" if address.version == 6 else vip  # IPv6 in brackets, as the agent and the broker read it
    params = {
        "brokers_url": ",".join(brokers),
        "public_url": public_url or f"{host}:{port}",
        "port": str(port),
        "data_dir": data_dir,
    }
    if bindir:
        params["bindir"] = bindir
    params.update(extra_params or {})
    return PacemakerSetup(vip=vip, agent_params=params, nic=nic, cidr_netmask=cidr_netmask)


def main(argv: Sequence[str] | None = None) -> int:
    """``python3 -m ha.pacemaker --vip ... --brokers-url ... [--dry-run]`` (the same as ha-admin pacemaker-setup)."""
    import argparse

    p = argparse.ArgumentParser(
        prog="python3 -m ha.pacemaker", description="Create the Understudy resources."
    )
    p.add_argument("--vip", required=True)
    p.add_argument("--brokers-url", required=True, help="host:port of every broker, comma separated")
    p.add_argument("--public-url", help="what clients use (default VIP:PORT)")
    p.add_argument("--port", type=int, default=5672)
    p.add_argument("--data-dir", default="/var/lib/understudy")
    p.add_argument("--bindir", help="directory of ha-broker and ha-admin on every node")
    p.add_argument("--nic", help="interface for the VIP (default: IPaddr2 picks the one on the VIP's subnet)")
    p.add_argument("--cidr-netmask", type=int, default=24)
    p.add_argument("--param", action="append", default=[], metavar="KEY=VALUE", help="extra agent parameter")
    p.add_argument("--dry-run", action="store_true", help="print the pcs commands only")
    a = p.parse_args(argv)
    try:
        extra = dict(kv.split("=", 1) for kv in a.param)
        setup = setup_from_options(
            a.vip, a.brokers_url, public_url=a.public_url, port=a.port, data_dir=a.data_dir, bindir=a.bindir,
            nic=a.nic, cidr_netmask=a.cidr_netmask, extra_params=extra,
        )  # fmt: skip
    except ValueError as exc:
        print(f"error: {exc}")
        return 2
    return run_setup(setup_commands(setup), a.dry_run, print)


if __name__ == "__main__":
    raise SystemExit(main())
