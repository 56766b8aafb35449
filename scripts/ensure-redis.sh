#!/usr/bin/env bash
# Make sure redis-server is installed (Debian's package; its service is not started: tests start
# their own server on a free port) and print the path of the redis-server binary.
# Usage: ensure-redis.sh [PORT]   (PORT is accepted for callers' convenience and not used.)
set -euo pipefail
# shellcheck source=scripts/lib.sh
. "$(dirname "$(readlink -f "$0")")/lib.sh"

if ! command -v redis-server >/dev/null 2>&1; then
    apt_ensure redis-server
fi
bin=$(command -v redis-server) || die "redis-server is not on PATH after installing it"
echo "$bin"
