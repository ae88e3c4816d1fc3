"""Unit tests of the durable-store parts of the bench (issue 11): verdicts, the fsync and recovery arithmetic, the
memory bound, the durable targets' wiring. Pure: no broker is started."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from bench import cli, fsync, membound, recovery, report
from bench.phases import PhaseSpec
from bench.scenarios import DURABLE, SCENARIOS

FSYNC = {"p50_us": 200.0, "p99_us": 400.0, "samples": 100, "size": 256, "filesystem": "/dev/vda ext4 on /",
         "error": None, "append_p50_us": 300.0, "append_p99_us": 900.0}


def _summary(**figures: float) -> dict[str, dict[str, dict[str, float]]]:
    """'target__phase__key' keyword figures -> a summary as report.summarize gives it."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for name, v in figures.items():
        target, phase, key = name.split("__")
        out.setdefault(target.replace("_", "-"), {}).setdefault(phase, {})[key.replace("_p50", ".p50")] = v
    return out


def _by_goal(vs: list[report.Verdict]) -> dict[str, report.Verdict]:
    return {v.goal: v for v in vs}


def _recovery(messages: int, seconds: float, errors: list[str] | None = None) -> dict[str, Any]:
    return {"target": "ours-durable", "messages": messages, "fill_rate": 30000.0, "journal_seconds": seconds,
            "journal_messages": messages, "journal_bytes": 150 * 2**20, "journal_segments": 3,
            "answer_seconds": seconds + 0.8, "depth_after": messages, "errors": errors or []}


def _memory(messages: int, peak_mib: float, wanted: int | None = None, errors: list[str] | None = None
            ) -> dict[str, Any]:
    return {"target": "ours-durable", "messages": messages, "wanted": wanted or messages, "size": 128,
            "bound": 256 * 2**20, "allowance": 64 * 2**20, "baseline_rss": 50 * 2**20, "peak_rss": int(peak_mib * 2**20),
            "final_rss": int(peak_mib * 2**20), "fill_rate": 20000.0, "other_outcomes": 0, "depth_after": messages,
            "errors": errors or []}


def test_durable_publish_goal_is_the_durable_replicated_target_over_its_non_durable_self() -> None:
    s = _summary(ours_replicated_1_durable__publish__rate=40_000.0, ours_replicated_1__publish__rate=50_000.0)
    v = report.durable_verdicts(s, FSYNC)[0]
    assert v.status == "met"
    assert "ours-replicated-1-durable 40,000 vs ours-replicated-1 50,000 msg/s -> 0.80x (>= 0.8x)" in v.detail
    s["ours-replicated-1-durable"]["publish"]["rate"] = 39_900.0
    assert report.durable_verdicts(s, FSYNC)[0].status == "NOT met"


def test_durable_sync_goal_adds_half_a_millisecond_to_the_measured_fsync() -> None:
    s = _summary(ours_durable__latency__latency_ms_p50=0.7, ours_replicated_1_durable__latency__latency_ms_p50=0.71)
    got = _by_goal(report.durable_verdicts(s, FSYNC))
    assert got["ours-durable sync p50 <= fsync p50 + 0.5 ms"].status == "met"
    assert got["ours-durable sync p50 <= fsync p50 + 0.5 ms"].detail == "0.700 ms vs 0.200 + 0.5 = 0.700 ms"
    assert got["ours-replicated-1-durable sync p50 <= fsync p50 + 0.5 ms"].status == "NOT met"
    assert "ours-replicated-2-durable sync p50 <= fsync p50 + 0.5 ms" not in got  # not run: no line


def test_durable_sync_goal_without_the_fsync_figure_is_not_measured() -> None:
    s = _summary(ours_durable__latency__latency_ms_p50=0.3)
    got = _by_goal(report.durable_verdicts(s, {**FSYNC, "p50_us": math.nan}))
    assert got["ours-durable sync p50 <= fsync p50 + 0.5 ms"].status == "not measured"
    none = _by_goal(report.durable_verdicts({}, FSYNC))
    assert none["ours-durable sync p50 <= fsync p50 + 0.5 ms"].status == "not measured"


