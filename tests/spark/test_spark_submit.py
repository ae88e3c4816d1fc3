"""The job runs unchanged under spark-submit, with the package shipped as --py-files (as on a cluster)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import spark as spark_package
from spark import generator

pytestmark = pytest.mark.spark

SPARK_SUBMIT = Path(sys.executable).parent / "spark-submit"


def package_zip(target: Path) -> Path:
    """What docs/lag-report.md tells operators to build: the spark/ package as a zip."""
    source = Path(spark_package.__file__).parent
    with zipfile.ZipFile(target, "w") as archive:
        for path in sorted(source.glob("*.py")):
            archive.write(path, f"spark/{path.name}")
    return target


@pytest.mark.skipif(not SPARK_SUBMIT.exists(), reason="pyspark's spark-submit not installed")
def test_spark_submit_local_cluster_mode(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    generator.generate(generator.Scenario(lag_samples=1_000, partitioned=True, gzipped=True), logs)
    out = tmp_path / "out"
    job_dir = tmp_path / "job"  # run from a copy, with only the zip to import from, as on a cluster
    job_dir.mkdir()
    shutil.copy(Path(spark_package.__file__).parent / "cli.py", job_dir / "ha_lag_report.py")
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable,
           "PYTHONPATH": "", "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    result = subprocess.run(
        [str(SPARK_SUBMIT), "--master", "local[2]", "--conf", "spark.ui.enabled=false",
         "--conf", "spark.sql.shuffle.partitions=4", "--py-files", str(package_zip(tmp_path / "spark.zip")),
         str(job_dir / "ha_lag_report.py"), "--logs", f"file://{logs}", "--date", "2026-11-22",
         "--out", f"file://{out}"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "failovers: 1" in result.stdout
    assert "client-visible outage 4.50 s" in result.stdout
    assert (out / "report.html").stat().st_size > 50_000
    assert (out / "csv" / "lag_hourly.csv").read_text().count("\n") > 1
