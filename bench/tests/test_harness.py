"""Unit tests of the pure parts added with the C load generator: its command line and output lines, the goal
verdicts, the hop and RSS arithmetic. No binary, no broker. Run: .venv/bin/pytest bench/tests"""

from __future__ import annotations

import array
import json
import math
import os
import time
from pathlib import Path

import pytest

from bench import cclient, hop, native, phases, protonc, report, rss
from bench.cli import parse_args
from bench.targets import ClientSpec

RESULT = {"mode": "send", "address": "q", "size": 128, "message_bytes": 133, "durable": False, "presettled": False,
          "window": 200, "credit": 200, "sent": 1000, "accepted": 990, "other_outcomes": 10, "received": 0,
          "unstamped": 0, "started": True, "start": 100.5, "end": 101.0, "last_receive": None, "cpu_seconds": 0.005,
          "utime": 0.002, "stime": 0.003, "max_rss_kb": 4200, "latency": "settle",
          "latency_ms": {"p50": 0.1, "p99": 0.3, "mean": 0.12, "max": 2.0, "samples": 1000}, "error": None}


# --- the C client's command line and output --------------------------------------------------------------------

def test_argv_carries_mode_options_and_plain_credentials() -> None:
    spec = ClientSpec("127.0.0.1:5672", user="guest", password="guest")
    a = cclient.LoadgenArgs("send", "/amq/queue/q", 500, 64, True, window=100, duration=2.5, timeout=30.0,
                            samples_file="/tmp/s.f32")
    cmd = cclient.argv("/x/loadgen", spec, a)
    assert cmd[:2] == ["/x/loadgen", "send"]
    flags = dict(zip(cmd[2::2], cmd[3::2], strict=False))
    assert flags["--url"] == "127.0.0.1:5672" and flags["--address"] == "/amq/queue/q"
    assert (flags["--count"], flags["--size"], flags["--window"], flags["--timeout"]) == ("500", "64", "100", "30")
    assert cmd[cmd.index("--duration") + 1] == "2.5" and "--durable" in cmd
    assert cmd[cmd.index("--user") + 1] == "guest" and cmd[cmd.index("--password") + 1] == "guest"
    assert cmd[cmd.index("--samples-file") + 1] == "/tmp/s.f32"
    assert "--credit" not in cmd and "--rate" not in cmd


def test_argv_of_a_receiver_without_credentials() -> None:
    cmd = cclient.argv("lg", ClientSpec("h:1"), cclient.LoadgenArgs("receive", "q", credit=50, progress_ms=20))
    assert cmd[cmd.index("--credit") + 1] == "50" and cmd[cmd.index("--progress-ms") + 1] == "20"
    assert "--user" not in cmd and "--window" not in cmd and cmd[cmd.index("--count") + 1] == "0"


def test_parse_line_kinds() -> None:
    assert cclient.parse_line("READY\n") == ("ready", None)
    assert cclient.parse_line("PROGRESS 1200 4023.5\n") == ("progress", (1200, 4023.5))
    assert cclient.parse_line(json.dumps(RESULT) + "\n") == ("result", RESULT)
    assert cclient.parse_line("PROGRESS x y") == ("other", "PROGRESS x y")
    assert cclient.parse_line("{not json") == ("other", "{not json")


def test_loop_result_from_the_json_of_a_sender() -> None:
    r = cclient.loop_result(RESULT)
    assert (r.sent, r.accepted, r.other_outcomes, r.received) == (1000, 990, 10, 0)
    assert (r.start, r.end, r.cpu_seconds, r.error) == (100.5, 101.0, 0.005, None)


def test_loop_result_of_a_receiver_ends_at_its_last_receipt_and_keeps_errors() -> None:
    d = dict(RESULT, mode="receive", sent=0, accepted=0, other_outcomes=0, received=700, end=105.0,
             last_receive=103.25, start=None, error="connection closed by the peer: amqp:internal-error")
    r = cclient.loop_result(d, array.array("f", [1.5, 2.0]))
    assert r.received == 700 and r.end == 103.25 and r.start == 0.0
    assert r.error == "connection closed by the peer: amqp:internal-error"
    assert r.latencies == [0.0015, 0.002]


def test_loop_result_of_a_client_that_failed_before_starting() -> None:
    r = cclient.loop_result({"error": "no result from loadgen publisher-1 within 60s: exit status 2"})
    assert (r.sent, r.accepted, r.cpu_seconds) == (0, 0, 0.0) and r.error and "publisher-1" in r.error


