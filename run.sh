#!/usr/bin/env bash
# Set up (idempotent) and run the main job: a local Understudy cluster on 127.0.0.1.
# Usage: ./run.sh [understudy-cluster options]   (Ctrl-C stops everything)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/scripts/setup.sh"
setup_runtime_debs
setup_venv runtime
exec "$VENV/bin/understudy-cluster" "$@"
