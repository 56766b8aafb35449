#!/usr/bin/env bash
# What `make test` runs, in an order that keeps both cores busy on a fresh machine. The
# workspace compiles once per profile: clippy, the static release binaries of the images, the
# debug build the tests reuse. Beside it run what needs no cargo: the host's preparation
# (packages, debootstrapped images, the Docker-in-Docker image: `make host`), then the fleet's
# engines. Each step is printed with the seconds since the start; at the end, pass or fail, the
# per-binary test times (scripts/test-times.py over nextest's JUnit report).
set -euo pipefail
cd "$(dirname "$(readlink -f "$0")")/.."
make=(make --no-print-directory)
dev=.dev
junit=target/nextest/ci/junit.xml
start=$(date +%s)
host_pid=
engines_pid=

step() { echo "== [$(($(date +%s) - start))s] $*" >&2; }

finish() {
    local rc=$?
    trap - EXIT
    local pid
    for pid in $host_pid $engines_pid; do
        wait "$pid" 2>/dev/null || true
    done
    python3 scripts/test-times.py "$junit" || true
    step "make test: exit $rc"
    exit "$rc"
}
trap finish EXIT

# wait_for NAME PID: wait for a background step; on failure print its log and fail.
wait_for() {
    if ! wait "$2"; then
        echo "error: $1 failed:" >&2
        cat "$dev/$1.log" >&2
        exit 1
    fi
}

mkdir -p "$dev" && chmod 700 "$dev"
rm -f "$junit"
step "docker"
"${make[@]}" docker
step "host preparation, in the background (log: $dev/host.log)"
"${make[@]}" host >"$dev/host.log" 2>&1 &
host_pid=$!
step "lint (fmt, clippy)"
"${make[@]}" lint
step "static release binaries, their images"
"${make[@]}" images-static
step "waiting for the host preparation"
wait_for host "$host_pid"
host_pid=
step "the code interpreter's image"
"${make[@]}" images-code-interpreter
step "fleet engines, in the background (log: $dev/fleet-engines.log)"
"${make[@]}" engines-up >"$dev/fleet-engines.log" 2>&1 &
engines_pid=$!
step "debug build (binaries and tests)"
"${make[@]}" build
step "waiting for the fleet engines"
wait_for fleet-engines "$engines_pid"
engines_pid=
step "tests"
"${make[@]}" test-steps
