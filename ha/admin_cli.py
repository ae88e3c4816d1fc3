"""`ha-admin`: operate one broker of a cluster. Exit 0 on success, 1 on failure with a one-line error."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any, NoReturn

import click

from broker import admin_socket
from broker.client import ManagementClient, ManagementError, Reply
from broker.tls import ClientTls, TlsError
from ha import cli_tls
from ha import protocol as P


def fail(message: str) -> NoReturn:
    click.echo(f"ha-admin: {message}", err=True)
    sys.exit(1)


def usage(message: str) -> NoReturn:
    """A command line that cannot be carried out as given (exit 2, like click's own usage errors)."""
    click.echo(f"ha-admin: {message}", err=True)
    sys.exit(2)


class Ctx:
    def __init__(
        self, broker: str, timeout: float, user: str | None, password: str | None, socket: Path | None,
        tls: ClientTls | None = None,
    ) -> None:
        self.tls = tls  # talk TLS to the broker (ha.cli_tls)
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
            with ManagementClient(self.broker, self.timeout, self.user, self.password,
                                  ssl_domain=cli_tls.domain(self.tls)) as c:
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
@click.option("--broker", "-b", default="127.0.0.1:5672", show_default=True, help="host:port of the broker",
              callback=cli_tls.broker_addresses(several=False))
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), default=5.0, show_default=True,
              help="seconds to wait for an answer")
@click.option("--user", default=None, help="SASL PLAIN user (admin role needed for changes)")
@click.option("--password", default=None)
@click.option(
    "--socket",
    type=click.Path(path_type=Path),
    default=None,
    help="talk to the broker on this host over its admin socket (ha-broker --admin-socket) instead of AMQP",
)
@cli_tls.tls_options
@click.pass_context
def cli(
    ctx: click.Context, broker: str, timeout: float, user: str | None, password: str | None, socket: Path | None,
    ssl_ca: Path | None, ssl_cert: Path | None, ssl_key: Path | None, ssl_key_password_file: Path | None,
    ssl_verify_hostname: bool,
) -> None:
    """Operate one Understudy broker."""
    try:
        tls = cli_tls.settings(ssl_ca, ssl_cert, ssl_key, ssl_verify_hostname, ssl_key_password_file)
    except TlsError as e:
        usage(str(e))
    ctx.obj = Ctx(broker, timeout, user, password, socket, tls)


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


def _answering_primary(obj: Ctx, st: dict[str, Any]) -> tuple[str, str, Any] | None:
    """The primary a ready backup follows, as (name, address, epoch), if it answers as primary now. Asked of the
    primary itself: a backup still names a primary killed a moment ago until it notices the reset. A primary that
    does not answer (down, frozen, unreachable from here, refusing these credentials) is not reported: a warning
    says why it could not be asked."""
    name = st.get("primary")
    if st.get("state") != "ready" or st.get("coordinator") == "zookeeper" or not isinstance(name, str) or not name:
        return None  # (under ZooKeeper the broker itself refuses: its election promotes)
    address = next((m.get("address") for m in st.get("members", []) if m.get("name") == name), None)
    if not isinstance(address, str) or not address:
        return None
    try:
        with ManagementClient(address, min(obj.timeout, 2.0), obj.user, obj.password,
                              ssl_domain=cli_tls.domain(obj.tls)) as c:
            r = c.request("STATUS", P.MGMT_TYPE)
    except ManagementError as e:
        click.echo(f"ha-admin: warning: could not ask {name} whether it is still primary ({e}); promoting", err=True)
        return None
    body = r.body if r.ok and isinstance(r.body, dict) else {}
    return (name, address, body.get("epoch")) if body.get("role") == "primary" else None


@cli.command()
@click.option("--force", is_flag=True, help="promote even from joining/catchup (may lose acknowledged messages)")
@click.option("--epoch", type=int, default=None, help="epoch to take (from an external coordinator)")
@click.option("--beside-live-primary", is_flag=True,
              help="promote even though the backup's primary answers (two primaries until one steps down)")
@click.pass_obj
def promote(obj: Ctx, force: bool, epoch: int | None, beside_live_primary: bool) -> None:
    """Promote a ready backup to primary. Refused (exit 1) while the primary it follows answers: stop or demote
    that one first."""
    if not (force or beside_live_primary):
        live = _answering_primary(obj, obj.call("STATUS"))
        if live is not None:
            name, address, their_epoch = live
            fail(f"{obj.target} follows primary {name} at {address}, which answers as primary (epoch "
                 f"{their_epoch}): promoting it would leave two primaries, and what {name} confirmed meanwhile "
                 f"would be lost. Demote or stop {name} first (ha-admin --broker {address} demote), or pass "
                 "--beside-live-primary if it is being fenced")
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
    """Move the available messages of SOURCE (or the oldest --count) to DESTINATION (on the primary). Messages paged
    to disk (--max-memory) go a part at a time, each part whole."""
    moved = 0
    while True:
        body: dict[str, Any] = {"destination": destination}
        if count is not None:
            body["count"] = count - moved
        r = obj.call_type("MOVE", "queue", source, body)
        moved += r.body["moved"]
        if count is None:  # what was there at the first request, not what publishers add meanwhile
            count = moved + r.body["depth"]
        if not r.body.get("more") or not r.body["moved"] or moved >= count:
            break
    click.echo(f"moved {moved} messages from {source} to {destination} ({r.body['depth']} left on {source})")


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


