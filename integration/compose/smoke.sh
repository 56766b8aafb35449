#!/usr/bin/env bash
# Brings up integration/compose.yaml under a unique project name on a free loopback port, checks
# health (HTTP and Docker's HEALTHCHECK), one plain session end to end (its lock goes through
# Redis) and one egress session (the gateway image starts), then tears everything down, whatever
# happened. Exit 0 only if every check passed.
#
#   integration/compose/smoke.sh          # needs `make images` (no registry, nothing pulled)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
file="$here/../compose.yaml"

if docker compose version >/dev/null 2>&1; then
    compose=(docker compose)
elif command -v docker-compose >/dev/null 2>&1; then
    compose=(docker-compose)
else
    echo "error: neither 'docker compose' nor 'docker-compose' is installed" >&2
    exit 1
fi

for image in daiv-sandbox:local daiv-sandbox-redis:local daiv-sandbox-egress:local daiv-sandbox-busybox:local; do
    docker image inspect "$image" >/dev/null 2>&1 || {
        echo "error: image $image missing: run 'make images'" >&2
        exit 1
    }
done

project="daiv-sandbox-smoke-$$"
port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
key="smoke-$(head -c 12 /dev/urandom | od -An -tx1 | tr -d ' \n')"
ca="$(mktemp -d)"
sessions=()

cleanup() {
    local rc=$?
    if [ "$rc" -ne 0 ]; then
        "${compose[@]}" -f "$file" -p "$project" logs --tail 40 control-plane >&2 || true
    fi
    for s in "${sessions[@]}"; do docker rm -fv "$s" >/dev/null 2>&1 || true; done
    "${compose[@]}" -f "$file" -p "$project" down -v --remove-orphans >/dev/null 2>&1 || true
    rm -rf "$ca"
    exit "$rc"
}
trap cleanup EXIT

# A throwaway egress CA, readable by the control plane's uid (10001).
chmod 0777 "$ca"
docker run --rm --pull never --user 10001 -v "$ca:/out" daiv-sandbox-egress:local \
    gen-ca --cert-out /out/egress-ca.crt --key-out /out/egress-ca.key >/dev/null
chmod 0755 "$ca"

# The stack's warm pool goes with it: nothing of the smoke run may stay on the engine.
export DAIV_SANDBOX_WARM_POOL_REMOVE_ON_SHUTDOWN=true
export DAIV_SANDBOX_API_KEY="$key" DAIV_SANDBOX_PORT="$port" DAIV_SANDBOX_EGRESS_CA_DIR="$ca" \
    DAIV_SANDBOX_EGRESS_CA_CERT_FILE=/etc/daiv-sandbox/egress-ca/egress-ca.crt \
    DAIV_SANDBOX_EGRESS_CA_KEY_FILE=/etc/daiv-sandbox/egress-ca/egress-ca.key
"${compose[@]}" -f "$file" -p "$project" up -d >/dev/null 2>&1

base="http://127.0.0.1:$port"
api="$base/api/v1"
fail() { echo "smoke: FAIL: $*" >&2; exit 1; }

for _ in $(seq 1 150); do
    curl -fsS "$base/-/health/" >/dev/null 2>&1 && break
    sleep 0.2
done
curl -fsS "$base/-/health/" | grep -q '"ok"' || fail "control plane not healthy"
container="$("${compose[@]}" -f "$file" -p "$project" ps -q control-plane)"
for _ in $(seq 1 60); do
    [ "$(docker inspect -f '{{.State.Health.Status}}' "$container")" = healthy ] && break
    sleep 0.5
done
[ "$(docker inspect -f '{{.State.Health.Status}}' "$container")" = healthy ] || fail "HEALTHCHECK never passed"

call() { curl -sS -H "X-API-Key: $key" -H 'Content-Type: application/json' "$@"; }
# The new session's id, or a failure that shows the service's answer.
create() {
    local body
    body="$(call -X POST -d "$1" "$api/session/")"
    python3 -c 'import json,sys; print(json.loads(sys.argv[1])["session_id"])' "$body" 2>/dev/null \
        || fail "session not created: $body"
}

sid="$(create '{"base_image": "daiv-sandbox-busybox:local"}')"
sessions+=("$sid")
out="$(call -X POST -d '{"commands": ["echo compose-ok"]}' "$api/session/$sid/")"
echo "$out" | grep -q '"output":"compose-ok\\n"' || fail "command output: $out"
code="$(call -o /dev/null -w '%{http_code}' -X DELETE "$api/session/$sid/?force=true")"
[ "$code" = 204 ] || fail "close: $code"

egress='{"base_image": "daiv-sandbox-busybox:local", "egress": {"policy": {"default": "deny", "rules": [{"host": "api.upstream.test", "methods": ["GET"]}]}}}'
eid="$(create "$egress")"
sessions+=("$eid")
code="$(call -o /dev/null -w '%{http_code}' -X DELETE "$api/session/$eid/?force=true")"
[ "$code" = 204 ] || fail "egress close: $code"

echo "smoke: compose stack OK ($("${compose[@]}" version --short 2>/dev/null || echo compose))"
