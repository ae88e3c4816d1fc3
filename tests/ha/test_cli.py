"""The operator commands: ha-status, ha-admin, understudy-cluster."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path

from tests.support.cluster import Cluster, free_port_run, free_ports
from tests.support.procs import BIN, BrokerFactory, wait_for

Make = Callable[..., Cluster]


def run(*cmd: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / cmd[0]), *cmd[1:]], capture_output=True, text=True, timeout=timeout)


def test_ha_status_json_has_stable_fields_and_table_shows_every_member(cluster: Make) -> None:
    c = cluster(3)
    c.start_with_primary(0)
    r = run("ha-status", "--broker", c[2].url, "-f", "json", "--all")
    assert r.returncode == 0, r.stderr
    view = json.loads(r.stdout)
    assert view["brokers_url"] == c.brokers_url and view["epoch"] == 1
    rows = {m["name"]: m for m in view["members"]}
    assert set(rows) == {"b1", "b2", "b3"}
    assert rows["b1"]["role"] == "primary" and rows["b1"]["state"] == "active"
    for b in ("b2", "b3"):
        assert rows[b]["role"] == "backup" and rows[b]["state"] == "ready"
        assert rows[b]["backlog"] == 0 and rows[b]["lag_ms"] == 0.0
        assert rows[b]["epoch"] == 1
    table = run("ha-status", "--broker", c[1].url)
    assert table.returncode == 0
    for name in ("b1", "b2", "b3", "primary", "active", "ready"):
        assert name in table.stdout


def test_ha_admin_errors_are_one_line_with_exit_1(cluster: Make, brokers: BrokerFactory) -> None:
    (dead,) = free_ports(1)
    r = run("ha-admin", "--broker", f"127.0.0.1:{dead}", "--timeout", "2", "ping")
    assert r.returncode == 1 and r.stderr.count("\n") == 1 and "cannot reach" in r.stderr
    plain = brokers(name="plain")  # not an HA broker
    r = run("ha-admin", "--broker", plain.url, "query")
    assert r.returncode == 1 and "not an HA broker" in r.stderr
    r = run("ha-status", "--broker", f"127.0.0.1:{dead}", "--timeout", "2")
    assert r.returncode == 1 and "ha-status:" in r.stderr
    c = cluster(2)
    c.start_with_primary(0)
    r = run("ha-admin", "--broker", c[1].url, "demote")
    assert r.returncode == 1 and "not a primary" in r.stderr
    r = run("ha-admin", "--broker", c[0].url, "replicate", "nosuchqueue")
    assert r.returncode == 1 and "not found" in r.stderr
    q = json.loads(run("ha-admin", "--broker", c[1].url, "query").stdout)
    assert q["role"] == "backup" and q["state"] == "ready" and q["name"] == "b2"


def test_a_watch_or_timeout_that_is_not_a_positive_number_is_a_usage_error() -> None:
    for command, args, flag in [("ha-status", ["--watch", "-1"], "'-w' / '--watch'"),
                                ("ha-status", ["--watch", "0"], "'-w' / '--watch'"),
                                ("ha-status", ["--timeout", "0"], "'--timeout'"),
                                ("ha-admin", ["--timeout", "-2", "ping"], "'--timeout'")]:
        r = run(command, "--broker", "127.0.0.1:1", *args)
        assert r.returncode == 2, (command, args, r.stderr)
        assert f"Error: Invalid value for {flag}" in r.stderr and "Traceback" not in r.stderr


def test_a_bad_broker_address_is_a_usage_error_naming_it() -> None:
    """Not "cannot reach" after a connection attempt (exit 1), nor a silent turn to another address (`-b ::1` went
    to 0.0.0.0:5672, `-b ''` to amqps://localhost:5671)."""
    for command, address, reason in [
        ("ha-admin", "127.0.0.1:notaport", "'127.0.0.1:notaport': port 'notaport' is not a number"),
        ("ha-admin", "127.0.0.1:70000", "'127.0.0.1:70000': port 70000 out of range 1-65535"),
        ("ha-admin", "::1", "'::1': an IPv6 address needs brackets (as [::1]:5672)"),
        ("ha-admin", "", "one broker's host:port, got none: ''"),
        ("ha-admin", "a:1,b:2", "one broker's host:port, got 2: 'a:1,b:2'"),
        ("ha-status", "127.0.0.1:1,b:x", "'b:x': port 'x' is not a number"),
        ("ha-status", "[::1", "'[::1' is not host:port (an IPv6 address as [::1]:5672)"),
    ]:
        r = run(command, "--broker", address, "--timeout", "1", *(["ping"] if command == "ha-admin" else []))
        assert r.returncode == 2, (command, address, r.stderr)
        assert f"Error: Invalid value for '--broker' / '-b': {reason}\n" in r.stderr, r.stderr
    (dead,) = free_ports(1)
    for address in (f"[::1]:{dead}", f"localhost:{dead}"):  # well-formed: tried, and not there
        r = run("ha-admin", "--broker", address, "--timeout", "1", "ping")
        assert r.returncode == 1 and f"ha-admin: cannot reach {address}" in r.stderr, r.stderr
    r = run("ha-status", "--zk-hosts", "127.0.0.1:notaport")  # kazoo's own parsing: a traceback
    assert r.returncode == 2, r.stderr
    assert "Error: Invalid value for '--zk-hosts': '127.0.0.1:notaport': port 'notaport' is not a number" in r.stderr
    r = run("ha-status", "--zk-hosts", "127.0.0.1:2181", "--zk-path", "understudy/x")
    assert r.returncode == 2 and "Invalid value for '--zk-path': 'understudy/x' must start with '/'" in r.stderr
    r = run("ha-status", "--zk-hosts", f"127.0.0.1:{dead}", "--timeout", "1")
    assert (r.returncode, r.stderr) == (1, f"ha-status: ZooKeeper 127.0.0.1:{dead}/understudy/default: cannot reach "
                                           f"ZooKeeper at 127.0.0.1:{dead} within 1 s\n")  # not kazoo's chatter too


def test_understudy_cluster_refuses_bad_values_before_starting_any_broker(tmp_path: Path) -> None:
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    for args, expected in [(["-n", "0"], "Invalid value for '--brokers' / '-n'"),
                           (["--base-port", "65535"], "3 brokers from port 65535 would need ports above 65535"),
                           (["--heartbeat", "0"], "Invalid value for '--heartbeat'"),
                           (["--data-dir", str(a_file)], f"understudy-cluster: --data-dir {a_file}: not a directory")]:
        r = run("understudy-cluster", "--once", *args)
        assert r.returncode == 2, (args, r.stderr)
        assert expected in r.stderr and "Traceback" not in r.stderr and "starting" not in r.stderr


def test_demote_returns_primary_to_backup_and_another_can_take_over(cluster: Make) -> None:
    c = cluster(2)
    c.start_with_primary(0)
    assert run("ha-admin", "--broker", c[0].url, "demote").returncode == 0
    c.wait_state(0, "joining", "catchup", "ready")
    c.promote(1)
    c.wait_state(1, "active")
    c.wait_state(0, "ready")
    assert Cluster.status(c[0])["epoch"] == 2


def test_promoting_a_backup_whose_primary_answers_is_refused_unless_it_is_gone_or_asked_for_by_name(
        cluster: Make) -> None:
    c = cluster(3)
    c.start_with_primary(0)
    r = run("ha-admin", "--broker", c[1].url, "promote")
    assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
    assert "follows primary b1" in r.stderr and "two primaries" in r.stderr and "demote" in r.stderr
    assert Cluster.status(c[1])["state"] == "ready" and Cluster.status(c[0])["state"] == "active"
    c[0].kill()  # at once: b2 may still name it, but it no longer answers
    r = run("ha-admin", "--broker", c[1].url, "promote")
    assert r.returncode == 0, r.stderr
    c.wait_state(1, "active")
    wait_for(lambda: Cluster.status(c[2])["primary"] == "b2" and Cluster.status(c[2])["state"] == "ready", 20, 0.1,
             what="b3 ready with b2")
    r = run("ha-admin", "--broker", c[2].url, "promote", "--beside-live-primary")
    assert r.returncode == 0, r.stderr
    assert Cluster.status(c[2])["epoch"] == 3


def test_understudy_cluster_starts_a_working_local_cluster(tmp_path: Path) -> None:
    base = free_port_run(3)
    r = run("understudy-cluster", "--data-dir", str(tmp_path), "--base-port", str(base), "--once", timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "READY: clients use the URL list" in r.stderr
    assert "primary" in r.stderr and r.stderr.count("ready") >= 2
    assert (tmp_path / "broker1" / "events.log").exists()


def test_pacemaker_setup_dry_run_prints_the_pcs_commands() -> None:
    r = run("ha-admin", "pacemaker-setup", "--vip", "10.0.0.100", "--brokers-url",
            "10.0.0.1:5672,10.0.0.2:5672,10.0.0.3:5672", "--dry-run")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert all(line.startswith("(dry run) ") for line in lines)
    text = r.stdout
    assert "ocf:understudy:understudy" in text and "promotable" in text and "ocf:heartbeat:IPaddr2" in text
    assert "colocation" in text and "order" in text and "cib-push" in text
    for args, line in [(["--vip", "notanip"], "--vip: 'notanip' is not an IPv4 or IPv6 address"),
                       (["--vip", "10.0.0.100", "--param", "noequals"], "--param: expected KEY=VALUE, got 'noequals'")]:
        r = run("ha-admin", "pacemaker-setup", "--brokers-url", "10.0.0.1:5672,10.0.0.2:5672", *args, "--dry-run")
        assert (r.returncode, r.stdout, r.stderr) == (2, "", f"ha-admin: {line}\n")  # usage errors, no command run


def test_zookeeper_timing_rules_are_checked_at_start_up() -> None:
    base = ["ha-broker", "--ha-cluster", "--ha-brokers-url", "127.0.0.1:1", "--ha-coordinator", "zookeeper",
            "--zk-hosts", "127.0.0.1:2181"]
    bad = run(*base, "--zk-session-timeout", "1", "--ha-heartbeat", "2", "--validate-config")
    assert bad.returncode == 2
    assert "--zk-session-timeout" in bad.stderr or "--ha-heartbeat" in bad.stderr
    good = run(*base, "--zk-session-timeout", "4", "--ha-heartbeat", "1", "--validate-config")
    assert good.returncode == 0, good.stderr
    missing = run("ha-broker", "--ha-cluster", "--ha-brokers-url", "127.0.0.1:1", "--ha-coordinator", "zookeeper",
                  "--validate-config")
    assert missing.returncode == 2 and "--zk-hosts" in missing.stderr
