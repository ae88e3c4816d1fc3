"""`understudy-cluster`: a primary and backups on this machine, with an embedded manager.

The manager is the simplest external coordinator: it promotes the first broker of a brand-new cluster, watches the
primary, and when it dies promotes the most current *ready* backup (highest epoch, then position), then restarts the
dead broker as a backup. After a whole-cluster outage (every broker back from its journal, all `joining`) it promotes
the broker with the newest store by the rule of `ha.core.restart` (the one the Pacemaker agent applies); a broker
with an older store joins it as a backup and catches up. It needs no Pacemaker and no ZooKeeper; it is for
development and demos on one host.

A primary whose process lives but does not answer (SIGSTOPped, hung) is fenced before anyone else is promoted: after
`FENCE_AFTER` seconds without an answer the manager SIGKILLs it (it owns the processes: the one-host equivalent of
Pacemaker's STONITH), then promotes and restarts it as a backup. Promoting beside it would leave two primaries when
it resumes, and the old one, whose backups had left it, would confirm what nobody else holds.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click
from rich.console import Console

from broker.client import ManagementClient, ManagementError
from broker.datadir import data_dir_problem
from broker.store import records as R
from broker.store import tools
from broker.store.journal import segment_name, segment_numbers
from ha import protocol as P
from ha.core.epoch import Rank, best_candidate
from ha.core.restart import ReadyView, RestartAction, Standing, decide_restart, dropped_by
from ha.status_cli import collect, render

BIN = Path(sys.executable).parent
RESTART_WAIT = 30.0  # seconds a whole-cluster restart waits for brokers that do not come back (docs: ha.core.restart)
# A primary that lost every backup (say stopped, then resumed after they left it) would otherwise confirm alone what
# is lost if another broker takes over (docs/replication.md "--ha-min-ready-backups"); the chaos run found it.
MIN_READY_BACKUPS = 1
FENCE_AFTER = 5.0  # seconds a primary that lives may go without answering STATUS before it is killed (fenced)
REFUSED_EXIT = 2  # ha-broker's exit code for a configuration or journal it will not start with (docs/broker.md)
REFUSED_RETRY = 30.0  # seconds between starts of a broker that refused to (it will again until someone mends it)


@dataclass
class Member:
    name: str
    port: int
    data_dir: Path
    args: list[str]
    env: dict[str, str] = field(default_factory=dict)  # e.g. the replication password (not on the command line)
    proc: subprocess.Popen[bytes] | None = None
    status: dict[str, Any] | None = field(default=None)
    answered: dict[str, Any] | None = None  # the last STATUS this process answered (None: none since its start)
    silent_since: float | None = None  # when it last stopped answering while alive
    retry_at: float | None = None  # it refused to start: when to try again
    _view_key: tuple[int, int, int] | None = None  # (segment, size, mtime) of the journal `_view` was read from
    _view: ReadyView | None = None

    @property
    def refused(self) -> bool:
        """Dead with the exit code of a broker that will not start as it is (a bad flag, a damaged journal)."""
        return self.proc is not None and self.proc.poll() == REFUSED_EXIT

    def journal_view(self, say: Callable[[str], None]) -> ReadyView | None:
        """The member list this broker's journal holds last (read while it is down; again only once the newest
        segment changed)."""
        directory = self.data_dir / "journal"
        try:
            numbers = segment_numbers(directory)
            st = (directory / segment_name(numbers[-1])).stat() if numbers else None
            key = (numbers[-1], st.st_size, st.st_mtime_ns) if st is not None else None
            if key != self._view_key:
                state = tools.last_state(directory)
                self._view_key, self._view = key, ReadyView.from_json(state.get("view") if state else None)
        except (OSError, R.JournalError) as e:
            say(f"cannot read the journal of {self.name}: {e}")
            return None
        return self._view

    def last_words(self) -> str:
        """The last line the broker wrote on stderr (its DATA_DIR/broker.log), e.g. why it refused to start."""
        try:
            with open(self.data_dir / "broker.log", "rb") as f:
                f.seek(max(0, f.seek(0, os.SEEK_END) - 4096))
                lines = f.read().decode(errors="replace").strip().splitlines()
        except OSError:
            return "no output"
        return lines[-1].strip() if lines else "no output"

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        self.proc = self._spawn()
        self.answered = self.silent_since = None  # a broker (re)starts as a backup, whatever it was before

    def _spawn(self) -> subprocess.Popen[bytes]:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.data_dir / "broker.log", "ab")  # noqa: SIM115 - the child keeps it
        return subprocess.Popen(
            [str(BIN / "ha-broker"), "--host", "127.0.0.1", "--port", str(self.port), "--name", self.name,
             "--data-dir", str(self.data_dir), "--log-file", str(self.data_dir / "events.log"),
             "--pid-file", str(self.data_dir / "broker.pid"), *self.args],
            stdout=log, stderr=log, start_new_session=True, env={**os.environ, **self.env})

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def poll_status(self, timeout: float, now: float | None = None) -> dict[str, Any] | None:
        if not self.alive:
            self.status = None
            return None
        self.status = self._ask(timeout)
        if self.status is not None:
            self.answered, self.silent_since = self.status, None
        elif self.silent_since is None:
            self.silent_since = time.monotonic() if now is None else now
        return self.status

    def _ask(self, timeout: float) -> dict[str, Any] | None:
        try:
            with ManagementClient(self.url, timeout=timeout) as c:
                r = c.request("STATUS", P.MGMT_TYPE)
                return r.body if r.ok else None
        except (ManagementError, OSError):
            return None

    @property
    def silent_primary(self) -> bool:
        """Alive, not answering, and a primary when it last answered: it may still act as one."""
        return (self.alive and self.status is None and self.answered is not None
                and self.answered.get("role") == "primary")

    def kill(self) -> None:
        """SIGKILL and reap (a stopped process dies too): afterwards it cannot confirm anything."""
        if self.alive:
            assert self.proc is not None
            self.proc.kill()
            self.proc.wait()

    def stop(self) -> None:
        if self.alive:
            assert self.proc is not None
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:  # e.g. stopped (SIGSTOP): SIGTERM waits for a SIGCONT
                self.kill()


def held_of(status: dict[str, Any]) -> tuple[int, int]:
    """A ready backup's STATUS: its epoch and the number of the member list of that epoch it holds (0: none)."""
    epoch = int(status["epoch"])
    view = ReadyView.from_json(status.get("ready_view"))
    return epoch, view.seq if view is not None and view.epoch == epoch else 0


