#!/usr/bin/env bash
# Benchmark our broker against the proton-C example broker and RabbitMQ 3.10 on this machine.
# Usage: bench/run.sh [--preset quick|full] [flags]   (installs what the bench needs first: bench/setup.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ -z "${BENCH_NO_SETUP:-}" ]]; then
    bench/setup.sh
fi
exec .venv/bin/python -m bench "$@"
