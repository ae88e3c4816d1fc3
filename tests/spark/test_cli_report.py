"""ha-lag-report end to end (in-process, real Spark): files written, exit codes, HTML rendered by Chromium."""

from __future__ import annotations

import base64
import csv
import io
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from matplotlib import image as mpimg
from pyspark.sql import SparkSession

from spark import cli, generator

pytestmark = pytest.mark.spark

SCENARIO = generator.Scenario(lag_samples=3_000, bad_lines=True, queues=("orders", "audit", "billing"), seed=3)
DAY = str(SCENARIO.day)
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory, spark: SparkSession) -> tuple[Path, Path, str]:
    """Logs as a cluster leaves them (flat directory, *.log and *.jsonl), and the report made from them."""
    root = tmp_path_factory.mktemp("cli")
    logs = root / "logs"
    generator.generate(SCENARIO, logs)
    for path in list(logs.glob("b2-*.jsonl")):
        path.rename(path.with_suffix(".log"))
    (logs / "README.txt").write_text("not a log: ignored by the file pattern\n")
    out = root / "out"
    result = CliRunner().invoke(cli.main, ["--logs", str(logs), "--date", DAY, "--out", str(out)])
    assert result.exit_code == 0, result.output
    return logs, out, result.output


def test_summary_on_stdout(run_dir: tuple[Path, Path, str]) -> None:
    output = run_dir[2]
    assert "failovers: 1" in output
    assert "b1 -> b2 (epoch 2)" in output
    assert "client-visible outage 4.50 s" in output
    assert "malformed_json=3" in output and "negative_lag=2" in output
    assert "3 queue(s), 2 backup(s)" in output
    assert (run_dir[1] / "summary.txt").read_text().strip() in output


def test_csv_and_parquet_tables(run_dir: tuple[Path, Path, str], spark: SparkSession) -> None:
    out = run_dir[1]
    with open(out / "csv" / "lag_hourly.csv", newline="") as handle:
        lag_rows = list(csv.DictReader(handle))
    # 3 hours x 3 queues x backups alive (b2 and b3 until the failover in hour 2, then b3 only)
    assert {(r["hour"][:13], r["backup"]) for r in lag_rows} >= {("2026-11-22T01", "b2"), ("2026-11-22T03", "b3")}
    assert all(float(r["p50_ms"]) <= float(r["p95_ms"]) <= float(r["p99_ms"]) <= float(r["max_ms"])
               for r in lag_rows)
    with open(out / "csv" / "failovers.csv", newline="") as handle:
        failovers = list(csv.DictReader(handle))
    assert [(f["old_primary"], f["new_primary"], f["outage_seconds"]) for f in failovers] == [("b1", "b2", "4.5")]
    parquet = spark.read.parquet(str(out / "parquet" / "lag_hourly"))
    assert parquet.count() == len(lag_rows)
    assert spark.read.parquet(str(out / "parquet" / "catchup_episodes")).count() == 6 + 3


def embedded_images(html: str) -> list[np.ndarray]:
    encoded = re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', html)
    return [mpimg.imread(io.BytesIO(base64.b64decode(e)), format="png") for e in encoded]


def test_html_is_self_contained_with_non_blank_plots(run_dir: tuple[Path, Path, str]) -> None:
    html = (run_dir[1] / "report.html").read_text()
    assert not re.search(r'(src|href)="(https?:|//)', html)
    images = embedded_images(html)
    assert len(images) == 3
    for img in images:
        rgb = img[..., :3]
        assert rgb.shape[0] > 200 and rgb.shape[1] > 500
        assert float(rgb.std()) > 0.05  # not a blank canvas
        assert len(np.unique(rgb.reshape(-1, 3), axis=0)) > 20  # lines, bars, text in several colours
    assert "11 bad line(s)" in html


def colour_pixels(shot: np.ndarray, rgb: tuple[int, int, int], tolerance: float = 0.06) -> int:
    target = np.array(rgb) / 255.0
    return int((np.abs(shot[..., :3] - target).max(axis=-1) < tolerance).sum())


@pytest.mark.skipif(shutil.which("chromium") is None, reason="Debian chromium not installed")
def test_chromium_renders_the_plots(run_dir: tuple[Path, Path, str], tmp_path: Path) -> None:
    shot_path = tmp_path / "report.png"
    subprocess.run(
        ["chromium", *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile'}", "--hide-scrollbars",
         "--window-size=1200,3600", f"--screenshot={shot_path}", (run_dir[1] / "report.html").as_uri()],
        check=True, capture_output=True, timeout=180,
    )
    shot = mpimg.imread(shot_path)
    assert shot.shape[0] >= 3000
    # Teal (#2a9d8f: catch-up bars, 'ready' bands) and the failover red appear only inside the plots;
    # a page whose images failed to load or decode has none of either.
    assert colour_pixels(shot, (0x2A, 0x9D, 0x8F)) > 2000
    assert colour_pixels(shot, (0xFF, 0x00, 0x00), tolerance=0.2) > 50


def test_no_valid_event_in_range_exits_1(run_dir: tuple[Path, Path, str], tmp_path: Path) -> None:
    result = CliRunner().invoke(cli.main, ["--logs", str(run_dir[0]), "--date", "2026-12-01",
                                           "--out", str(tmp_path / "o")])
    assert result.exit_code == 1
    assert "no input" in result.output
    assert not (tmp_path / "o" / "report.html").exists()


def test_only_malformed_lines_exits_1(tmp_path: Path) -> None:
    (tmp_path / "b1.log").write_text("garbage\n{\"event\": \n")
    result = CliRunner().invoke(cli.main, ["--logs", str(tmp_path), "--date", DAY, "--out", str(tmp_path / "o")])
    assert result.exit_code == 1
    assert "none of the 2 lines" in result.output


def test_missing_input_exits_1_without_spark(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    for target in (empty, tmp_path / "nope", tmp_path / "nope-*.log"):
        result = CliRunner().invoke(cli.main, ["--logs", str(target), "--date", DAY, "--out", str(tmp_path / "o")])
        assert result.exit_code == 1, target
        assert "no input" in result.output


def test_until_before_date_is_a_usage_error(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli.main, ["--logs", str(tmp_path), "--date", DAY, "--until", "2026-11-01",
                                           "--out", str(tmp_path / "o")])
    assert result.exit_code == 2
    assert "before --date" in result.output
