"""Parse ``crm_mon --output-as=xml`` into a small frozen snapshot (pure, no I/O)."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass


@dataclass(frozen=True)
class ResourceInstance:
    id: str
    role: str  # Started, Stopped, Promoted, Unpromoted, Starting, ...
    failed: bool
    nodes: tuple[str, ...]


@dataclass(frozen=True)
class ClusterStatus:
    online: frozenset[str]
    quorum: bool
    instances: tuple[ResourceInstance, ...]

    def nodes_with(self, resource: str, role: str) -> list[str]:
        """Nodes running ``resource`` (clone instances share the primitive id) in ``role``."""
        return sorted(n for r in self.instances if r.id == resource and r.role == role for n in r.nodes)

    def promoted(self, resource: str) -> list[str]:
        return self.nodes_with(resource, "Promoted")

    def unpromoted(self, resource: str) -> list[str]:
        return self.nodes_with(resource, "Unpromoted")

    def started(self, resource: str) -> list[str]:
        return self.nodes_with(resource, "Started")

    def failed(self) -> list[ResourceInstance]:
        return [r for r in self.instances if r.failed]


def parse_crm_mon(xml_text: str) -> ClusterStatus:
    root = ET.fromstring(xml_text)
    online = frozenset(
        n.get("name", "")
        for n in root.iter("node")
        if n.get("online") == "true" and n.get("type") == "member"
    )
    summary = root.find("summary/current_dc")
    quorum = summary is not None and summary.get("with_quorum") == "true"
    instances = []
    resources = root.find("resources")
    if resources is not None:
        for res in resources.iter("resource"):
            instances.append(
                ResourceInstance(
                    id=res.get("id", "").split(":")[0],
                    role=res.get("role", ""),
                    failed=res.get("failed") == "true",
                    nodes=tuple(n.get("name", "") for n in res.findall("node")),
                )
            )
    return ClusterStatus(online=online, quorum=quorum, instances=tuple(instances))
