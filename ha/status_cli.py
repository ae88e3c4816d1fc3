"""`ha-status`: the cluster at a glance, like `patronictl list`.

    ha-status --broker 127.0.0.1:5672            # table
    ha-status --broker 127.0.0.1:5672 -f json    # the same content as JSON (stable field names)
    ha-status --broker 127.0.0.1:5672 --all -w 2 # with epoch and position, refresh every 2 s; when the asked
                                                 # broker stops answering, ask the others of its brokers URL
    ha-status --broker 127.0.0.1:5672 --expect ready   # exit 0 if that broker is ready, 1 otherwise
    ha-status --broker 127.0.0.1:5672 --is-primary     # exit 0 if that broker is the primary, 1 otherwise

Every row is what that member says of itself (its own STATUS answer, asked in parallel): a broker's membership list
is only its last knowledge of the others (a primary that stepped down still holds the list in which it was primary),
so it is used to find members and to say what was last known of one that does not answer, never as the row.
"""

from __future__ import annotations

import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import click
from rich.console import Console, Group
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from broker.client import ManagementClient, ManagementError
from broker.config import split_list
from broker.tls import ClientTls, TlsError
from ha import cli_tls
from ha import protocol as P
from ha.core.states import HaState, Role

STATE_STYLE = {"active": "bold green", "ready": "green", "catchup": "yellow", "joining": "red",
               "recovering": "bold yellow", "unreachable": "bold red"}
# What --expect accepts: an HA state, or a role (any state of that role).
EXPECTABLE = (*(s.value for s in HaState if s is not HaState.STANDALONE), Role.PRIMARY.value, Role.BACKUP.value)


def fetch(url: str, timeout: float, user: str | None, password: str | None,
          tls: ClientTls | None = None) -> dict[str, Any]:
    with ManagementClient(url, timeout, user, password, ssl_domain=cli_tls.domain(tls)) as c:
        r = c.request("STATUS", P.MGMT_TYPE)
        if r.status == 400:
            raise ManagementError(f"{url} is not an HA broker (started without --ha-cluster)")
        if not r.ok:
            raise ManagementError(f"{url}: {r.status} {r.description}")
        body: dict[str, Any] = r.body
        return body


def _try_fetch(url: str, timeout: float, user: str | None, password: str | None,
               tls: ClientTls | None = None) -> dict[str, Any] | str:
    try:
        return fetch(url, timeout, user, password, tls)
    except ManagementError as e:
        return str(e)


def ask_all(urls: list[str], timeout: float, user: str | None, password: str | None,
            tls: ClientTls | None = None) -> dict[str, dict[str, Any] | str]:
    """Each address's own STATUS (or why there is none), asked in parallel: a dead host costs one timeout, not one
    per member."""
    if not urls:
        return {}
    with ThreadPoolExecutor(max_workers=min(8, len(urls))) as pool:
        futures = {u: pool.submit(_try_fetch, u, timeout, user, password, tls) for u in urls}
        return {u: f.result() for u, f in futures.items()}


def _clock(ts: float | None) -> str:
    return time.strftime("%H:%M:%S", time.localtime(ts)) if ts else "?"


