#!/usr/bin/env bash
# Soak: builds the service and cp-soak, starts the service on a free loopback port (dev key,
# deployment `soak-<pid>`), keeps SOAK_SESSIONS sessions busy for SOAK_SECONDS with cp-soak,
# then checks that the deployment left nothing in Docker.
#
#   SOAK_SESSIONS=50 SOAK_SECONDS=600 integration/scripts/soak.sh [cp-soak flags...]
#
# The report (table + JSON) is printed and kept in $CARGO_TARGET_DIR/soak/; the run fails on any
# error or leftover Docker object.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=service.sh
source "$here/service.sh"

sessions=${SOAK_SESSIONS:-50}
seconds=${SOAK_SECONDS:-600}
flag=()
[ "$SERVICE_PROFILE" = release ] && flag=(--release)
build_service
[ "${SERVICE_PREBUILT:-0}" = 1 ] || (cd "$root" && cargo build --quiet "${flag[@]}" -p integration --bin cp-soak)
out="$target_dir/soak"
mkdir -p "$out"
deployment="soak-$$"

cleanup() {
    local rc=$?
    stop_service
    local left
    left=$(sweep_deployment "$deployment") || rc=1
    echo "soak: Docker objects of $deployment left after the service stopped: $left"
    [ "$left" = 0 ] || rc=1
    exit "$rc"
}
trap cleanup EXIT

# The reaper stays on with its defaults: nothing of the soak is idle long enough to be reaped.
start_service "$deployment" "$out/service.log" DAIV_SANDBOX_LOG_LEVEL=WARNING
echo "soak: service pid $SERVICE_PID on $SERVICE_URL; $sessions sessions for $seconds s"
DAIV_SANDBOX_API_KEY=$(dev_key) "$target_dir/$SERVICE_PROFILE/cp-soak" --base "$SERVICE_URL" \
    --sessions "$sessions" --seconds "$seconds" --pid "$SERVICE_PID" --deployment "$deployment" \
    --json-out "$out/soak-$sessions-$seconds.json" "$@"
