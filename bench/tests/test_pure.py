"""Unit tests of the bench's pure parts: /proc parsing, statistics, the report. Run: .venv/bin/pytest bench/tests"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from bench import procstat, report, stats
from bench.cli import cpu_idle, describe_cpu_idle
from bench.profile import file_of, parse_collapsed

# fields 1..17 of a real-looking stat line; comm has a space and a ')' inside
STAT = "4242 (beam.smp (x) y) S 4200 4242 4242 0 -1 4194560 100 0 0 0 1234 567 0 0 20 0 30 0 99 0"


def test_parse_stat_handles_parentheses_in_comm() -> None:
    s = procstat.parse_stat(STAT)
    assert (s.pid, s.comm, s.ppid, s.ticks) == (4242, "beam.smp (x) y", 4200, 1234 + 567)


def test_parse_times_reads_user_and_system_apart() -> None:
    assert procstat.parse_times(STAT) == (1234, 567)


def test_part_of_tells_the_loop_threads_and_the_sync_process_apart() -> None:
    assert procstat.part_of(100, 100, 100, "ha-broker --port 5672") == procstat.LOOP
    assert procstat.part_of(100, 103, 100, "ha-broker --port 5672") == procstat.THREADS
    assert procstat.part_of(104, 104, 100, "/usr/bin/python3 -I /x/broker/store/syncproc.py 3") == procstat.SYNC_PROCESS
    assert procstat.part_of(105, 105, 100, "sh -c true") == procstat.CHILDREN


def test_parts_delta_subtracts_and_counts_new_parts_whole() -> None:
    before = {"loop": (1.0, 0.5), "other threads": (0.3, 0.1)}
    after = {"loop": (3.5, 0.75), "other threads": (0.2, 0.1), "sync process": (0.4, 0.9)}
    assert procstat.parts_delta(before, after) == {"loop": [2.5, 0.25], "other threads": [0.0, 0.0],
                                                   "sync process": [0.4, 0.9]}


def test_thread_parts_of_live_threads_and_a_child() -> None:
    """A real spinning thread counts under "other threads", a child named like the sync process under its part."""
    stop = threading.Event()
    spinner = threading.Thread(target=lambda: [None for _ in iter(stop.is_set, True)], daemon=True)
    child = subprocess.Popen([sys.executable, "-c", "while True: pass", "syncproc"])
    spinner.start()
    try:
        me = os.getpid()
        deadline = time.monotonic() + 30
        while True:
            parts = procstat.thread_parts(me, [me, child.pid])
            if parts.get(procstat.THREADS, (0.0, 0.0))[0] >= 0.1 and parts.get(procstat.SYNC_PROCESS, (0.0,))[0] >= 0.1:
                break
            assert time.monotonic() < deadline, f"no CPU seen in the spinning thread and child: {parts}"
            time.sleep(0.05)
        assert procstat.LOOP in parts and procstat.CHILDREN not in parts
    finally:
        stop.set()
        child.kill()
        child.wait()
        spinner.join()


def test_machine_ticks_busy_excludes_idle_and_iowait() -> None:
    busy, total = procstat.machine_ticks("cpu  10 1 5 100 4 0 2 0 0 0\ncpu0 1 2 3 4 5 6 7 8\n")
    assert (busy, total) == (10 + 1 + 5 + 2, 122)


def test_descendants_walks_the_whole_tree_only() -> None:
    mk = lambda pid, ppid: procstat.StatLine(pid, "p", ppid, 0)  # noqa: E731
    tree = [mk(1, 0), mk(10, 1), mk(11, 10), mk(12, 11), mk(13, 10), mk(20, 1)]
    assert sorted(procstat.descendants(10, tree)) == [10, 11, 12, 13]


def test_cpu_seconds_of_a_real_busy_process_grows() -> None:
    child = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        deadline = time.monotonic() + 30
        while procstat.cpu_seconds([child.pid]) < 0.1:
            assert time.monotonic() < deadline, "a spinning process never accumulated 0.1 s of CPU"
            time.sleep(0.05)
    finally:
        child.kill()
        child.wait()
    assert procstat.cpu_seconds([child.pid]) == 0.0  # gone: counts nothing, raises nothing


def test_percentile_is_nearest_rank() -> None:
    vals = [float(v) for v in range(100, 0, -1)]  # 1..100, unsorted
    assert stats.percentile(vals, 50) == 50.0
    assert stats.percentile(vals, 99) == 99.0
    assert stats.percentile(vals, 100) == 100.0
    assert math.isnan(stats.percentile([], 50))


def test_ratio_and_per_message_guard_against_zero() -> None:
    assert stats.ratio(10.0, 4.0) == 2.5
    assert math.isnan(stats.ratio(1.0, 0.0))
    assert stats.per_message_us(0.5, 1000) == 500.0
    assert math.isnan(stats.per_message_us(0.5, 0))


def _run(target: str, phase: str, rate: float, cpu_us: float, repeat: int = 0) -> dict[str, object]:
    return {"target": target, "phase": phase, "rate": rate, "broker_us_per_msg": cpu_us, "repeat": repeat,
            "latency_ms": {}, "client_processes": 4, "messages": 1000, "seconds": 1.0, "client_us_per_msg": 30.0,
            "client_max_core_share": 0.3, "machine_busy_share": 0.9, "broker_core_share": 0.5}


def test_summary_takes_the_median_of_repeats() -> None:
    runs = [_run("ours", "e2e", r, 50.0, i) for i, r in enumerate([100.0, 300.0, 200.0])]
    assert report.summarize(runs, ["rate"])["ours"]["e2e"]["rate"] == 200.0


def test_markdown_shows_ratio_ours_over_rabbit_and_goal_verdicts() -> None:
    runs = [_run("ours", "e2e", 6000.0, 40.0), _run("rabbit-classic", "e2e", 3000.0, 80.0)]
    kinds = {"ours": "understudy", "rabbit-classic": "rabbitmq"}
    md = report.markdown(runs, ["ours", "rabbit-classic"], kinds)
    e2e_row = next(line for line in md.splitlines() if line.startswith("| end-to-end, msg/s"))
    assert e2e_row.split("|")[1:-1] == [" end-to-end, msg/s ", " 6,000 ", " 3,000 ", " 2.00 "]
    assert "ours / rabbit-classic" in md
    assert ("- ours e2e throughput >= 2x rabbit-classic: **met** — ours 6,000 vs rabbit-classic 3,000 msg/s -> "
            "2.00x (>= 2x)") in md


def test_goal_not_met_is_said_plainly() -> None:
    runs = [_run("ours", "e2e", 1000.0, 120.0), _run("rabbit-classic", "e2e", 3000.0, 80.0)]
    md = report.markdown(runs, ["ours", "rabbit-classic"], {"ours": "understudy", "rabbit-classic": "rabbitmq"})
    assert "- ours e2e throughput >= 2x rabbit-classic: **NOT met** — ours 1,000 vs rabbit-classic 3,000" in md


def test_ratio_pairs_compare_every_ours_target_with_every_rabbit_target() -> None:
    kinds = {"ours": "understudy", "ours-replicated-1": "understudy", "rabbit-classic": "rabbitmq",
             "rabbit-quorum": "rabbitmq"}
    assert report.ratio_pairs(list(kinds), kinds) == [
        ("ours", "rabbit-classic"), ("ours", "rabbit-quorum"),
        ("ours-replicated-1", "rabbit-classic"), ("ours-replicated-1", "rabbit-quorum")]


def test_only_the_unreplicated_broker_is_compared_with_the_proton_c_baseline() -> None:
    kinds = {"ours": "understudy", "ours-replicated-1": "understudy", "proton-c-broker": "proton-c",
             "rabbit-classic": "rabbitmq"}
    assert report.ratio_pairs(list(kinds), kinds) == [
        ("ours", "rabbit-classic"), ("ours-replicated-1", "rabbit-classic"), ("ours", "proton-c-broker")]


def test_collapsed_stacks_fold_lines_into_functions_and_count_self_and_total() -> None:
    text = ("main (a.py:1);f (b.py:10);g (b.py:20) 3\n"
            "main (a.py:1);f (b.py:11) 2\n"
            "main (a.py:2);g (b.py:21) 5\n")
    own, incl, total = parse_collapsed(text)
    assert total == 10
    assert own["g (b.py)"] == 8 and own["f (b.py)"] == 2
    assert incl["main (a.py)"] == 10 and incl["f (b.py)"] == 5
    by_file, _, _ = parse_collapsed(text, file_of)
    assert by_file == {"b.py": 10}


def test_cpu_idle_reads_the_driver_governor_and_the_guest_halt_poll(tmp_path: Path) -> None:
    root = tmp_path
    (root / "devices/system/cpu/cpuidle").mkdir(parents=True)
    (root / "devices/system/cpu/cpuidle/current_driver").write_text("haltpoll\n")
    (root / "devices/system/cpu/cpuidle/current_governor_ro").write_text("haltpoll\n")
    assert cpu_idle(root) == {"driver": "haltpoll", "governor": "haltpoll"}
    (root / "module/haltpoll/parameters").mkdir(parents=True)
    (root / "module/haltpoll/parameters/guest_halt_poll_ns").write_text("0\n")
    idle = cpu_idle(root)
    assert idle["guest_halt_poll_ns"] == 0
    assert "halts at once" in describe_cpu_idle(idle)
    assert describe_cpu_idle({**idle, "guest_halt_poll_ns": 200_000}).endswith("polls up to 200 µs before it halts")
    assert cpu_idle(root / "nothing") == {} and describe_cpu_idle({}) == "CPU idle: not known"