def rank_of(status: dict[str, Any]) -> Rank:
    """A ready backup's STATUS as its rank: the member list it holds counts if it is one of its epoch."""
    epoch, seq = held_of(status)
    return Rank(epoch, int(status["position"]), seq)


def standing_of(status: dict[str, Any]) -> Standing:
    """What a `joining` broker's STATUS says of its journal (ha.core.restart)."""
    return Standing(str(status["name"]), int(status["epoch"]), int(status["position"]),
                    int(status.get("ready_epoch") or 0), ReadyView.from_json(status.get("ready_view")))


class Manager:
    def __init__(self, members: list[Member], echo: bool = True, restart_wait: float = RESTART_WAIT,
                 clock: Callable[[], float] = time.monotonic, fence_after: float = FENCE_AFTER,
                 out: Callable[[str], None] = lambda line: click.echo(line, err=True)) -> None:
        self.members = members
        self.echo = echo
        self.out = out  # where `say` writes its lines (stderr; the chaos run's log)
        self.restart_wait = restart_wait
        self.clock = clock
        self.fence_after = fence_after
        self.outage_since: float | None = None  # when it first saw no primary and nobody ready
        self._said: str | None = None

    def say(self, text: str, once: bool = False) -> None:
        """`once`: not again while it stays the last thing said (a waiting cluster says why once, not per turn)."""
        if once and text == self._said:
            return
        self._said = text
        if self.echo:
            self.out(f"[manager] {text}")

    def step(self, timeout: float = 1.0) -> None:
        """One turn: look at every member, promote if there is no primary, restart the dead."""
        for m in self.members:
            m.poll_status(timeout, self.clock())
        primaries = [m for m in self.members if m.status and m.status["role"] == "primary"]
        if primaries:
            self.outage_since = None
            self._demote_stale(primaries)
            self._restart_dead()
            return
        if not self._fenced():
            return
        if not any(m.alive for m in self.members):
            self.say("no broker is running: restarting every broker from its journal")
            self._restart_dead()
            return
        ready = [m for m in self.members if m.status and m.status["state"] == "ready"]
        dropped = self._dropped(ready)
        name = best_candidate((m.name, rank_of(m.status)) for m in ready if m.status and m.name not in dropped)
        if name is not None:
            self._promote(name, {})
            return
        for n, v in sorted(dropped.items()):
            self.say(f"{n} is ready but not promoted: its primary dropped it (member list {v.seq} of epoch {v.epoch}, "
                     f"primary {v.primary}, does not name it): waiting for the brokers that list names", once=True)
        self._restart_dead()  # nobody to promote: a restart from the journals needs every broker's
        answering = [m for m in self.members if m.status]
        if not answering or any(m.status and m.status["state"] != "joining" and m.name not in dropped
                                for m in answering):
            return  # someone still follows (or catches up from) a primary that was there a moment ago
        if self.outage_since is None:
            self.outage_since = self.clock()
        waited_out = self.clock() - self.outage_since >= self.restart_wait
        d = decide_restart([standing_of(m.status) for m in answering if m.status], len(self.members), waited_out)
        if d.action is RestartAction.PROMOTE and d.winner is not None:
            self.say(f"whole-cluster restart: {d.describe()}")
            self._promote(d.winner, {"newest_store": True, "epoch": d.epoch})
        elif d.action is RestartAction.NEW_CLUSTER:
            # Brand-new cluster: nobody was ever primary or ready. The first broker may have adopted an epoch
            # (a primary that crashed before its first journal sync): then only force promotes it from joining.
            first = self.members[0]
            self._promote(first.name, {"force": True} if first.status and first.status["epoch"] else {})
        else:
            self.say(f"no primary: {d.describe()}", once=True)

    def _dropped(self, ready: list[Member]) -> dict[str, ReadyView]:
        """The ready members their primary dropped: a newer member list without them is in the journal of a member
        that does not answer (it went down after the drop, maybe having confirmed messages without them) or in
        the STATUS of one that does (ha.core.restart.dropped_by). Such a member is not promoted: the brokers
        that list names come back first, and the restart rule decides among the journals."""
        if not ready:
            return {}
        views: list[ReadyView] = []
        for m in self.members:
            v = ReadyView.from_json(m.status.get("ready_view")) if m.status else m.journal_view(self.say)
            if v is not None:
                views.append(v)
        out: dict[str, ReadyView] = {}
        for m in ready:
            assert m.status is not None
            v = dropped_by(m.name, held_of(m.status), views)
            if v is not None:
                out[m.name] = v
        return out

    def _demote_stale(self, primaries: list[Member]) -> None:
        """Two primaries (a backup promoted by hand beside the live one): the older epoch steps down, as it would on
        meeting a broker of the newer one (docs/replication.md), and rejoins as a backup."""
        epochs = {m.name: int(m.status["epoch"]) for m in primaries if m.status}
        top = max(epochs.values())
        for m in primaries:
            if epochs[m.name] < top:
                newest = ", ".join(n for n, e in epochs.items() if e == top)
                self.say(f"two primaries: demoting {m.name} (epoch {epochs[m.name]}); {newest} has epoch {top}")
                self._request(m, "DEMOTE", {})

    def _fenced(self) -> bool:
        """No primary answers: False while one that still lives has been silent less than `fence_after` (wait: it
        may answer again); past that, SIGKILL it, so that nobody is promoted beside a primary that may resume."""
        silent = [m for m in self.members if m.silent_primary]
        for m in silent:
            assert m.silent_since is not None
            waited = self.clock() - m.silent_since
            if waited < self.fence_after:
                self.say(f"{m.name} (primary) does not answer: killing it if it still does not after "
                         f"{self.fence_after:g} s", once=True)
                return False
        for m in silent:
            m.kill()
            self.say(f"{m.name} (primary) did not answer for {self.fence_after:g} s: killed it (fenced) before "
                     "promoting another")
        return True

    def _promote(self, name: str, body: dict[str, Any]) -> None:
        self._request(next(m for m in self.members if m.name == name), "PROMOTE", body)

    def _request(self, target: Member, op: str, body: dict[str, Any]) -> None:
        what = {"PROMOTE": "promotion", "DEMOTE": "demotion"}[op]
        try:
            with ManagementClient(target.url, timeout=5) as c:
                r = c.request(op, P.MGMT_TYPE, body=body)
            self.say(f"{op.lower()}d {target.name}: {r.description}" if r.ok
                     else f"{what} of {target.name} refused: {r.description}")
        except ManagementError as e:
            self.say(f"{what} of {target.name} failed: {e}")

    def _restart_dead(self) -> None:
        now = self.clock()
        for m in self.members:
            if m.alive:
                continue
            if m.refused and (m.retry_at is None or now < m.retry_at):
                if m.retry_at is None:  # say why once per attempt, not every turn
                    m.retry_at = now + REFUSED_RETRY
                    self.say(f"{m.name} refused to start (exit code {REFUSED_EXIT}: {m.last_words()}): starting it "
                             f"again every {REFUSED_RETRY:g} s until that is mended")
                continue
            self.say(f"{m.name} is down: restarting it as a backup")
            m.retry_at = None
            m.start()