def test_read_samples_reads_float32(tmp_path: Path) -> None:
    f = tmp_path / "s.f32"
    f.write_bytes(array.array("f", [0.25, 1.5, 3.0]).tobytes())
    assert list(cclient.read_samples(f)) == [0.25, 1.5, 3.0]
    assert list(cclient.read_samples(tmp_path / "missing")) == []


def test_latency_summary_is_nearest_rank_over_all_clients() -> None:
    merged = array.array("f", [float(v) for v in range(1, 101)])
    s = phases.latency_summary(merged)
    assert (s["p50"], s["p99"], s["mean"], s["samples"]) == (50.0, 99.0, 50.5, 100.0)
    assert phases.latency_summary([]) == {}


def test_per_publisher_splits_the_count() -> None:
    assert phases.per_publisher(20001, 2) == [10001, 10000]
    assert sum(phases.per_publisher(7, 3)) == 7


def test_client_flag_and_presets() -> None:
    a = parse_args(["--client", "python"])
    assert a.client == "python" and a.rss_messages == 100_000 and a.catchup_publisher_rate == 1000.0
    assert parse_args(["--preset", "full"]).rss_messages == 1_000_000
    assert parse_args([]).client is None  # decided at run time: c when it builds
    with pytest.raises(SystemExit):
        parse_args(["--client", "java"])


# --- building ---------------------------------------------------------------------------------------------------

def test_stale_when_missing_or_older_than_a_source(tmp_path: Path) -> None:
    src, out = tmp_path / "a.c", tmp_path / "a"
    src.write_text("int main(void){return 0;}")
    assert native.stale(out, [src])
    out.write_text("binary")
    now = time.time()
    os.utime(src, (now - 10, now - 10))
    os.utime(out, (now, now))
    assert not native.stale(out, [src])
    os.utime(src, (now + 10, now + 10))
    assert native.stale(out, [src])


def test_listening_port_of_the_proton_c_broker() -> None:
    text = ("Failed to set up server certificate: ssl-certs/tserver-certificate.pem, private key: x\n"
            "listening on 40847\n")
    assert protonc.listening_port(text) == 40847
    assert protonc.listening_port("Failed to set up server certificate\n") == 0


# --- hop and RSS arithmetic -------------------------------------------------------------------------------------

def test_hop_is_half_the_median_round_trip() -> None:
    h = hop.summarize([30.0, 10.0, 20.0, 40.0, 1000.0], "python")
    assert h["hop_us"] == 15.0 and h["rtt_us"]["p50"] == 30.0 and h["rtt_us"]["min"] == 10.0
    assert math.isnan(hop.summarize([], "c")["hop_us"])
    d = {"mode": "hop", "samples": 100, "rtt_us": {"p50": 17.5, "p99": 60.0}, "hop_us": 8.75, "error": None}
    assert hop.from_loadgen(d) == {"method": "c", "samples": 100, "hop_us": 8.75,
                                   "rtt_us": {"p50": 17.5, "p99": 60.0}, "error": None}


def test_vmrss_from_proc_status() -> None:
    status = "Name:\tbeam.smp\nVmPeak:\t  999 kB\nVmRSS:\t  123456 kB\nThreads:\t30\n"
    assert rss.parse_vmrss(status) == 123456 * 1024
    assert rss.parse_vmrss("Name:\tzombie\n") == 0


def test_rss_overhead_is_the_largest_role_minus_the_body() -> None:
    per, overhead = rss.per_message({"primary": 10_000_000, "backup-1": 8_000_000},
                                    {"primary": 50_000_000, "backup-1": 30_000_000}, 100_000, 128)
    assert per == {"primary": 400.0, "backup-1": 220.0}
    assert overhead == 400.0 - 128
    _, none = rss.per_message({}, {}, 0, 128)
    assert math.isnan(none)


# --- goal verdicts ----------------------------------------------------------------------------------------------

def _summary(**fig: dict[str, dict[str, float]]) -> dict[str, dict[str, dict[str, float]]]:
    return {k.replace("_", "-"): v for k, v in fig.items()}


