#!/usr/bin/env bash
# Runs CMD, then stops the fleet's Docker-in-Docker engines (scripts/fleet-engines.sh down: their
# data volumes, i.e. their loaded images, are kept) if CMD started them, pass or fail or
# interrupted; exits with CMD's status. Engines that were already up stay up, and KEEP_ENGINES=1
# keeps them all (the next run then starts in seconds instead of ~1 min).
#
#   scripts/engines-guard.sh CMD [ARGS...]      (`make test`, `make test-e2e`)
set -uo pipefail
here=$(dirname "$(readlink -f "$0")")

running() { docker ps -q --filter label=daiv.fleet=true 2>/dev/null || true; }

before=$(running)
stop() {
    local rc=$?
    trap - EXIT INT TERM
    if [ -z "$before" ] && [ "${KEEP_ENGINES:-0}" != 1 ] \
        && [ -n "$(docker ps -aq --filter label=daiv.fleet=true 2>/dev/null)" ]; then
        echo "stopping the fleet's engines this run started (KEEP_ENGINES=1 keeps them)" >&2
        "$here/fleet-engines.sh" down >/dev/null || echo "warning: fleet-engines.sh down failed" >&2
    fi
    exit "$rc"
}
trap stop EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
"$@"