def test_durable_e2e_goal_compares_with_the_quorum_cluster_sent_durable_messages() -> None:
    s = _summary(ours_replicated_2_durable__e2e__rate=15_000.0, rabbit_quorum_3_durable__e2e__rate=10_000.0,
                 rabbit_quorum_3__e2e__rate=1.0)  # the non-durable cluster is not the reference
    v = _by_goal(report.durable_verdicts(s, FSYNC))[
        "durable, primary + 2 backups, e2e >= 1.5x rabbit-quorum-3 (durable messages)"]
    assert v.status == "met" and "-> 1.50x" in v.detail


def test_recovery_goal_needs_a_million_within_five_seconds_and_no_errors() -> None:
    assert report.recovery_verdicts([_recovery(100_000, 0.5)])[0].status == "not measured"
    assert "ours-durable 100,000 in 0.50 s" in report.recovery_verdicts([_recovery(100_000, 0.5)])[0].detail
    assert report.recovery_verdicts([_recovery(1_000_000, 5.0)])[0].status == "met"
    assert report.recovery_verdicts([_recovery(1_000_000, 5.01)])[0].status == "NOT met"
    bad = report.recovery_verdicts([_recovery(1_000_000, 2.0, ["depth after recovery 999000"])])[0]
    assert bad.status == "NOT met" and "depth after recovery 999000" in bad.detail
    assert "process start to management answer 2.80 s" in bad.detail


def test_memory_goal_is_peak_rss_within_bound_plus_baseline_plus_allowance_at_ten_million() -> None:
    limit_mib = 256 + 50 + 64
    ok = report.memory_verdicts([_memory(10_000_000, limit_mib)])[0]
    assert ok.status == "met" and f"= {limit_mib} MiB" in ok.detail
    assert report.memory_verdicts([_memory(10_000_000, limit_mib + 1)])[0].status == "NOT met"


def test_memory_goal_not_met_when_messages_were_refused() -> None:
    v = report.memory_verdicts([_memory(9_000_000, 200, wanted=10_000_000)])[0]
    assert v.status == "NOT met" and "9,000,000 of 10,000,000 queued" in v.detail


def test_a_smaller_memory_fill_is_reported_but_not_a_verdict_on_the_goal() -> None:
    v = report.memory_verdicts([_memory(2_000_000, 200)])[0]
    assert v.status == "not measured" and v.detail.startswith("only 2,000,000 asked for (bounded there)")
    assert report.memory_verdicts([])[0].status == "not measured"


def test_durable_section_appears_only_when_something_durable_ran() -> None:
    runs = [{"target": "ours-replicated-1", "phase": "publish", "rate": 50_000.0, "broker_us_per_msg": 17.0,
             "latency_ms": {}, "messages": 1000}]
    kinds = {"ours-replicated-1": "understudy", "ours-replicated-1-durable": "understudy"}
    assert "durable store" not in report.markdown(runs, ["ours-replicated-1"], kinds, fsync=FSYNC)
    runs.append({**runs[0], "target": "ours-replicated-1-durable", "rate": 45_000.0, "broker_us_per_msg": 30.0})
    md = report.markdown(runs, ["ours-replicated-1", "ours-replicated-1-durable"], kinds, fsync=FSYNC,
                         recoveries=[_recovery(1_000_000, 3.0)], memories=[_memory(10_000_000, 300)])
    row = next(line for line in md.splitlines() if line.startswith("| confirmed publish, msg/s | 45,000"))
    assert row.endswith("| 0.90 |")  # durable / non-durable
    assert "write + fdatasync of 256-byte writes into a zero-filled file (as the journal's segments) p50 200 µs" in md
    assert "appending to a file that grows: p50 300 µs, p99 900 µs" in md
    assert "durable confirmed publish >= 0.8x non-durable, 1 backup: **met**" in md
    assert "ours-durable: recovery of 1,000,000 durable messages <= 5 s: **met**" in md
    assert "| ours-durable | 10000000 | 256 | 50.0 | 64.0 | 370 | 300 |" in md


def test_a_recovery_only_run_still_prints_its_table_and_verdicts() -> None:
    md = report.markdown([], ["ours-durable"], {"ours-durable": "understudy"}, fsync=FSYNC,
                         recoveries=[_recovery(1_000_000, 6.0)])
    assert "| ours-durable | 1000000 |" in md
    assert "recovery of 1,000,000 durable messages <= 5 s: **NOT met**" in md


def test_durable_pairs_match_each_durable_target_with_its_counterpart_when_it_ran() -> None:
    assert report.durable_pairs(["ours-replicated-1", "ours-replicated-1-durable", "ours-durable"]) == [
        ("ours-replicated-1-durable", "ours-replicated-1")]


