"""scripts/setup.sh's `compile_sources`: the project's modules are byte-compiled once, so that the many broker, CLI
and agent processes of a run do not each compile them again where PYTHONDONTWRITEBYTECODE is set."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def compile_sources(root: Path) -> subprocess.CompletedProcess[str]:
    script = f'source {ROOT / "scripts/setup.sh"}; ROOT={root}; VENV={Path(sys.executable).parent.parent}; compile_sources'
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60)


def test_compile_sources_compiles_the_project_but_not_node_modules_and_a_bad_file_does_not_stop_the_set_up(
        tmp_path: Path) -> None:
    (tmp_path / "broker/store").mkdir(parents=True)
    (tmp_path / "broker/store/journal.py").write_text("X = 1\n")
    (tmp_path / "ha").mkdir()
    (tmp_path / "ha/broken.py").write_text("def (:\n")
    (tmp_path / "tests/interop/node_modules/pkg").mkdir(parents=True)
    (tmp_path / "tests/interop/node_modules/pkg/gyp.py").write_text("X = 1\n")
    done = compile_sources(tmp_path)
    assert done.returncode == 0, done.stderr
    assert Path(importlib.util.cache_from_source(str(tmp_path / "broker/store/journal.py"))).is_file()
    assert not Path(importlib.util.cache_from_source(str(tmp_path / "ha/broken.py"))).exists()
    assert not Path(importlib.util.cache_from_source(str(tmp_path / "tests/interop/node_modules/pkg/gyp.py"))).exists()