@cli.group()
def journal() -> None:
    """The durable store's journal: check and cut it offline (broker stopped), its figures (docs/durability.md)."""


def _journal_dir(data_dir: Path) -> tuple[Path, Path]:
    """(data dir, journal dir) for --data-dir: the broker's data dir, or its journal directory itself."""
    if not data_dir.exists():
        usage(f"{data_dir}: no such directory (give the broker's --data-dir)")
    if not data_dir.is_dir():
        usage(f"{data_dir}: not a directory (give the broker's --data-dir)")
    if (data_dir / "journal").is_dir():
        return data_dir, data_dir / "journal"
    if any(data_dir.glob("*.jnl")):
        return data_dir.parent, data_dir
    usage(f"{data_dir} holds no journal ({data_dir / 'journal'} does not exist): give the broker's --data-dir")


DATA_DIR = click.Path(path_type=Path)


@journal.command("check")
@click.option("--data-dir", type=DATA_DIR, required=True, help="the broker's --data-dir")
@click.option("--json", "as_json", is_flag=True, help="one JSON document instead of text")
def journal_check(data_dir: Path, as_json: bool) -> None:
    """Replay the journal as the broker would and report what it holds: each segment, the durable queues with
    their messages, exchanges, bindings, the HA standing, and the verdict. Read-only. Exit codes: 0 clean, 3 a
    torn tail (the broker cuts it at start: both start), 4 damaged, 5 a newer format, 6 a file cannot be read
    (the broker refuses to start), 2 a wrong directory."""
    from broker.store import tools

    base, jdir = _journal_dir(data_dir)
    ins = tools.inspect(jdir)
    doc = tools.report(ins, tools.plan_cut(ins.segments, ins.problem))
    held, _ = tools.holders(base, jdir)
    if held:
        doc["running"] = held
    if as_json:
        click.echo(json.dumps(doc, sort_keys=True))
    else:
        if held:
            click.echo(f"note: a broker is running on this journal ({'; '.join(held)}): its last segment may be "
                       "in the middle of a write", err=True)
        click.echo("\n".join(tools.check_lines(doc, str(data_dir))))
    sys.exit(tools.EXIT_CODE[ins.verdict])


@journal.command("stats")
@click.option("--data-dir", type=DATA_DIR, default=None,
              help="read the files instead of asking the broker (works with the broker stopped)")
@click.option("--json", "as_json", is_flag=True, help="one JSON object instead of text")
@click.pass_obj
def journal_stats(obj: Ctx, data_dir: Path | None, as_json: bool) -> None:
    """The journal's figures. By default asked of the running broker (--broker or --socket): segments on disk,
    the segment being written, durable queues, bytes written and commits (one write + fdatasync each) since it
    started, and whether writes fail. With --data-dir: from the files (disk bytes, live messages and bytes)."""
    if data_dir is not None:
        from broker.store import tools

        _, jdir = _journal_dir(data_dir)
        ins = tools.inspect(jdir)
        doc = tools.report(ins)
        out = {k: doc[k] for k in ("journal", "verdict", "disk_bytes", "messages", "bytes")}
        out["segments"] = len(doc["segments"])
        out["durable-queues"] = len(doc["queues"])
        if as_json:
            click.echo(json.dumps(out, sort_keys=True))
            return
        share = f" ({100 * out['bytes'] / out['disk_bytes']:.0f}% of the disk it takes)" if out["disk_bytes"] else ""
        click.echo(f"journal {out['journal']} (from the files)\n"
                   f"  segments        {out['segments']}\n"
                   f"  disk bytes      {out['disk_bytes']:,}\n"
                   f"  durable queues  {out['durable-queues']}\n"
                   f"  live messages   {out['messages']:,}, {out['bytes']:,} bytes{share}\n"
                   f"  verdict         {out['verdict']} (details: ha-admin journal check --data-dir {data_dir})")
        return
    r = obj.request("READ", "broker", "broker")
    if not r.ok:
        fail(f"read broker refused by {obj.target}: {r.status} {r.description}")
    body = r.body if isinstance(r.body, dict) else {}
    j = body.get("journal")
    if not isinstance(j, dict):
        fail(f"{obj.target} keeps no journal (started without --data-dir, or with --no-journal)")
    from broker.store.journal import segment_name

    j = {"broker": body.get("name"), "address": body.get("address"), **j}
    if as_json:
        click.echo(json.dumps(j, sort_keys=True))
        return
    state = (f"FAILED: {j['failed']} (durable messages are refused)" if j.get("failed")
             else f"STALLED: {j['stalled']}" if j.get("stalled")
             else f"DISK LOW: {j['low-disk']}" if j.get("low-disk") else "writable")
    click.echo(f"journal {j.get('directory')} of {j['broker']} ({obj.target})\n"
               f"  segments        {j.get('segments')} (writing {segment_name(int(j.get('segment') or 0))})\n"
               f"  durable queues  {j.get('durable-queues')}\n"
               f"  written         {j.get('written', 0):,} bytes since start\n"
               f"  commits         {j.get('commits', 0):,} since start (one write and one fdatasync each)\n"
               f"  state           {state}")
    if j.get("disk-free", -1) >= 0:  # watched with --min-disk-free
        click.echo(f"  disk free       {j['disk-free']:,} bytes (--min-disk-free {j.get('min-disk-free', 0):,})")
    for name, why in sorted((j.get("backups-low-disk") or {}).items()):  # a primary refuses durable messages
        click.echo(f"  backup {name} DISK LOW: {why} (durable messages are refused)")


