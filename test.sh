#!/usr/bin/env bash
# Set up (idempotent) and run the whole test suite: lint, types, tests.
# Usage: ./test.sh [pytest args]   e.g. ./test.sh -m soak   or   ./test.sh tests/broker
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/scripts/setup.sh"
cd "$ROOT"
setup_test_debs
setup_venv test,spark,bench
setup_npm
install_ocf_agent
log "ruff"
"$VENV/bin/ruff" check conftest.py broker ha spark tests bench deploy resource_agents/agent_core.py resource_agents/local_admin.py resource_agents/understudy
log "mypy"
"$VENV/bin/mypy" broker ha deploy resource_agents/agent_core.py resource_agents/local_admin.py
log "pytest"
if [[ $# -eq 0 ]]; then set -- -m "not soak" --durations=30; fi  # the slowest 30: the ~20-minute budget
exec "$VENV/bin/pytest" "$@"