def make_members(brokers: int, base_port: int, data_dir: Path, heartbeat: float, extra: list[str] | None = None,
                 min_ready: int = MIN_READY_BACKUPS) -> list[Member]:
    """broker1..brokerN on consecutive ports, each with DATA_DIR/brokerN (its journal, event log, pid file).
    Replication is authenticated: the brokers log in to each other as REPLICATION_USER with the password of
    DATA_DIR/replication.secret (made once, mode 0600), so no other connection can act as a backup. A primary
    settles nothing while fewer than `min_ready` backups are ready (at most the other brokers)."""
    ports = [base_port + i for i in range(brokers)]
    url = ",".join(f"127.0.0.1:{p}" for p in ports)
    # Auto-created queues: a demo client can send to any address (see the README's quickstart).
    args = ["--ha-cluster", "--ha-brokers-url", url, "--ha-heartbeat", str(heartbeat), "--ha-public-url", url,
            "--auto-create-queues", "--ha-username", REPLICATION_USER,
            "--ha-min-ready-backups", str(min(min_ready, brokers - 1)), *(extra or [])]
    env = {"UNDERSTUDY_HA_PASSWORD": replication_secret(data_dir)}
    return [Member(f"broker{i + 1}", p, data_dir / f"broker{i + 1}", args, env) for i, p in enumerate(ports)]