FULL = _summary(
    ours={"publish": {"rate": 20000.0, "broker_us_per_msg": 20.0}, "e2e": {"rate": 20000.0, "broker_us_per_msg": 40.0},
          "latency": {"latency_ms.p50": 0.20}, "rss": {"overhead_bytes_per_msg": 250.0}},
    proton_c_broker={"publish": {"broker_us_per_msg": 8.0}, "e2e": {"broker_us_per_msg": 16.0}},
    rabbit_classic={"e2e": {"rate": 10000.0}},
    ours_replicated_1={"publish": {"rate": 18500.0, "broker_us_per_msg": 27.0}, "latency": {"latency_ms.p50": 0.23}},
    ours_replicated_2={"publish": {"rate": 15000.0}, "e2e": {"rate": 9000.0}, "latency": {"latency_ms.p50": 0.24}},
    rabbit_quorum_3={"e2e": {"rate": 5000.0}},
)
HOP = {"hop_us": 10.0}
CATCHUP_1M = {"target": "ours-replicated-1", "messages": 1_000_000, "seconds": 4.2, "startup_seconds": 0.4,
              "publisher_rate_target": 1000.0, "publisher_rate": 999.0, "errors": []}


def _by_goal(vs: list[report.Verdict]) -> dict[str, report.Verdict]:
    return {v.goal: v for v in vs}


def test_every_goal_met_with_its_numbers() -> None:
    vs = _by_goal(report.verdicts(FULL, HOP, [CATCHUP_1M], "c"))
    assert {v.status for v in vs.values()} == {"met"}, [v for v in vs.values() if v.status != "met"]
    assert vs["unreplicated broker CPU/msg <= 3x proton-c-broker (publish)"].detail == \
        "ours 20.0 vs proton-c-broker 8.00 µs/msg -> 2.50x (<= 3x)"
    assert vs["ours e2e throughput >= 2x rabbit-classic"].detail == \
        "ours 20,000 vs rabbit-classic 10,000 msg/s -> 2.00x (>= 2x)"
    assert vs["ours-replicated-1 sync p50 <= ours p50 + 4 one-way loopback hops"].detail == \
        "0.23 ms vs 0.20 + 4 x 10.0 µs = 0.240 ms"
    assert vs["RAM <= payload + 300 B per queued message (ours)"].detail == "250 B over the body per message"
    # no 1.5x line with the C client
    assert not any("Python clients" in g for g in vs)


def test_ratios_on_the_wrong_side_are_not_met() -> None:
    s = json.loads(json.dumps(FULL))
    s["ours"]["e2e"]["rate"] = 19999.0
    s["ours"]["publish"]["broker_us_per_msg"] = 24.1  # 3.01x proton-c
    s["ours-replicated-1"]["publish"]["rate"] = 17999.0  # 0.8999x
    s["ours-replicated-1"]["publish"]["broker_us_per_msg"] = 33.8  # 1.402x of 24.1
    s["ours-replicated-2"]["publish"]["rate"] = 14999.0  # 0.74995x
    s["ours-replicated-2"]["e2e"]["rate"] = 7499.0
    s["ours"]["rss"]["overhead_bytes_per_msg"] = 300.5
    vs = _by_goal(report.verdicts(s, HOP, [], "c"))
    for goal in ("unreplicated broker CPU/msg <= 3x proton-c-broker (publish)",
                 "ours e2e throughput >= 2x rabbit-classic",
                 "ours-replicated-1 confirmed publish >= 0.9x ours",
                 "ours-replicated-1 broker CPU/msg, both brokers, <= 1.4x ours (publish)",
                 "ours-replicated-2 confirmed publish >= 0.75x ours",
                 "ours-replicated-2 e2e >= 1.5x rabbit-quorum-3 e2e",
                 "RAM <= payload + 300 B per queued message (ours)"):
        assert vs[goal].status == "NOT met", goal


def test_e2e_goal_boundary() -> None:
    s = json.loads(json.dumps(FULL))
    s["ours"]["e2e"]["rate"] = 19999.0
    assert _by_goal(report.verdicts(s, HOP, [], "c"))["ours e2e throughput >= 2x rabbit-classic"].status == "NOT met"
    s["ours"]["e2e"]["rate"] = 20000.0
    assert _by_goal(report.verdicts(s, HOP, [], "c"))["ours e2e throughput >= 2x rabbit-classic"].status == "met"


def test_sync_latency_goal_adds_four_hops_of_the_same_run() -> None:
    s = json.loads(json.dumps(FULL))
    goal = "ours-replicated-1 sync p50 <= ours p50 + 4 one-way loopback hops"
    s["ours-replicated-1"]["latency"]["latency_ms.p50"] = 0.24  # 0.20 ms + 4 x 10 µs
    v = _by_goal(report.verdicts(s, HOP, [], "c"))[goal]
    assert v.status == "met" and v.detail == "0.24 ms vs 0.20 + 4 x 10.0 µs = 0.240 ms"
    s["ours-replicated-1"]["latency"]["latency_ms.p50"] = 0.2401
    assert _by_goal(report.verdicts(s, HOP, [], "c"))[goal].status == "NOT met"
    assert _by_goal(report.verdicts(s, {"hop_us": 20.0}, [], "c"))[goal].status == "met"
    assert _by_goal(report.verdicts(s, None, [], "c"))[goal].status == "not measured"


