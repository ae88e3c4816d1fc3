#!/usr/bin/env bash
# Benchmark our broker against RabbitMQ 3.10 on this machine. Usage: bench/run.sh [--preset quick|full] [flags]
set -euo pipefail
cd "$(dirname "$0")/.."
exec .venv/bin/python -m bench "$@"