def collect(url: str, all_members: bool, timeout: float, user: str | None, password: str | None,
            tls: ClientTls | None = None) -> dict[str, Any]:
    """The cluster view. The asked broker must answer (else ManagementError); every other member found in its
    membership list or its --ha-brokers-url is asked too. A member that does not answer is `unreachable`, with
    what the asked broker last knew of it (`stale`) when its list names it. `all_members` only widens the table
    (epoch and position columns); the JSON always has them."""
    st = fetch(url, timeout, user, password, tls)
    listed = {m["name"]: m for m in st.get("members", []) if isinstance(m, dict) and m.get("name")}
    # brokers_url first: those are the addresses the cluster is configured with (a member's own address may be a
    # wildcard such as 0.0.0.0:5672 when it listens on every interface).
    todo: list[str] = []
    for a in [*split_list(st.get("brokers_url")), *(m.get("address") for m in listed.values())]:
        if a and a not in todo and a not in (url, st.get("address")):
            todo.append(a)
    answers: dict[str, tuple[str, dict[str, Any]]] = {st["name"]: (url, st)}  # name -> (address asked, answer)
    failed: dict[str, str] = {}  # address -> why it did not answer
    for addr, got in ask_all(todo, timeout, user, password, tls).items():
        if isinstance(got, str):
            failed[addr] = got
        elif got.get("name") not in answers:
            answers[got["name"]] = (addr, got)
    primaries = sorted(n for n, (_, a) in answers.items() if a.get("role") == Role.PRIMARY.value)
    rows: list[dict[str, Any]] = []
    for name, (addr, a) in answers.items():
        row: dict[str, Any] = {
            "name": name, "address": addr, "role": a.get("role"), "state": a.get("state"),
            "epoch": a.get("epoch"), "position": a.get("position"), "queues": a.get("queues"),
            "backlog": None, "lag_ms": None, "primary": a.get("primary"), "source": "self",
            "as_of": a.get("time"), "journal_failed": a.get("journal_failed"),
            "journal_stalled": a.get("journal_stalled"), "journal_low_disk": a.get("journal_low_disk"),
            "backups_low_disk": a.get("backups_low_disk"),
            "settle_held": a.get("settle_held"),
        }
        followed = answers.get(a.get("primary") or "")
        if a.get("role") == Role.BACKUP.value and followed is not None \
                and followed[1].get("role") == Role.PRIMARY.value:
            seen = next((m for m in followed[1].get("members", []) if m.get("name") == name), None)
            if seen is not None:  # backlog and lag exist only on the primary's side
                row["backlog"] = seen.get("backlog", 0)
                row["lag_ms"] = seen.get("lag_ms", 0.0)
                row["queues"] = seen.get("queues", row["queues"])
                if "catchup" in seen:
                    row["catchup"] = seen["catchup"]
        rows.append(row)
    covered = {r["address"] for r in rows}
    for name, m in listed.items():
        if name in answers:
            continue
        covered.add(m.get("address"))
        rows.append({
            "name": name, "address": m.get("address"), "role": None, "state": "unreachable", "epoch": None,
            "position": None, "queues": None, "backlog": None, "lag_ms": None, "primary": None,
            "source": "unreachable", "as_of": None, "error": failed.get(m.get("address") or "", "no answer"),
            "stale": {"role": m.get("role"), "state": m.get("state"), "by": st["name"],
                      "since": st.get("membership_since")},
        })
    for addr, why in failed.items():
        if addr not in covered:
            rows.append({
                "name": None, "address": addr, "role": None, "state": "unreachable", "epoch": None,
                "position": None, "queues": None, "backlog": None, "lag_ms": None, "primary": None,
                "source": "unreachable", "as_of": None, "error": why,
            })
    rows.sort(key=lambda r: (r["role"] != Role.PRIMARY.value, r["name"] is None, r["name"] or r["address"]))
    lead = answers[primaries[0]][1] if len(primaries) == 1 else None
    epochs = [a.get("epoch") or 0 for _, a in answers.values()]
    return {
        "queried": url,
        "brokers_url": st.get("brokers_url"),
        "public_url": (lead or st).get("public_url"),
        "epoch": lead.get("epoch") if lead else max(epochs),
        "primary": primaries[0] if len(primaries) == 1 else None,
        "primaries": primaries,
        "time": time.time(),
        "members": rows,
    }


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


def headline(view: dict[str, Any]) -> tuple[str, str] | None:
    """Who is primary, as (text, style); None for a view that does not say (ZooKeeper)."""
    if "primaries" not in view:
        return None
    primaries = view["primaries"]
    if len(primaries) > 1:
        return f"MORE THAN ONE PRIMARY: {', '.join(primaries)}", "bold red"
    if primaries:
        return f"primary {primaries[0]}", "bold green"
    last = [m["name"] for m in view["members"] if (m.get("stale") or {}).get("role") == Role.PRIMARY.value]
    return "NO PRIMARY" + (f" (last known primary {', '.join(last)} does not answer)" if last else ""), "bold red"