def test_python_clients_add_the_1_5x_sync_goal() -> None:
    s = json.loads(json.dumps(FULL))
    s["ours-replicated-2"]["latency"]["latency_ms.p50"] = 0.31  # 1.55x
    vs = _by_goal(report.verdicts(s, HOP, [], "python"))
    assert vs["ours-replicated-1 sync p50 <= ours p50 + 4 one-way loopback hops"].status == "met"
    assert vs["ours-replicated-1 sync p50 <= 1.5x ours (Python clients)"].status == "met"
    assert vs["ours-replicated-2 sync p50 <= 1.5x ours (Python clients)"].status == "NOT met"


def test_missing_figures_are_not_measured_never_met() -> None:
    vs = report.verdicts({}, None, [], "c")
    assert vs and {v.status for v in vs} == {"not measured"}
    only_ours = _summary(ours=FULL["ours"])
    v = _by_goal(report.verdicts(only_ours, HOP, [], "c"))["ours-replicated-2 confirmed publish >= 0.75x ours"]
    assert v.status == "not measured" and "ours-replicated-2" in v.detail


def test_catchup_goal_needs_1m_with_a_live_publisher_and_no_errors() -> None:
    goal = "catch-up of 1,000,000 queued messages <= 5 s while a publisher runs"
    slow = dict(CATCHUP_1M, target="ours-replicated-2", seconds=5.5)
    failed = dict(CATCHUP_1M, target="ours-replicated-1", errors=["backup exited during catch-up"])
    vs = _by_goal(report.verdicts(FULL, HOP, [CATCHUP_1M, slow], "c"))
    assert vs[f"ours-replicated-1: {goal}"].status == "met"
    assert vs[f"ours-replicated-2: {goal}"].status == "NOT met"
    assert _by_goal(report.verdicts(FULL, HOP, [failed], "c"))[f"ours-replicated-1: {goal}"].status == "NOT met"
    quiet = dict(CATCHUP_1M, publisher_rate_target=0.0)
    v = _by_goal(report.verdicts(FULL, HOP, [quiet], "c"))[goal]
    assert v.status == "not measured" and "without publisher" in v.detail
    small = dict(CATCHUP_1M, messages=100_000)
    assert _by_goal(report.verdicts(FULL, HOP, [small], "c"))[goal].status == "not measured"


def test_verdict_lines_are_markdown_bullets() -> None:
    lines = report.verdict_lines([report.Verdict("g", "NOT met", "1 vs 2")])
    assert lines == ["- g: **NOT met** — 1 vs 2"]


def test_part_table_gives_user_and_system_per_message() -> None:
    runs = [{"target": "ours-durable", "phase": "publish", "messages": 1000,
             "broker_thread_seconds": {"broker": {"loop": [0.01, 0.002], "sync process": [0.0005, 0.001]}}},
            {"target": "ours-durable", "phase": "publish", "messages": 1000,
             "broker_thread_seconds": {"broker": {"loop": [0.012, 0.004], "sync process": [0.0005, 0.001],
                                                  "other threads": [0.0, 0.0]}}}]
    md = report.part_markdown(runs, ["ours-durable"])
    assert "| ours-durable | broker | loop | 11.0 + 3.00 | n/a | n/a |" in md
    assert "| ours-durable | broker | sync process | 0.50 + 1.00 | n/a | n/a |" in md
    assert "other threads" not in md  # no CPU in any phase: no row
    assert report.part_markdown([{"target": "rabbit", "phase": "publish", "messages": 10}], ["rabbit"]) == ""


def test_role_table_gives_each_role_per_message() -> None:
    runs = [{"target": "ours-replicated-1", "phase": "publish", "messages": 1000,
             "broker_cpu_seconds": {"primary": 0.04, "backup-1": 0.01}},
            {"target": "ours-replicated-1", "phase": "rss", "messages": 5, "bytes_per_msg": {}}]
    per = report.role_cpu(runs)
    assert per == {"ours-replicated-1": {"primary": {"publish": 40.0}, "backup-1": {"publish": 10.0}}}
    md = report.role_markdown(runs, ["ours-replicated-1"])
    assert "| ours-replicated-1 | primary | 40.0 | n/a | n/a |" in md