REPLICATION_USER = "replicator"


def replication_secret(data_dir: Path) -> str:
    """The cluster's replication password: DATA_DIR/replication.secret, made on the first start (mode 0600)."""
    path = data_dir / "replication.secret"
    data_dir.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return path.read_text().strip()
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_urlsafe(24) + "\n")
    return path.read_text().strip()


@click.command()
@click.option("--brokers", "-n", default=3, show_default=True, type=click.IntRange(min=1),
              help="how many brokers (1 primary + backups)")
@click.option("--base-port", default=5672, show_default=True, type=click.IntRange(min=1, max=65535),
              help="first broker's port; the others follow")
@click.option("--data-dir", type=click.Path(path_type=Path), default=Path(".understudy"), show_default=True)
@click.option("--heartbeat", default=1.0, show_default=True, type=click.FloatRange(min=0, min_open=True, max=600),
              help="HA heartbeat seconds")
@click.option("--status-every", default=10.0, show_default=True, type=click.FloatRange(min=0),
              help="print ha-status every SECONDS (0: never)")
@click.option("--fence-after", default=FENCE_AFTER, show_default=True, type=click.FloatRange(min=0.5),
              help="kill a primary that lives but has not answered for SECONDS, then promote a backup")
@click.option("--min-ready-backups", default=MIN_READY_BACKUPS, show_default=True, type=click.IntRange(min=0),
              help="the primary confirms nothing while fewer backups are ready (0: confirm alone when none is)")
@click.option("--once", is_flag=True, help="start, wait until every backup is ready, print status, stop")
def main(brokers: int, base_port: int, data_dir: Path, heartbeat: float, status_every: float, fence_after: float,
         min_ready_backups: int, once: bool) -> None:
    """Run a local Understudy cluster on 127.0.0.1 until Ctrl-C."""
    if base_port + brokers - 1 > 65535:
        raise click.BadParameter(f"{brokers} brokers from port {base_port} would need ports above 65535",
                                 param_hint="'--base-port'")
    problem = data_dir_problem(data_dir)
    if problem is not None:
        click.echo(f"understudy-cluster: --data-dir {data_dir}: {problem}", err=True)
        sys.exit(2)
    members = make_members(brokers, base_port, data_dir, heartbeat, min_ready=min_ready_backups)
    url = ",".join(m.url for m in members)
    for m in members:
        m.start()
    mgr = Manager(members, fence_after=fence_after)
    stopping = False

    def stop(*_: Any) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    click.echo(f"Understudy cluster starting: clients connect to {url}", err=True)
    click.echo(f"  event logs: {data_dir}/broker*/events.log;  pids: {data_dir}/broker*/broker.pid;  "
               f"status: ha-status --broker {members[0].url} -w 1", err=True)
    last_status = 0.0
    announced = False
    deadline = time.monotonic() + 60
    try:
        while not stopping:
            mgr.step()
            all_ready = all(m.status and m.status["state"] in ("active", "ready") for m in members)
            if all_ready and not announced:
                announced = True
                click.echo(f"\nREADY: clients use the URL list {url}\n", err=True)
            now = time.monotonic()
            if (all_ready and status_every and now - last_status >= status_every) or (all_ready and once):
                last_status = now
                primary = next((m for m in members if m.status and m.status["role"] == "primary"), members[0])
                try:
                    Console(stderr=True, width=120).print(render(collect(primary.url, False, 5.0, None, None)))
                except ManagementError as e:
                    click.echo(f"ha-status: {e}", err=True)
            if once and (all_ready or now > deadline):
                if not all_ready:
                    click.echo("cluster did not become ready within 60 s", err=True)
                    sys.exit(1)
                break
            time.sleep(0.5)
    finally:
        click.echo("stopping brokers", err=True)
        for m in members:
            m.stop()