# A member's conditions that its Note shows in red (`_note`)
ALARMS = ("journal_failed", "journal_stalled", "journal_low_disk", "backups_low_disk", "settle_held")


def _note(m: dict[str, Any]) -> str:
    s = m.get("stale")
    if s:
        return f"stale since {_clock(s.get('since'))}: {s.get('role')} {s.get('state')} (per {s.get('by')})"
    if m.get("journal_failed"):  # durable messages refused (primary), out of the cluster (backup): docs/durability.md
        return f"JOURNAL CANNOT WRITE: {m['journal_failed']}"
    if m.get("journal_stalled"):  # a hung disk: durable messages wait (docs/durability.md)
        return f"JOURNAL SYNC STALLED: {m['journal_stalled']}"
    if m.get("journal_low_disk"):  # under --min-disk-free: its own clients' durable messages refused
        return f"DISK LOW: {m['journal_low_disk']}"
    if m.get("backups_low_disk"):  # a primary: a backup's disk is under its --min-disk-free
        names = ", ".join(m["backups_low_disk"])
        return f"DURABLE REFUSED: disk low on backup {names} (under its --min-disk-free)"
    if m.get("settle_held"):  # --ha-min-ready-backups, no lease, a member list unconfirmed: clients wait
        return f"SETTLEMENTS HELD: {m['settle_held']}"
    return "no answer" if m.get("source") == "unreachable" else ""


def render(view: dict[str, Any], all_members: bool = False) -> Group:
    header = Text.assemble(
        ("Cluster ", "bold"), (view.get("brokers_url") or "?", "cyan"),
        ("  public ", "bold"), (str(view.get("public_url") or "-"), "cyan"),
        ("  epoch ", "bold"), (str(view.get("epoch")), "magenta"),
    )
    head = headline(view)
    if head is not None:
        header.append("  ")
        header.append(*head)
    if view.get("unanswered"):
        header.append(f"  ({', '.join(view['unanswered'])} did not answer; asked {view['queried']})", "yellow")
    if view.get("waiting"):
        header.append(f"  NO PRIMARY: waiting ({view['waiting']})", "bold red")
    t = Table(show_lines=False)
    cols = ["Member", "Address", "Role", "State", "Epoch", "Position", "Queues", "Backlog", "Lag ms", "Catch-up",
            "Note"]
    zk = "primaries" not in view  # ZooKeeper's view: positions as published there
    with_pos = all_members or (zk and any(m.get("position") is not None for m in view["members"]))
    if not with_pos:
        cols.remove("Epoch")
        cols.remove("Position")
    with_note = any(_note(m) for m in view["members"])
    if not with_note:
        cols.remove("Note")
    for col in cols:
        t.add_column(col, justify="right" if col in ("Epoch", "Position", "Queues", "Backlog", "Lag ms") else "left",
                     no_wrap=True)
    for m in view["members"]:
        state = m.get("state") or "?"
        bar: Any = ""
        cu = m.get("catchup")
        if state == "catchup" and cu:
            bar = ProgressBar(total=1.0, completed=float(cu.get("fraction", 0.0)), width=20)
        extra = ["" if m.get(k) is None else str(m[k]) for k in ("epoch", "position")] if with_pos else []
        t.add_row(
            m.get("name") or "-", m.get("address") or "", m.get("role") or "", Text(state, STATE_STYLE.get(state, "")),
            *extra,
            "" if m.get("queues") is None else str(m["queues"]),
            "" if m.get("backlog") is None else str(m["backlog"]),
            "" if m.get("lag_ms") is None else f"{m['lag_ms']:.1f}",
            bar,
            *([Text(_note(m), "bold red" if any(m.get(k) for k in ALARMS) else "dim")]
              if with_note else []),
        )
    return Group(header, t)


def check(broker: str, expect: str | None, timeout: float, user: str | None, password: str | None,
          tls: ClientTls | None = None) -> int:
    """--expect STATE / --is-primary (expect == "primary"): one line, exit code 0 when it holds, 1 otherwise."""
    try:
        st = fetch(broker, timeout, user, password, tls)
    except ManagementError as e:
        click.echo(f"ha-status: {e}", err=True)
        return 1
    name, role, state = st.get("name"), st.get("role"), st.get("state")
    if expect in (role, state):
        click.echo(f"{name} is {role} {state}")
        return 0
    click.echo(f"ha-status: {name} is {role} {state}, expected {expect}", err=True)
    return 1


