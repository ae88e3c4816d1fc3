"""Render the Corosync configuration and the bootstrap CIB of an Understudy Pacemaker cluster.

Pure functions (text in, text out) plus a small command line used by ``deploy/provision.sh``::

    python3 -m deploy.clusterconf corosync --cluster-name understudy \
        --node node1=192.168.77.11 --node node2=192.168.77.12 --node node3=192.168.77.13
    python3 -m deploy.clusterconf cib --dc-deadtime 2s --no-stonith

The bootstrap CIB only holds cluster properties. It must not carry ``crm_feature_set``: a pre-seeded CIB with
that attribute sends pacemaker-controld into a crash loop.
"""

from __future__ import annotations

import argparse
import ipaddress
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from xml.sax.saxutils import quoteattr

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")


@dataclass(frozen=True)
class ClusterNode:
    name: str
    address: str
    nodeid: int

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise ValueError(f"bad node name {self.name!r}")
        ipaddress.ip_address(self.address)  # raises ValueError with the bad value
        if self.nodeid < 1:
            raise ValueError(f"node {self.name}: nodeid must be >= 1")


@dataclass(frozen=True)
class ClusterSpec:
    """What differs between clusters; everything else is fixed policy."""

    name: str
    nodes: tuple[ClusterNode, ...]
    token_ms: int = 1000
    # Corosync adds this per node beyond two to the token timeout (default 650 ms); 0 makes failure detection
    # independent of the cluster size: token timeout = token_ms, consensus = 1.2 x token_ms.
    token_coefficient_ms: int = 0
    log_dir: str = "/var/log/corosync"

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise ValueError(f"bad cluster name {self.name!r}")
        if not self.nodes:
            raise ValueError("a cluster needs at least one node")
        for attr in ("name", "address", "nodeid"):
            values = [getattr(n, attr) for n in self.nodes]
            if len(set(values)) != len(values):
                raise ValueError(f"duplicate node {attr} in {values}")


def nodes_from_pairs(pairs: Sequence[str]) -> tuple[ClusterNode, ...]:
    """``["node1=10.0.0.1", ...]`` -> nodes numbered 1, 2, ... in the given order."""
    nodes = []
    for i, pair in enumerate(pairs, start=1):
        name, sep, address = pair.partition("=")
        if not sep:
            raise ValueError(f"expected NAME=ADDRESS, got {pair!r}")
        nodes.append(ClusterNode(name=name, address=address, nodeid=i))
    return tuple(nodes)


def corosync_conf(spec: ClusterSpec) -> str:
    """corosync.conf for knet without crypto (a private network), one ``key: value`` per line.

    Corosync wants ``node {`` alone on its line; anything after the bracket is a parse error.
    """
    lines = [
        "totem {",
        "    version: 2",
        f"    cluster_name: {spec.name}",
        "    transport: knet",
        "    crypto_cipher: none",
        "    crypto_hash: none",
        f"    token: {spec.token_ms}",
        f"    token_coefficient: {spec.token_coefficient_ms}",
        "}",
        "nodelist {",
    ]
    for node in spec.nodes:
        lines += [
            "    node {",
            f"        ring0_addr: {node.address}",
            f"        name: {node.name}",
            f"        nodeid: {node.nodeid}",
            "    }",
        ]
    lines += [
        "}",
        "quorum {",
        "    provider: corosync_votequorum",
    ]
    if len(spec.nodes) == 2:
        lines.append("    two_node: 1")
    lines += [
        "}",
        "logging {",
        "    to_logfile: yes",
        f"    logfile: {spec.log_dir}/corosync.log",
        "    to_stderr: no",
        "    to_syslog: no",
        "    timestamp: on",
        "}",
        "",
    ]
    return "\n".join(lines)


@dataclass(frozen=True)
class BootstrapProperties:
    """Cluster properties written before Pacemaker first starts.

    ``dc_deadtime`` shortens the first DC election (default 20 s). ``stonith_enabled=False`` is for test clusters
    only: production clusters need fencing.
    """

    dc_deadtime: str = "2s"
    stonith_enabled: bool = True
    extra: Mapping[str, str] = field(default_factory=dict)

    def as_pairs(self) -> list[tuple[str, str]]:
        pairs = [
            ("stonith-enabled", "true" if self.stonith_enabled else "false"),
            ("dc-deadtime", self.dc_deadtime),
        ]
        pairs += sorted(self.extra.items())
        return pairs


def bootstrap_cib(props: BootstrapProperties) -> str:
    """A minimal CIB with cluster properties only (no crm_feature_set, see module docstring)."""
    nvpairs = "\n".join(
        f"        <nvpair id={quoteattr('opt-' + name)} name={quoteattr(name)} value={quoteattr(value)}/>"
        for name, value in props.as_pairs()
    )
    return (
        '<cib validate-with="pacemaker-3.9" epoch="1" num_updates="0" admin_epoch="0">\n'
        "  <configuration>\n"
        "    <crm_config>\n"
        '      <cluster_property_set id="cib-bootstrap-options">\n'
        f"{nvpairs}\n"
        "      </cluster_property_set>\n"
        "    </crm_config>\n"
        "    <nodes/>\n"
        "    <resources/>\n"
        "    <constraints/>\n"
        "  </configuration>\n"
        "  <status/>\n"
        "</cib>\n"
    )


def _main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m deploy.clusterconf", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    c = sub.add_parser("corosync", help="print corosync.conf")
    c.add_argument("--cluster-name", default="understudy")
    c.add_argument("--node", action="append", required=True, metavar="NAME=ADDRESS")
    c.add_argument("--token-ms", type=int, default=1000)
    b = sub.add_parser("cib", help="print the bootstrap CIB")
    b.add_argument("--dc-deadtime", default="2s")
    b.add_argument("--no-stonith", action="store_true", help="test clusters only")
    args = parser.parse_args(argv)
    try:
        if args.what == "corosync":
            spec = ClusterSpec(
                name=args.cluster_name, nodes=nodes_from_pairs(args.node), token_ms=args.token_ms
            )
            sys.stdout.write(corosync_conf(spec))
        else:
            props = BootstrapProperties(dc_deadtime=args.dc_deadtime, stonith_enabled=not args.no_stonith)
            sys.stdout.write(bootstrap_cib(props))
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(_main())
