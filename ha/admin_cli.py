"""`ha-admin`: operate one broker of a cluster. Exit 0 on success, 1 on failure with a one-line error."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, NoReturn

import click

from broker import admin_socket
from broker.client import ManagementClient, ManagementError, Reply
from ha import protocol as P


def fail(message: str) -> NoReturn:
    click.echo(f"ha-admin: {message}", err=True)
    sys.exit(1)


class Ctx:
    def __init__(
        self, broker: str, timeout: float, user: str | None, password: str | None, socket: Path | None
    ) -> None:
        self.broker = broker
        self.timeout = timeout
        self.user = user
        self.password = password
        self.socket = socket

    @property
    def target(self) -> str:
        return str(self.socket) if self.socket is not None else self.broker

    def request(self, operation: str, type_: str, name: str | None = None, body: Any = None) -> Reply:
        """One management request, over the admin socket if given, else AMQP; exits 1 without an answer."""
        if self.socket is not None:
            try:
                r = admin_socket.request(self.socket, operation, type_, name, body, self.timeout)
            except admin_socket.AdminSocketError as e:
                fail(str(e))
            return Reply(r.status, r.description, r.body, r.properties)
        try:
            with ManagementClient(self.broker, self.timeout, self.user, self.password) as c:
                return c.request(operation, type_, name, body)
        except ManagementError as e:
            fail(str(e))

    def call(self, operation: str, name: str | None = None, body: Any = None) -> dict[str, Any]:
        r = self.request(operation, P.MGMT_TYPE, name, body)
        if r.status == 400 and "unknown type" in r.description:
            fail(f"{self.target} is not an HA broker (started without --ha-cluster)")
        if not r.ok:
            fail(f"{operation.lower()} refused by {self.target}: {r.status} {r.description}")
        return r.body if isinstance(r.body, dict) else {"description": r.description}

    def call_type(self, operation: str, type_: str, name: str | None = None, body: Any = None) -> Reply:
        """A broker operation (queue, connection): exits 1 with the broker's status and reason when refused."""
        r = self.request(operation, type_, name, body)
        if r.status == 400 and "unknown type" in r.description:
            fail(f"{self.target} does not offer {operation} {type_} (an older broker?)")
        if not r.ok:
            what = f"{operation.lower()} {type_}" + (f" {name}" if name else "")
            fail(f"{what} refused by {self.target}: {r.status} {r.description}")
        return r


@click.group()
@click.option("--broker", "-b", default="127.0.0.1:5672", show_default=True, help="host:port of the broker")
@click.option("--timeout", default=5.0, show_default=True, help="seconds to wait for an answer")
@click.option("--user", default=None, help="SASL PLAIN user (admin role needed for changes)")
@click.option("--password", default=None)
@click.option(
    "--socket",
    type=click.Path(path_type=Path),
    default=None,
    help="talk to the broker on this host over its admin socket (ha-broker --admin-socket) instead of AMQP",
)
@click.pass_context
def cli(
    ctx: click.Context, broker: str, timeout: float, user: str | None, password: str | None, socket: Path | None
) -> None:
    """Operate one Understudy broker."""
    ctx.obj = Ctx(broker, timeout, user, password, socket)


@cli.command()
@click.pass_obj
def ping(obj: Ctx) -> None:
    """Exit 0 if the broker answers management within the timeout."""
    r = obj.request("READ", "broker", "broker")
    if not r.ok:
        fail(f"{obj.target} answered {r.status}: {r.description}")
    click.echo(f"{obj.target} is alive")


@cli.command()
@click.pass_obj
def query(obj: Ctx) -> None:
    """Print this broker's HA status as one JSON object."""
    click.echo(json.dumps(obj.call("STATUS"), sort_keys=True))


@cli.command()
@click.option("--force", is_flag=True, help="promote even from joining/catchup (may lose acknowledged messages)")
@click.option("--epoch", type=int, default=None, help="epoch to take (from an external coordinator)")
@click.pass_obj
def promote(obj: Ctx, force: bool, epoch: int | None) -> None:
    """Promote a ready backup to primary."""
    if force:
        click.echo("ha-admin: WARNING: forced promotion: messages acknowledged by the old primary may be lost",
                   err=True)
    body: dict[str, Any] = {"force": force}
    if epoch is not None:
        body["epoch"] = epoch
    st = obj.call("PROMOTE", body=body)
    click.echo(f"{st.get('name')} is primary ({st.get('state')}), epoch {st.get('epoch')}")


@cli.command()
@click.pass_obj
def demote(obj: Ctx) -> None:
    """Make a primary step down and rejoin as a backup."""
    obj.call("DEMOTE")
    click.echo(f"{obj.target} is stepping down")


@cli.command()
@click.argument("queue")
@click.option("--level", type=click.Choice(["all", "configuration", "none"]), default="all", show_default=True)
@click.pass_obj
def replicate(obj: Ctx, queue: str, level: str) -> None:
    """Set the replication level of an existing queue (run against the primary)."""
    obj.call("REPLICATE", name=queue, body={"level": level})
    click.echo(f"queue {queue} replicates {level}")


