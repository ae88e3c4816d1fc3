"""`ha-status`: the cluster at a glance, like `patronictl list`.

    ha-status --broker 127.0.0.1:5672            # table
    ha-status --broker 127.0.0.1:5672 -f json    # the same content as JSON (stable field names)
    ha-status --broker 127.0.0.1:5672 --all -w 2 # ask every member itself, refresh every 2 s
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import click
from rich.console import Console, Group
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from broker.client import ManagementClient, ManagementError
from ha import protocol as P

STATE_STYLE = {"active": "bold green", "ready": "green", "catchup": "yellow", "joining": "red",
               "recovering": "bold yellow", "unreachable": "bold red"}


def fetch(url: str, timeout: float, user: str | None, password: str | None) -> dict[str, Any]:
    with ManagementClient(url, timeout, user, password) as c:
        r = c.request("STATUS", P.MGMT_TYPE)
        if r.status == 400:
            raise ManagementError(f"{url} is not an HA broker (started without --ha-cluster)")
        if not r.ok:
            raise ManagementError(f"{url}: {r.status} {r.description}")
        body: dict[str, Any] = r.body
        return body


def collect(url: str, all_members: bool, timeout: float, user: str | None, password: str | None) -> dict[str, Any]:
    """The cluster view: the asked broker's status, completed by the primary's (backlog/lag) and, with
    `all_members`, by each member's own answer."""
    st = fetch(url, timeout, user, password)
    view: dict[str, Any] = {
        "queried": url,
        "brokers_url": st.get("brokers_url"),
        "public_url": st.get("public_url"),
        "epoch": st.get("epoch"),
        "members": [],
    }
    members = {m["name"]: dict(m) for m in st.get("members", [])}
    if not members:
        members[st["name"]] = {k: st.get(k) for k in ("name", "address", "role", "state")}
    primary = next((m for m in members.values() if m.get("role") == "primary"), None)
    if st.get("role") != "primary" and primary is not None and primary.get("address"):
        try:
            pst = fetch(primary["address"], timeout, user, password)
            for m in pst.get("members", []):
                members.setdefault(m["name"], {}).update(m)
            view["epoch"] = pst.get("epoch", view["epoch"])
            view["public_url"] = pst.get("public_url") or view["public_url"]
        except ManagementError:
            primary["state"] = "unreachable"
    if all_members:
        for m in members.values():
            try:
                own = fetch(m["address"], timeout, user, password)
                m.update({"role": own["role"], "state": own["state"], "epoch": own["epoch"],
                          "position": own["position"]})
            except (ManagementError, KeyError):
                m["state"] = "unreachable"
    for m in sorted(members.values(), key=lambda m: (m.get("role") != "primary", m["name"])):
        row = {
            "name": m["name"],
            "address": m.get("address"),
            "role": m.get("role"),
            "state": m.get("state"),
            "queues": m.get("queues", st.get("queues") if m["name"] == st.get("name") else None),
            "backlog": m.get("backlog", 0 if m.get("role") == "backup" else None),
            "lag_ms": m.get("lag_ms", 0.0 if m.get("role") == "backup" else None),
        }
        if "catchup" in m:
            row["catchup"] = m["catchup"]
        if "position" in m:
            row["position"] = m["position"]
            row["epoch"] = m.get("epoch")
        view["members"].append(row)
    return view


def collect_zk(hosts: str, path: str, timeout: float) -> dict[str, Any]:
    """The cluster as published in ZooKeeper (no broker is contacted), like `patronictl list`."""
    from ha.coordination.base import CoordinatorError
    from ha.coordination.zookeeper import read_cluster

    try:
        cv = read_cluster(hosts, path, timeout)
    except CoordinatorError as e:
        raise ManagementError(f"ZooKeeper {hosts}{path}: {e}") from None
    return {
        "queried": f"{hosts}{path}",
        "brokers_url": ",".join(m.address for m in cv.members),
        "public_url": None,
        "epoch": cv.epoch,
        "leader": cv.leader,
        "waiting": cv.reason.value if cv.reason else None,
        "members": [
            {"name": m.name, "address": m.address, "role": m.role, "state": m.state, "epoch": m.epoch,
             "position": m.position, "queues": None, "backlog": None, "lag_ms": None}
            for m in sorted(cv.members, key=lambda m: (m.role != "primary", m.name))
        ],
    }


def render(view: dict[str, Any]) -> Group:
    header = Text.assemble(
        ("Cluster ", "bold"), (view.get("brokers_url") or "?", "cyan"),
        ("  public ", "bold"), (str(view.get("public_url") or "-"), "cyan"),
        ("  epoch ", "bold"), (str(view.get("epoch")), "magenta"),
    )
    if view.get("waiting"):
        header.append(f"  NO PRIMARY: waiting ({view['waiting']})", "bold red")
    t = Table(show_lines=False)
    cols = ["Member", "Address", "Role", "State", "Epoch", "Position", "Queues", "Backlog", "Lag ms", "Catch-up"]
    with_pos = any("position" in m and m.get("position") is not None for m in view["members"])
    if not with_pos:
        cols.remove("Epoch")
        cols.remove("Position")
    for col in cols:
        t.add_column(col, justify="right" if col in ("Epoch", "Position", "Queues", "Backlog", "Lag ms") else "left", no_wrap=True)
    for m in view["members"]:
        state = m.get("state") or "?"
        bar: Any = ""
        cu = m.get("catchup")
        if state == "catchup" and cu:
            bar = ProgressBar(total=1.0, completed=float(cu.get("fraction", 0.0)), width=20)
        extra = [str(m.get("epoch", "")), str(m.get("position", ""))] if with_pos else []
        t.add_row(
            m["name"], m.get("address") or "", m.get("role") or "", Text(state, STATE_STYLE.get(state, "")),
            *extra,
            "" if m.get("queues") is None else str(m["queues"]),
            "" if m.get("backlog") is None else str(m["backlog"]),
            "" if m.get("lag_ms") is None else f"{m['lag_ms']:.1f}",
            bar,
        )
    return Group(header, t)


@click.command()
@click.option("--broker", "-b", default="127.0.0.1:5672", show_default=True, help="any member's host:port")
@click.option("--all", "all_members", is_flag=True, help="also ask every member directly")
@click.option("-f", "--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
@click.option("-w", "--watch", type=float, default=None, help="refresh every SECONDS until Ctrl-C")
@click.option("--timeout", default=5.0, show_default=True)
@click.option("--user", default=None)
@click.option("--password", default=None)
@click.option("--zk-hosts", default=None, help="read the cluster from ZooKeeper instead of a broker")
@click.option("--zk-path", default="/understudy/default", show_default=True)
def cli(broker: str, all_members: bool, fmt: str, watch: float | None, timeout: float, user: str | None,
        password: str | None, zk_hosts: str | None, zk_path: str) -> None:
    """Show the HA cluster: members, roles, states, backlog and lag of each backup."""
    console = Console(width=None if sys.stdout.isatty() else 120)
    while True:
        try:
            if zk_hosts:
                view = collect_zk(zk_hosts, zk_path, timeout)
            else:
                view = collect(broker, all_members, timeout, user, password)
        except ManagementError as e:
            click.echo(f"ha-status: {e}", err=True)
            if watch is None:
                sys.exit(1)
            view = None
        if view is not None:
            if fmt == "json":
                click.echo(json.dumps(view, sort_keys=True))
            else:
                if watch is not None:
                    console.clear()
                console.print(render(view))
        if watch is None:
            return
        try:
            time.sleep(watch)
        except KeyboardInterrupt:
            return


def main() -> None:
    cli()