def test_recovered_event_fields_with_missing_values() -> None:
    ev = {"event": "journal.recovered", "seconds": 1.25, "messages": 1000, "bytes": 4096, "segments": 2}
    assert recovery.recovered_fields(ev) == (1.25, 1000, 4096, 2)
    s, m, b, g = recovery.recovered_fields({"seconds": True})
    assert math.isnan(s) and (m, b, g) == (-1, -1, -1)


def test_fsync_summary_and_mount_lookup() -> None:
    r = fsync.summarize([100.0, 300.0, 200.0], "/x/f", 256, "dev ext4 on /")
    assert (r["p50_us"], r["p99_us"], r["mean_us"], r["samples"]) == (200.0, 300.0, 200.0, 3)
    assert math.isnan(fsync.summarize([], "/x/f", 256, "?")["p50_us"])
    mounts = "/dev/vda / ext4 rw 0 0\ntmpfs /tmp tmpfs rw 0 0\ntmpfs /tmpx tmpfs rw 0 0\n"
    assert fsync.mount_of("/tmp/bench/f", mounts) == "tmpfs tmpfs on /tmp"
    assert fsync.mount_of("/tmpdir/f", mounts) == "/dev/vda ext4 on /"


def test_fsync_measure_on_a_real_file_leaves_nothing_behind(tmp_path: Path) -> None:
    r = fsync.measure(tmp_path, count=20, size=64)
    assert r["error"] is None and r["samples"] == 20 and r["p50_us"] > 0 and r["append_p50_us"] > 0
    assert set(r["concurrent_p50_us"]) == {"2", "3"} and all(v > 0 for v in r["concurrent_p50_us"].values())
    assert "; 2 writers at once: p50" in report.fsync_line(r)
    assert list(tmp_path.iterdir()) == []


def test_thinned_rss_samples_keep_the_peak_and_the_last() -> None:
    samples = [(float(i), 100 + (5000 if i == 777 else i % 7)) for i in range(10_000)]
    out = membound.thin(samples, keep=50)
    assert len(out) <= 52 and (777.0, 5100) in out and out[-1] == samples[-1]
    assert membound.thin(samples[:10], keep=50) == samples[:10]


def test_durable_targets_ask_for_durable_queues_and_messages() -> None:
    for name in ("ours-durable", "ours-replicated-1-durable", "ours-replicated-2-durable", "rabbit-quorum-3-durable"):
        t = SCENARIOS[name]()
        assert t.name == name and t.durable_messages
    assert not SCENARIOS["ours-replicated-1"]().durable_messages
    spec = PhaseSpec("publish", 2, 0, 100, None, 200, 200, 128, False)
    assert cli.for_target(spec, SCENARIOS["ours-durable"]()).durable
    assert not cli.for_target(spec, SCENARIOS["ours"]()).durable


def test_durable_preset_runs_the_durable_goals_targets_and_phases() -> None:
    a = cli.parse_args(["--preset", "durable"])
    assert a.targets.split(",") == DURABLE and "ours-replicated-1" in DURABLE
    assert a.phases == "publish,e2e,latency,recovery,memory"
    assert (a.recovery_messages, a.memory_messages, a.max_memory) == (1_000_000, 10_000_000, "256M")
    assert "memory" not in cli.parse_args([]).phases.split(",")
    assert cli.parse_args(["--preset", "durable", "--phases", "memory", "--memory-messages", "5"]).memory_messages == 5


def test_a_bad_max_memory_is_refused_with_the_reason(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.parse_args(["--max-memory", "lots"])
    assert "--max-memory: 'lots' is not a size" in capsys.readouterr().err


def test_a_durable_only_run_says_in_one_line_that_no_message_path_goal_was_measured() -> None:
    runs = [{"target": "ours-durable", "phase": "publish", "rate": 30_000.0, "broker_us_per_msg": 20.0,
             "latency_ms": {}, "messages": 1000}]
    md = report.markdown(runs, ["ours-durable"], {"ours-durable": "understudy"}, fsync=FSYNC)
    assert "Goal verdicts (Message path v2): none of their figures were measured in this run." in md
    assert "ours e2e throughput >= 2x rabbit-classic" not in md
    assert "Goal verdicts, durable store" in md
