#!/usr/bin/env bash
# Build both sandbox images (daiv-sandbox-busybox:local, daiv-sandbox-debian:local) locally.
# Each is skipped when its tag exists, unless FORCE=1. Quiet on success; TIMES=1 prints how long
# each step took (to stderr).
set -euo pipefail
here=$(dirname "$(readlink -f "$0")")

step() {
    local start end
    start=$(date +%s.%N)
    "$here/$1"
    end=$(date +%s.%N)
    if [ "${TIMES:-0}" = 1 ]; then
        awk -v s="$start" -v e="$end" -v n="$1" 'BEGIN { printf "%s: %.1fs\n", n, e - s }' >&2
    fi
}

step build-busybox.sh
step build-debian.sh
