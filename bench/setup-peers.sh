#!/usr/bin/env bash
# Install the peer systems the benchmark compares against (Redis), idempotently.
#
# Only installs; never starts or enables a system service. The bench starts its
# own redis-server processes on free loopback ports with a temporary directory
# and its own config, and stops them afterwards.
set -euo pipefail

if command -v redis-server >/dev/null 2>&1 && command -v redis-benchmark >/dev/null 2>&1; then
    echo "setup-peers: $(redis-server --version | head -n1)"
    exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then
        SUDO="sudo"
    else
        echo "setup-peers: redis-server is missing and this is not root (no sudo); install redis-server and redis-tools" >&2
        exit 1
    fi
fi

export DEBIAN_FRONTEND=noninteractive
# policy-rc.d exit 101 keeps the package's post-install script from starting the
# system redis service (there may be no init system at all, e.g. in a container).
POLICY=/usr/sbin/policy-rc.d
CREATED_POLICY=0
if [ ! -e "$POLICY" ]; then
    printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$POLICY" >/dev/null
    $SUDO chmod +x "$POLICY"
    CREATED_POLICY=1
fi
cleanup() {
    if [ "$CREATED_POLICY" -eq 1 ]; then
        $SUDO rm -f "$POLICY"
    fi
}
trap cleanup EXIT

$SUDO apt-get update
# redis-server depends on redis-tools, which provides redis-benchmark and redis-cli.
$SUDO apt-get install -y redis-server

echo "setup-peers: installed $(redis-server --version | head -n1)"