@journal.command("cut")
@click.option("--data-dir", type=DATA_DIR, required=True, help="the broker's --data-dir")
@click.option("--yes", is_flag=True, help="cut without asking")
def journal_cut(data_dir: Path, yes: bool) -> None:
    """Cut a damaged journal at its last good record, so that the broker starts with everything before the
    damage. Nothing is deleted: the damaged segment (whole) and every later segment go to
    JOURNAL/cut-<UTC time>/. Refused while a broker holds the journal. Exit 0 when the journal is (now) one the
    broker starts with (clean, or a torn tail it cuts itself), 1 when refused (a broker holds it) or declined,
    5 or 6 (as check) for a newer format or an unreadable file, which a cut does not touch, 2 for a wrong
    directory."""
    from broker import datadir
    from broker.store import tools

    base, jdir = _journal_dir(data_dir)
    try:  # held until ha-admin exits: no broker (of this release) starts on the journal during the cut
        datadir.lock_data_dir(base)
    except datadir.DataDirInUse as e:
        fail(f"refusing to cut: a broker holds {jdir} (pid {e.holder} holds {base / datadir.LOCK_FILE}); stop it "
             "first")
    except OSError:
        pass  # no lock file to be made here: the checks below still stand

    def refuse_if_held() -> None:
        held, notes = tools.holders(base, jdir)
        for n in notes:
            click.echo(f"note: {n}", err=True)
        if held:
            fail(f"refusing to cut: a broker holds {jdir} ({'; '.join(held)}); stop it first")

    refuse_if_held()
    ins = tools.inspect(jdir)
    p = ins.problem
    if ins.verdict is tools.Verdict.CLEAN:
        click.echo(f"nothing to cut: {jdir} is clean")
        return
    if ins.verdict is tools.Verdict.TORN and p is not None:
        click.echo(f"nothing to cut: only a torn tail ({p.bytes:,} bytes at {p.file} byte {p.offset:,}), which the "
                   "broker cuts itself at start")
        return
    plan = tools.plan_cut(ins.segments, p)
    if plan is None:
        click.echo(f"ha-admin: refusing to cut: {tools.describe_problem(tools.report(ins), str(data_dir))}", err=True)
        sys.exit(tools.EXIT_CODE[ins.verdict])
    doc = tools.report(ins, plan)
    click.echo(f"damage: {plan.file} at byte {plan.at:,}: {plan.reason}")
    what = "the whole segment (its header is bad)" if plan.at == 0 else f"from byte {plan.at:,} to its end"
    click.echo(f"cut:    {plan.file} {what}: {plan.cut_bytes:,} bytes")
    if plan.moved:
        click.echo(f"        and the later segments {', '.join(plan.moved)}: {plan.moved_bytes:,} bytes")
    click.echo(f"lost:   {plan.lost_bytes:,} bytes: {tools.describe_lost(plan.lost_kinds)} (messages published "
               "after the damage are lost; messages consumed after it come back)")
    click.echo(f"kept:   {tools.plural(doc['messages'], 'message')} ({doc['bytes']:,} bytes) on "
               f"{tools.plural(len(doc['queues']), 'durable queue')}; HA standing "
               f"{tools.describe_standing(doc['standing'])}")
    if not yes:
        click.confirm("Cut the journal here? (what is cut is moved aside, not deleted)", abort=True, err=True)
        refuse_if_held()
    moved_to = tools.apply_cut(jdir, plan, time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()))
    click.echo(f"cut {plan.file} at byte {plan.at:,}; set aside in {moved_to}")
    after = tools.inspect(jdir)
    if after.verdict is not tools.Verdict.CLEAN:
        fail(f"after the cut: {tools.describe_problem(tools.report(after), str(data_dir))}")
    click.echo("the journal is clean: start the broker")


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

    loose = [kv for kv in param if "=" not in kv]
    if loose:
        usage(f"--param: expected KEY=VALUE, got {loose[0]!r}")
    try:
        extra = dict(kv.split("=", 1) for kv in param)
        setup = setup_from_options(vip, brokers_url, public_url=public_url, port=port, data_dir=data_dir,
                                   bindir=bindir, nic=nic, cidr_netmask=cidr_netmask, extra_params=extra)
    except ValueError as e:
        usage(str(e))  # every one of them is how the command line was given
    sys.exit(1 if run_setup(setup_commands(setup), dry_run, click.echo) else 0)
