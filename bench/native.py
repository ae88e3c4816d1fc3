"""Build the bench's C programs into bench/build/ (gcc -O2 against Debian's proton-C 0.37), when missing or stale.

- `loadgen`: our load generator (bench/loadgen/loadgen.c).
- `proton-c-broker`: the proton-C example broker from `libqpid-proton11-dev-examples` (examples/c/broker.c and
  thread.h), compiled unchanged: the engine-limit baseline target.

`python -m bench.native` builds both and prints their paths. Debian ships one pkg-config module, `libqpid-proton`
(core + proactor in one library); the upstream split modules are used when present.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

HERE = Path(__file__).resolve().parent
BUILD = HERE / "build"
LOADGEN_SRC = HERE / "loadgen" / "loadgen.c"
LOADGEN = BUILD / "loadgen"
C_BROKER = BUILD / "proton-c-broker"
EXAMPLE_DIRS = (Path("/usr/share/proton/examples/c"), Path("/usr/share/doc/libqpid-proton11-dev-examples/examples/c"))
PKG_MODULES = (("libqpid-proton-proactor", "libqpid-proton-core"), ("libqpid-proton",))
DEBS = "apt-get install gcc pkg-config libqpid-proton11-dev libqpid-proton11-dev-examples"


class BuildError(RuntimeError):
    pass


def proton_flags() -> list[str]:
    """Compiler and linker flags for proton-C (core + proactor) from pkg-config."""
    if shutil.which("pkg-config") is None:
        raise BuildError(f"pkg-config is missing: {DEBS}")
    for mods in PKG_MODULES:
        r = subprocess.run(["pkg-config", "--cflags", "--libs", *mods], capture_output=True, text=True)
        if r.returncode == 0:
            return shlex.split(r.stdout)
    raise BuildError(f"proton-C development files not found by pkg-config: {DEBS}")


def proton_version() -> str | None:
    for mods in PKG_MODULES:
        r = subprocess.run(["pkg-config", "--modversion", mods[0]], capture_output=True, text=True)
        if r.returncode == 0:
            return r.stdout.strip()
    return None


def stale(out: Path, inputs: Sequence[Path]) -> bool:
    """True when `out` is missing or older than any of `inputs` (pure given the file system)."""
    if not out.exists():
        return True
    built = out.stat().st_mtime
    return any(p.stat().st_mtime > built for p in inputs)


def compile_c(out: Path, sources: Sequence[Path], deps: Sequence[Path] = (), extra: Sequence[str] = (),
              force: bool = False) -> Path:
    if not force and not stale(out, [*sources, *deps]):
        return out
    gcc = shutil.which("gcc")
    if gcc is None:
        raise BuildError(f"gcc is missing: {DEBS}")
    BUILD.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    cmd = [gcc, "-O2", "-Wall", *extra, "-o", str(tmp), *map(str, sources), *proton_flags(), "-lpthread", "-lm"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise BuildError(f"{shlex.join(cmd)} failed:\n{r.stderr[-3000:]}")
    os.replace(tmp, out)  # atomic: a concurrent reader sees the old or the new binary, never half of one
    return out


def loadgen(force: bool = False) -> Path:
    return compile_c(LOADGEN, [LOADGEN_SRC], force=force)


def example_dir() -> Path:
    for d in EXAMPLE_DIRS:
        if (d / "broker.c").exists():
            return d
    raise BuildError(f"proton-C example broker.c not found in {', '.join(map(str, EXAMPLE_DIRS))}: {DEBS}")


def c_broker(force: bool = False) -> Path:
    d = example_dir()
    deps = [p for p in (d / "thread.h",) if p.exists()]
    return compile_c(C_BROKER, [d / "broker.c"], deps, extra=[f"-I{d}"], force=force)


def try_loadgen() -> tuple[Path | None, str]:
    """(binary, "") or (None, why not)."""
    try:
        return loadgen(), ""
    except (BuildError, OSError) as e:
        return None, str(e)


def main() -> None:
    ok = True
    for name, fn in (("loadgen", loadgen), ("proton-c-broker", c_broker)):
        try:
            print(f"{name}: {fn(force='--force' in sys.argv)}")
        except BuildError as e:
            ok = False
            print(f"{name}: NOT built: {e}", file=sys.stderr)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
