"""The journal's fdatasyncs run in a child process of the broker (broker.store.syncproc): it goes when the broker
goes, however the broker goes, and when it is lost while the broker runs a thread takes over without losing or
holding up any durable message. A sync that hangs is logged and shown, and what waited for it settles when it
returns."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
from pathlib import Path
from typing import Any

from broker.store.journal import INLINE_SYNC_BYTES
from tests.support.amqp import drain, mgmt, send
from tests.support.bulk import number_of
from tests.support.cluster import Cluster
from tests.support.disks import FreezableDisk
from tests.support.procs import BIN, BrokerFactory, BrokerProcess, wait_for


def sync_pid(b: BrokerProcess) -> int:
    started = wait_for(lambda: next((e for e in b.events(since_start=True)
                                     if e["event"] == "journal.syncer.started"), None), what="journal.syncer.started")
    return int(started["pid"])


def status(b: BrokerProcess) -> dict[str, Any]:
    """This broker's row of `ha-status -f json`."""
    r = subprocess.run([str(BIN / "ha-status"), "--broker", b.url, "-f", "json"], capture_output=True, text=True,
                       timeout=30)
    return next(m for m in json.loads(r.stdout)["members"] if m["name"] == b.name)


def gone(pid: int) -> bool:
    """Exited (a zombie not yet reaped by whoever adopted it counts)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


def test_the_sync_process_is_the_brokers_child_and_goes_with_it(brokers: BrokerFactory) -> None:
    b = brokers()
    pid = sync_pid(b)
    assert b.proc is not None
    stat = Path(f"/proc/{pid}/stat").read_text()
    assert int(stat.rsplit(")", 1)[1].split()[1]) == b.proc.pid  # its parent
    assert b"syncproc.py" in Path(f"/proc/{pid}/cmdline").read_bytes()
    with mgmt(b.url) as m:
        m.call("CREATE", "queue", "q", {"arguments": {"durable": True}})
    send(b.url, "q", list(range(100)), durable=True)
    b.signal(signal.SIGKILL)  # the broker alone, as Pacemaker or the OOM killer would: not its process group
    b.proc.wait(10)
    wait_for(lambda: gone(pid), 5, what="the sync process to exit after its broker was killed")
    b.start()
    assert drain(b.url, "q") == list(range(100))
    pid = sync_pid(b)
    os.killpg(b.proc.pid, signal.SIGINT)  # Ctrl-C on the terminal: the broker's group (the sync process has its own)
    assert b.proc.wait(10) == 0
    wait_for(lambda: gone(pid), 5, what="the sync process to exit after its broker stopped")
    assert not [e for e in b.events(since_start=True) if e["event"] == "journal.syncer.lost"]  # it outlived the loop


def test_a_lost_sync_process_is_replaced_by_a_thread_and_nothing_is_lost(brokers: BrokerFactory) -> None:
    b = brokers()
    with mgmt(b.url) as m:
        m.call("CREATE", "queue", "q", {"arguments": {"durable": True}})
    send(b.url, "q", list(range(100)), durable=True)
    pid = sync_pid(b)
    os.kill(pid, signal.SIGKILL)
    # Each of these is a commit too big (> INLINE_SYNC_BYTES) for the loop's own inline sync: only the syncer can
    # settle it, and `send` fails after 10 s without a settlement.
    big = [f"{n}:".ljust(INLINE_SYNC_BYTES + 100, "x") for n in range(100, 300)]
    send(b.url, "q", big, durable=True)
    lost = [e for e in b.events(since_start=True) if e["event"] == "journal.syncer.lost"]
    assert len(lost) == 1 and lost[0]["description"] == "the sync process exited"
    b.kill()
    b.start()
    assert [number_of(x) for x in drain(b.url, "q")] == list(range(300))
    assert sync_pid(b) != pid  # a restart brings a process back


def test_a_hung_sync_is_logged_and_shown_and_the_message_settles_when_it_returns(brokers: BrokerFactory) -> None:
    c = Cluster(brokers, 1, [])
    c.start_with_primary(0)
    b = c[0]
    with mgmt(b.url) as m:
        m.call("CREATE", "queue", "q", {"arguments": {"durable": True}})
    pid = sync_pid(b)
    os.kill(pid, signal.SIGSTOP)  # what a hung disk looks like to the broker: an fdatasync that does not return
    try:
        big = "0:".ljust(INLINE_SYNC_BYTES + 100, "x")  # too big for the loop's inline sync: the process must sync it
        sender = threading.Thread(target=send, args=(b.url, "q", [big]), kwargs={"timeout": 60, "durable": True})
        sender.start()
        shown = wait_for(lambda: status(b)["journal_stalled"], 15, what="ha-status to show the stalled sync")
        assert shown.startswith("no fdatasync has returned for") and f"sync process (pid {pid}) is stopped" in shown
        assert sender.is_alive()  # not settled: it waits for the disk
        text = subprocess.run([str(BIN / "ha-status"), "--broker", b.url], capture_output=True, text=True, timeout=30)
        assert "JOURNAL SYNC STALLED: no fdatasync has returned for" in " ".join(text.stdout.split())
        stats = subprocess.run([str(BIN / "ha-admin"), "--broker", b.url, "journal", "stats"], capture_output=True,
                               text=True, timeout=30)
        assert "STALLED: no fdatasync" in stats.stdout, stats.stdout + stats.stderr
        wait_for(lambda: [e for e in b.events(since_start=True) if e["event"] == "journal.sync.stalled"], 5,
                 what="journal.sync.stalled")
    finally:
        os.kill(pid, signal.SIGCONT)
    sender.join(30)
    assert not sender.is_alive()
    wait_for(lambda: [e for e in b.events(since_start=True) if e["event"] == "journal.sync.resumed"], 5,
             what="journal.sync.resumed")
    assert status(b)["journal_stalled"] is None
    assert [number_of(x) for x in drain(b.url, "q")] == [0]


def test_a_loop_stuck_in_a_journal_write_is_logged_and_the_message_settles_when_it_returns(
        brokers: BrokerFactory, freezable_disk: FreezableDisk) -> None:
    """A hung disk can hold the event loop itself (a write into a frozen or stalled file system, a small commit's
    inline fdatasync): then nothing on the loop can report it, so a watchdog thread does."""
    b = brokers("--journal-segment-bytes", str(4 * 1024 * 1024), start=False)
    b.data_dir = freezable_disk.path / "data"
    b.start()
    with mgmt(b.url) as m:
        m.call("CREATE", "queue", "q", {"arguments": {"durable": True}})
    freezable_disk.freeze()  # the journal's next write blocks until the thaw
    try:
        sender = threading.Thread(target=send, args=(b.url, "q", ["0:x"]), kwargs={"timeout": 60, "durable": True})
        sender.start()
        stalled = wait_for(lambda: next((e for e in b.events(since_start=True) if e["event"] == "journal.sync.stalled"),
                                        None), 15, what="journal.sync.stalled while the loop is stuck")
        assert "the event loop has waited" in stalled["description"] and stalled["seconds"] >= 5
        assert sender.is_alive()  # not settled: it waits for the disk
    finally:
        freezable_disk.thaw()
    sender.join(30)
    assert not sender.is_alive()
    wait_for(lambda: [e for e in b.events(since_start=True) if e["event"] == "journal.sync.resumed"], 5,
             what="journal.sync.resumed")
    assert [number_of(x) for x in drain(b.url, "q")] == [0]


def send_quietly(url: str, bodies: list[str]) -> None:
    """A durable send that may fail (its broker is about to end itself)."""
    with contextlib.suppress(Exception):
        send(url, "q", bodies, timeout=60, durable=True)


def test_with_stall_halt_a_broker_stuck_on_its_disk_ends_itself_and_keeps_what_it_acknowledged(
        brokers: BrokerFactory, freezable_disk: FreezableDisk) -> None:
    """--journal-stall-halt: a broker whose loop is held by its disk ends itself, so that a ready backup can take
    over (under ZooKeeper nothing else would: the session is kept by a thread of its own). Every thread but the
    stuck one ends at once; the process is gone once the disk returns, and what it acknowledged is kept."""
    b = brokers("--journal-segment-bytes", str(4 * 1024 * 1024), "--journal-stall-halt", "3", start=False)
    b.data_dir = freezable_disk.path / "data"
    b.start()
    assert b.proc is not None
    with mgmt(b.url) as m:
        m.call("CREATE", "queue", "q", {"arguments": {"durable": True}})
    send(b.url, "q", [f"{i}:x" for i in range(5)], durable=True)  # acknowledged
    freezable_disk.freeze()
    try:
        threading.Thread(target=send_quietly, args=(b.url, ["5:x"]), daemon=True).start()
        halted = wait_for(lambda: next((e for e in b.events(since_start=True) if e["event"] == "journal.stall.halt"),
                                       None), 20, what="journal.stall.halt")
        assert "the event loop has waited" in halted["description"] and "--journal-stall-halt 3" in halted["description"]
        pid = b.proc.pid
        wait_for(lambda: len(os.listdir(f"/proc/{pid}/task")) <= 1, 5, what="every thread but the stuck one to end")
    finally:
        freezable_disk.thaw()
    assert b.proc.wait(30) == 3
    b.start()
    got = [number_of(x) for x in drain(b.url, "q")]
    assert got in (list(range(5)), list(range(6)))  # the unacknowledged one may or may not have reached the disk


def test_with_stall_halt_a_hung_sync_process_ends_the_broker(brokers: BrokerFactory) -> None:
    b = brokers("--journal-stall-halt", "3")
    assert b.proc is not None
    with mgmt(b.url) as m:
        m.call("CREATE", "queue", "q", {"arguments": {"durable": True}})
    send(b.url, "q", [f"{i}:x" for i in range(5)], durable=True)
    pid = sync_pid(b)
    os.kill(pid, signal.SIGSTOP)
    try:
        big = "5:".ljust(INLINE_SYNC_BYTES + 100, "x")  # too big for the loop's inline sync: the process must sync it
        threading.Thread(target=send_quietly, args=(b.url, [big]), daemon=True).start()
        assert b.proc.wait(20) == 3
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
    halted = next(e for e in b.events(since_start=True) if e["event"] == "journal.stall.halt")
    assert halted["description"].startswith("no fdatasync has returned for")
    wait_for(lambda: gone(pid), 5, what="the sync process to exit after its broker")
    b.start()
    assert [number_of(x) for x in drain(b.url, "q")][:5] == list(range(5))