@click.command()
@click.option("--broker", "-b", default="127.0.0.1:5672", show_default=True,
              help="any member's host:port, or several, comma separated: the first that answers",
              callback=cli_tls.broker_addresses(several=True))
@click.option("--all", "all_members", is_flag=True, help="also show each member's epoch and position")
@click.option("-f", "--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
@click.option("-w", "--watch", type=click.FloatRange(min=0.1), default=None, metavar="SECONDS",
              help="refresh every SECONDS until Ctrl-C")
@click.option("--expect", type=click.Choice(EXPECTABLE), default=None,
              help="only check: exit 0 if this broker is in STATE (or has this role), 1 otherwise")
@click.option("--is-primary", is_flag=True, help="only check: exit 0 if this broker is the primary, 1 otherwise")
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), default=5.0, show_default=True,
              help="seconds to wait for an answer")
@click.option("--user", default=None)
@click.option("--password", default=None)
@click.option("--zk-hosts", default=None, help="read the cluster from ZooKeeper instead of a broker",
              callback=cli_tls.zk_hosts)
@click.option("--zk-path", default="/understudy/default", show_default=True, callback=cli_tls.zk_path)
@cli_tls.tls_options
def cli(broker: str, all_members: bool, fmt: str, watch: float | None, expect: str | None, is_primary: bool,
        timeout: float, user: str | None, password: str | None, zk_hosts: str | None, zk_path: str,
        ssl_ca: Path | None, ssl_cert: Path | None, ssl_key: Path | None, ssl_key_password_file: Path | None,
        ssl_verify_hostname: bool) -> None:
    """Show the HA cluster: members, roles, states, backlog and lag of each backup."""
    try:
        tls = cli_tls.settings(ssl_ca, ssl_cert, ssl_key, ssl_verify_hostname, ssl_key_password_file)
    except TlsError as e:
        click.echo(f"ha-status: {e}", err=True)
        sys.exit(2)
    if expect is not None or is_primary:
        clash = [flag for flag, given in (("--expect", expect is not None and is_primary), ("--watch", watch),
                                          ("--zk-hosts", zk_hosts), ("several --broker addresses",
                                                                      len(split_list(broker)) > 1)) if given]
        if clash:
            raise click.UsageError(f"--expect/--is-primary check one broker once: not with {clash[0]}")
        sys.exit(check(broker, "primary" if is_primary else expect, timeout, user, password, tls))
    console = Console(width=None if sys.stdout.isatty() else 160)
    asked = split_list(broker)
    if not asked and not zk_hosts:
        raise click.UsageError("--broker needs host:port")
    known: list[str] = []  # the brokers URL of the last answer: where to turn when the asked broker goes away
    while True:
        view, errors, silent = None, [], []
        for url in [*asked, *(a for a in known if a not in asked)] if not zk_hosts else [zk_hosts]:
            try:
                view = (collect_zk(zk_hosts, zk_path, timeout) if zk_hosts
                        else collect(url, all_members, timeout, user, password, tls))
                break
            except ManagementError as e:
                errors.append(str(e))
                silent.append(url)
        if view is None:
            click.echo(f"ha-status: {errors[0]}" if len(errors) == 1 else
                       f"ha-status: no broker answers ({'; '.join(errors)})", err=True)
            if watch is None:
                sys.exit(1)
        else:
            known = split_list(view.get("brokers_url"))
            if silent:
                view["unanswered"] = silent
            if fmt == "json":
                click.echo(json.dumps(view, sort_keys=True))
            else:
                if watch is not None:
                    console.clear()
                console.print(render(view, all_members))
            sys.stdout.flush()  # watched through a pipe (| tee): each view as it comes
        if watch is None:
            return
        try:
            time.sleep(watch)
        except KeyboardInterrupt:
            return


def main() -> None:
    cli()