@cli.command("set")
@click.option("--brokers-url", default=None, help="new --ha-brokers-url: host:port of every broker, comma separated")
@click.option("--public-url", default=None, help="new --ha-public-url: what clients use (the VIP)")
@click.pass_obj
def set_urls(obj: Ctx, brokers_url: str | None, public_url: str | None) -> None:
    """Change this broker's brokers URL and/or public URL now (not kept across a restart: change the config too)."""
    body = {k: v for k, v in (("brokers_url", brokers_url), ("public_url", public_url)) if v is not None}
    if not body:
        raise click.UsageError("give --brokers-url and/or --public-url")
    st = obj.call("SET", body=body)
    click.echo(f"{st.get('name')}: brokers_url {st.get('brokers_url')}, public_url "
               f"{st.get('configured_public_url') or '-'} (until restart)")


@cli.command()
@click.argument("queue")
@click.pass_obj
def purge(obj: Ctx, queue: str) -> None:
    """Remove every available message from QUEUE (on the primary; backups follow)."""
    r = obj.call_type("PURGE", "queue", queue)
    click.echo(f"purged {r.body['purged']} messages from {queue} ({r.body['depth']} left, held by consumers)"
               if r.body["depth"] else f"purged {r.body['purged']} messages from {queue}")


@cli.command()
@click.argument("source")
@click.argument("destination")
@click.option("--count", type=click.IntRange(min=1), default=None, help="move only the oldest COUNT messages")
@click.pass_obj
def move(obj: Ctx, source: str, destination: str, count: int | None) -> None:
    """Move the available messages of SOURCE (or the oldest --count) to DESTINATION (on the primary)."""
    body: dict[str, Any] = {"destination": destination}
    if count is not None:
        body["count"] = count
    r = obj.call_type("MOVE", "queue", source, body)
    click.echo(f"moved {r.body['moved']} messages from {source} to {destination} "
               f"({r.body['depth']} left on {source})")


@cli.command()
@click.option("-f", "--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
@click.pass_obj
def connections(obj: Ctx, fmt: str) -> None:
    """List the broker's connections with their links (publishers, consumers, browsers)."""
    rows = obj.call_type("QUERY", "connection").rows()
    if fmt == "json":
        click.echo(json.dumps(rows, sort_keys=True, default=str))
        return
    from rich.console import Console
    from rich.table import Table

    t = Table()
    for col in ("Id", "Remote", "User", "Kind", "Container", "Links"):
        t.add_column(col, no_wrap=col != "Links", justify="right" if col == "Id" else "left")
    for c in sorted(rows, key=lambda c: c["id"]):
        links = "\n".join(f"{lk['kind']} {lk.get('address') or ''}".rstrip()
                          + (f" unsettled={lk['unsettled']}" if lk.get("unsettled") else "")
                          for lk in c["links"])
        t.add_row(str(c["id"]), c["remote"] or "", c["user"] or "", c["kind"], c["container"] or "", links)
    Console(width=None if sys.stdout.isatty() else 160).print(t)


@cli.command("close-connection")
@click.argument("connection_id", metavar="ID")
@click.pass_obj
def close_connection(obj: Ctx, connection_id: str) -> None:
    """Close connection ID (see `connections`): the client gets amqp:connection:forced, its unsettled messages go
    back to their queues."""
    r = obj.call_type("DELETE", "connection", connection_id)
    click.echo(r.description)


def main() -> None:
    cli()


@cli.command("pacemaker-setup")
@click.option("--vip", required=True, help="the virtual IP clients use")
@click.option("--brokers-url", required=True, help="host:port of every broker, comma separated (never the VIP)")
@click.option("--public-url", default=None, help="what clients use (default VIP:PORT)")
@click.option("--port", default=5672, show_default=True)
@click.option("--data-dir", default="/var/lib/understudy", show_default=True)
@click.option("--bindir", default=None, help="directory of ha-broker and ha-admin on every node")
@click.option("--nic", default=None, help="interface for the VIP")
@click.option("--cidr-netmask", default=24, show_default=True)
@click.option("--param", multiple=True, metavar="KEY=VALUE", help="extra agent parameter")
@click.option("--dry-run", is_flag=True, help="print the pcs commands only")
def pacemaker_setup(vip: str, brokers_url: str, public_url: str | None, port: int, data_dir: str,
                    bindir: str | None, nic: str | None, cidr_netmask: int, param: tuple[str, ...],
                    dry_run: bool) -> None:
    """Create the promotable broker clone, the IPaddr2 VIP and their constraints with pcs (prints each command)."""
    from ha.pacemaker import run_setup, setup_commands, setup_from_options

    try:
        extra = dict(kv.split("=", 1) for kv in param)
        setup = setup_from_options(vip, brokers_url, public_url=public_url, port=port, data_dir=data_dir,
                                   bindir=bindir, nic=nic, cidr_netmask=cidr_netmask, extra_params=extra)
    except ValueError as e:
        fail(str(e))
    sys.exit(1 if run_setup(setup_commands(setup), dry_run, click.echo) else 0)
