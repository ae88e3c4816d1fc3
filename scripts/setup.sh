#!/usr/bin/env bash
# Shared setup for ./run.sh and ./test.sh. Idempotent: re-running only does what is missing.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV="$ROOT/.venv"
STAMP_DIR="$VENV/.understudy-stamps"

log() { printf '[setup] %s\n' "$*" >&2; }

# Debian packages. The runtime set builds qpid-proton with Cyrus SASL (PLAIN with a users file).
RUNTIME_DEBS=(gcc python3-dev python3-venv libsasl2-dev sasl2-bin libsasl2-modules libssl-dev pkg-config)
TEST_DEBS=(pacemaker corosync pcs resource-agents pacemaker-cli-utils libxml2-utils zookeeper
           iproute2 iptables iputils-ping iputils-arping procps psmisc chromium
           libqpid-proton11-dev libqpid-proton11-dev-examples)  # the bench's C load generator and its tests
NO_RECOMMENDS_DEBS=(vagrant)

need_debs() {
    local missing=()
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
    printf '%s\n' "${missing[@]}"
}

install_debs() {
    local flags=("$@")
    local list=()
    mapfile -t list < <(need_debs "${DEBS[@]}")
    [[ ${#list[@]} -eq 0 || -z "${list[0]}" ]] && return 0
    if [[ $(id -u) -ne 0 ]]; then
        log "missing Debian packages (run as root to install): ${list[*]}"; return 1
    fi
    log "apt-get install ${list[*]}"
    if [[ ! -f /var/lib/apt/lists/.understudy-updated ]] || ! compgen -G "/var/lib/apt/lists/*Packages*" >/dev/null; then
        apt-get update -qq && touch /var/lib/apt/lists/.understudy-updated
    fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${flags[@]}" "${list[@]}" >/dev/null
}

setup_runtime_debs() { DEBS=("${RUNTIME_DEBS[@]}"); install_debs; }
setup_test_debs() {
    DEBS=("${RUNTIME_DEBS[@]}" "${TEST_DEBS[@]}"); install_debs
    DEBS=("${NO_RECOMMENDS_DEBS[@]}"); install_debs --no-install-recommends
    # Java (ZooKeeper, Spark) and Node.js (rhea interop) may come from elsewhere than Debian: only add if absent.
    if ! command -v java >/dev/null; then DEBS=(default-jre-headless); install_debs; fi
    if ! command -v npm >/dev/null; then DEBS=(nodejs npm); install_debs; fi
}

# pip install into .venv, only when pyproject.toml changed since the last install.
setup_venv() {
    local extras=$1
    [[ -x "$VENV/bin/python" ]] || python3 -m venv "$VENV"
    mkdir -p "$STAMP_DIR"
    local want
    want=$(cat "$ROOT/pyproject.toml" <(echo "$extras") | sha256sum | cut -d' ' -f1)
    local stamp="$STAMP_DIR/pip-$extras"
    if [[ ! -f "$stamp" || $(cat "$stamp") != "$want" ]]; then
        log "pip install -e .[$extras]"
        "$VENV/bin/pip" install -q --disable-pip-version-check -e "$ROOT[$extras]" 2>&1 | grep -v "^WARNING: Location" >&2 || true
        "$VENV/bin/python" -c "import proton, structlog, click" >/dev/null
        echo "$want" >"$stamp"
    fi
    compile_sources
}

# Byte-compile the project's modules (only what changed since the last time). Every broker, CLI call and agent action
# is a new Python process, and where PYTHONDONTWRITEBYTECODE is set (this machine's image sets it) each of them would
# otherwise compile every module it imports from source again: ~0.12 s of each broker start (docs/testing.md). A
# source that does not compile is left to the test or the run that imports it to report.
compile_sources() {
    "$VENV/bin/python" -m compileall -q -j 0 -x '/node_modules/' \
        "$ROOT/broker" "$ROOT/ha" "$ROOT/spark" "$ROOT/deploy" "$ROOT/resource_agents" "$ROOT/tests" "$ROOT/bench" \
        >/dev/null 2>&1 || true
}

# rhea (npm) for the interop tests, from the committed lock file; only when the lock changed.
setup_npm() {
    local dir="$ROOT/tests/interop"
    [[ -f "$dir/package-lock.json" ]] || return 0
    command -v npm >/dev/null || { log "npm missing: interop tests with rhea will be skipped"; return 0; }
    local want stamp="$dir/node_modules/.understudy-lock"
    want=$(sha256sum "$dir/package-lock.json" | cut -d' ' -f1)
    if [[ ! -f "$stamp" || $(cat "$stamp") != "$want" ]]; then
        log "npm ci (tests/interop)"
        npm ci --prefix "$dir" --no-audit --no-fund --silent >&2
        echo "$want" >"$stamp"
    fi
}

# The OCF agent lives in the repo; Pacemaker finds it under /usr/lib/ocf/resource.d/understudy/.
install_ocf_agent() {
    [[ $(id -u) -eq 0 ]] || return 0
    [[ -d /usr/lib/ocf/resource.d ]] || return 0
    if compgen -G "$ROOT/resource_agents/understudy*" >/dev/null; then
        mkdir -p /usr/lib/ocf/resource.d/understudy
        for a in "$ROOT"/resource_agents/understudy*; do
            [[ -f "$a" && -x "$a" ]] && ln -sf "$a" "/usr/lib/ocf/resource.d/understudy/$(basename "$a")"
        done
    fi
    return 0
}
