"""Unit tests of the replication comparison and the catch-up phase's pure parts. Run: .venv/bin/pytest bench/tests"""

from __future__ import annotations

import math

import pytest

from bench import report
from bench.catchup import timeline
from bench.cli import parse_args

KINDS = {"ours": "understudy", "ours-replicated-1": "understudy", "ours-replicated-2": "understudy",
         "rabbit-classic": "rabbitmq"}


def _row(target: str, phase: str, rate: float = math.nan, p50: float = math.nan,
         cpu: float = 50.0) -> dict[str, object]:
    lat = {"p50": p50, "p99": p50 * 4} if not math.isnan(p50) else {}
    return {"target": target, "phase": phase, "rate": rate, "broker_us_per_msg": cpu, "latency_ms": lat}


def _runs(pub: dict[str, float], p50: dict[str, float]) -> list[dict[str, object]]:
    out = [_row(t, "publish", rate=v) for t, v in pub.items()]
    return out + [_row(t, "latency", p50=v) for t, v in p50.items()]


def _md(pub: dict[str, float], p50: dict[str, float]) -> str:
    runs = _runs(pub, p50)
    keys = [m.key for m in report.REPLICATION_METRICS]
    return report.replication_markdown(report.summarize(runs, keys), list(pub), KINDS)


def test_replication_ratios_are_replicated_over_unreplicated() -> None:
    md = _md({"ours": 1000.0, "ours-replicated-1": 850.0, "ours-replicated-2": 500.0},
             {"ours": 1.0, "ours-replicated-1": 1.4, "ours-replicated-2": 3.0})
    pub = next(line for line in md.splitlines() if line.startswith("| confirmed publish"))
    assert [c.strip() for c in pub.split("|")[1:-1]] == ["confirmed publish, msg/s", "1,000", "850", "500", "0.85",
                                                         "0.50"]
    p50 = next(line for line in md.splitlines() if line.startswith("| sync publish p50"))
    assert [c.strip() for c in p50.split("|")[-3:-1]] == ["1.40", "3.00"]


def test_no_replication_section_without_the_unreplicated_broker() -> None:
    assert _md({"ours-replicated-1": 900.0, "rabbit-classic": 2000.0}, {}) == ""


def test_the_full_report_carries_the_replication_catchup_and_verdict_sections() -> None:
    runs = _runs({"ours": 1000.0, "ours-replicated-1": 700.0}, {"ours": 1.0, "ours-replicated-1": 2.0})
    catchup = {"target": "ours-replicated-1", "messages": 100000, "fill_rate": 9000.0, "seconds": 12.5,
               "startup_seconds": 0.5, "catchup_rate": 8333.3, "broker_us_per_msg": 80.0,
               "machine_busy_share": 0.95, "delete_seconds": 3.25, "errors": [], "publisher_rate": 998.0,
               "publisher_rate_target": 1000.0, "publisher_latency_ms": {"p50": 0.5, "p99": 4.25}}
    md = report.markdown(runs, ["ours", "ours-replicated-1"], KINDS, [catchup], hop={"hop_us": 10.0}, client="c")
    assert ("- ours-replicated-1 confirmed publish >= 0.9x ours: **NOT met** — ours-replicated-1 700 vs ours 1,000 "
            "msg/s -> 0.70x (>= 0.9x)") in md
    row = next(line for line in md.splitlines() if line.startswith("| ours-replicated-1 | 100000"))
    assert [c.strip() for c in row.split("|")[1:-1]] == ["ours-replicated-1", "100000", "9,000", "12.5", "0.50",
                                                         "8,333", "80.0", "0.95", "3.25", "998", "4.25", "-"]
    assert "catch-up of 1,000,000 queued messages <= 5 s while a publisher runs: **not measured**" in md
    assert "(measured: ours-replicated-1 100,000 in 12.5 s)" in md


def test_timeline_finds_first_answer_and_first_ready_after_the_process_start() -> None:
    samples = [(10.0, None), (10.5, None), (11.0, "joining"), (12.0, "catchup"), (15.0, "catchup"),
               (20.0, "ready"), (21.0, "ready")]
    tl = timeline(samples, t0=9.0)
    assert (tl.answered, tl.ready, tl.states) == (2.0, 11.0, ("joining", "catchup", "ready"))


def test_timeline_of_a_backup_that_never_got_ready_has_no_ready_time() -> None:
    tl = timeline([(1.0, None), (2.0, "catchup")], t0=0.0)
    assert tl.answered == 2.0 and math.isnan(tl.ready) and tl.states == ("catchup",)


def test_presets_choose_catchup_depths_and_the_flag_overrides_them() -> None:
    assert parse_args([]).catchup_sizes == [100_000]
    assert parse_args(["--preset", "full"]).catchup_sizes == [100_000, 1_000_000]
    assert parse_args(["--preset", "full", "--catchup-messages", "5000"]).catchup_sizes == [5000]
    with pytest.raises(SystemExit):
        parse_args(["--catchup-messages", "lots"])
    with pytest.raises(SystemExit):
        parse_args(["--phases", "publish,warmup"])


def test_a_catchup_only_run_prints_just_the_catchup_table() -> None:
    catchup = {"target": "ours-replicated-2", "messages": 1000000, "seconds": 75.4, "errors": ["x"]}
    md = report.markdown([], ["ours-replicated-2"], KINDS, [catchup])
    assert md.startswith("Catch-up") and "| metric |" not in md
    assert md.splitlines()[-1].startswith("| ours-replicated-2 | 1000000 |") and md.endswith("| x |")


def test_a_catchup_only_run_with_the_hop_also_gives_the_catchup_verdict() -> None:
    catchup = {"target": "ours-replicated-1", "messages": 1000000, "seconds": 4.5, "startup_seconds": 0.5,
               "publisher_rate_target": 1000.0, "publisher_rate": 990.0, "errors": []}
    md = report.markdown([], ["ours-replicated-1"], KINDS, [catchup], hop={"hop_us": 10.0}, client="c")
    assert ("- ours-replicated-1: catch-up of 1,000,000 queued messages <= 5 s while a publisher runs: **met** — "
            "ready 4.50 s after the backup's start (start-up 0.50 s), live publisher 990 msg/s") in md
