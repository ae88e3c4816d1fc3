#!/usr/bin/env bash
# The bench's own prerequisites, idempotent: Debian packages (installed with apt-get when missing and run as root)
# and the C programs in bench/build/ (the load generator and the proton-C example broker, rebuilt when stale).
# Called by bench/run.sh; skip with BENCH_NO_SETUP=1.
set -euo pipefail
cd "$(dirname "$0")/.."

DEBS=(gcc pkg-config libqpid-proton11-dev libqpid-proton11-dev-examples rabbitmq-server)
missing=()
for p in "${DEBS[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [[ ${#missing[@]} -gt 0 ]]; then
    if [[ $(id -u) -ne 0 ]]; then
        echo "[bench setup] missing Debian packages (run as root to install them): ${missing[*]}" >&2
    else
        echo "[bench setup] apt-get install ${missing[*]}" >&2
        if ! compgen -G "/var/lib/apt/lists/*Packages*" >/dev/null; then
            apt-get update -qq
        fi
        # the package's own service is not used (the bench runs private nodes on free ports); where policy-rc.d
        # forbids starting services (containers) it is not started at all
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null \
            || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null; }
    fi
fi
if ! .venv/bin/python -c "import pika" 2>/dev/null; then
    echo "[bench setup] pika is missing from .venv (RabbitMQ targets need it): scripts/setup.sh installs the bench extra" >&2
fi
.venv/bin/python -m bench.native >&2 || echo "[bench setup] C programs not built: the bench falls back to the Python clients and skips proton-c-broker" >&2
