#!/usr/bin/env bash
# API fuzzing: schemathesis against the served /api/v1/openapi.json of a freshly built service
# on a free loopback port (dev key, deployment `apifuzz-<pid>`, egress on with the dev CA), with
# hooks.py keeping every generated session on the local busybox image, forks to one or two
# sessions, and removing every session and snapshot it saw at the end.
#
#   integration/schemathesis/run.sh [--smoke]
#
# Long form: API_FUZZ_EXAMPLES (300) cases per operation in the examples, coverage and fuzzing
# phases, then the stateful phase (links from POST /session/) for API_FUZZ_STATEFUL_SECONDS.
# --smoke: API_FUZZ_SMOKE_EXAMPLES (15) per operation, a short stateful phase; under 2 minutes.
#
# Invariants (the run fails otherwise): no 5xx, every response conforms to the document
# (status, content type, headers, schema), valid data accepted and invalid data rejected, and
# nothing of the deployment left in Docker once the hooks removed their sessions and snapshots
# (containers, networks, snapshot records, workspace volumes; snapshot payload, which the
# disabled reaper would collect, is removed without counting: see service.sh).
# Schemathesis comes from PyPI into .dev/schemathesis (once; offline afterwards).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=../scripts/service.sh
source "$here/../scripts/service.sh"

smoke=false
[ "${1:-}" = "--smoke" ] && smoke=true

venv="$root/.dev/schemathesis"
want=$(grep -v '^#' "$here/requirements.txt" | head -n1)
if [ "$(cat "$venv/.installed" 2>/dev/null)" != "$want" ]; then
    echo "api-fuzz: installing $want into $venv"
    mkdir -p "$root/.dev" && chmod 700 "$root/.dev"
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check -r "$here/requirements.txt"
    echo "$want" >"$venv/.installed"
fi

build_service
dev_ca
out="$target_dir/api-fuzz"
mkdir -p "$out"
deployment="apifuzz-$$"
started=$(date +%s)

cleanup() {
    local rc=$?
    stop_service
    local left
    left=$(sweep_deployment "$deployment") || rc=1
    echo "api-fuzz: Docker objects of $deployment left after the run: $left"
    [ "$left" = 0 ] || rc=1
    echo "api-fuzz: $(($(date +%s) - started)) s; report and service log in $out"
    exit "$rc"
}
trap cleanup EXIT

start_service "$deployment" "$out/service.log" \
    DAIV_SANDBOX_EGRESS_CA_CERT_FILE="$root/.dev/egress-ca.crt" \
    DAIV_SANDBOX_EGRESS_CA_KEY_FILE="$root/.dev/egress-ca.key" \
    DAIV_SANDBOX_COMMAND_TIMEOUT=5 \
    DAIV_SANDBOX_OUTPUT_MAX_BYTES=1048576 \
    DAIV_SANDBOX_SESSION_LOCK_WAIT_SECONDS=5 \
    DAIV_SANDBOX_PROCESS_WAIT_MAX_SECONDS=2 \
    DAIV_SANDBOX_REAPER_ENABLED=false
# No reaper: it would remove stopped sessions (a DELETE without force) that later cases still
# use. The hooks delete every snapshot and session; the payload the reaper would have collected
# (a fork's snapshot, a snapshot deleted while a session used it) is sweep_deployment's.
echo "api-fuzz: service pid $SERVICE_PID on $SERVICE_URL (deployment $deployment)"

# The smoke form (in `make test`) is reproducible: a fixed seed unless API_FUZZ_SEED says
# otherwise. The long form draws a new one each run (printed as "Seed:"; pass it back to replay).
seed=()
if $smoke; then
    examples=${API_FUZZ_SMOKE_EXAMPLES:-15}
    stateful=${API_FUZZ_SMOKE_STATEFUL_SECONDS:-30}
    seed=(--seed "${API_FUZZ_SEED:-20261201}")
else
    examples=${API_FUZZ_EXAMPLES:-300}
    stateful=${API_FUZZ_STATEFUL_SECONDS:-600}
    # Forks side by side, two at most (the smoke form makes one: cheaper).
    export DAIV_FUZZ_FORK_COUNT=${DAIV_FUZZ_FORK_COUNT:-2}
    [ -z "${API_FUZZ_SEED:-}" ] || seed=(--seed "$API_FUZZ_SEED")
fi

export DAIV_FUZZ_API="$SERVICE_URL/api/v1" DAIV_FUZZ_KEY
DAIV_FUZZ_KEY=$(dev_key)
export PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}" SCHEMATHESIS_HOOKS=hooks

st=("$venv/bin/st" --config-file "$here/schemathesis.toml" run "$SERVICE_URL/api/v1/openapi.json"
    --max-examples "$examples" "${seed[@]}" --report junit,ndjson --report-dir "$out" --no-color --output-truncate true)
rc=0
echo "api-fuzz: examples, coverage and fuzzing phases, $examples cases per operation"
"${st[@]}" --phases examples,coverage,fuzzing || rc=$?
echo "api-fuzz: stateful phase (links from POST /session/), at most $stateful s"
"${st[@]}" --phases stateful --max-time "$stateful" --report-junit-path "$out/junit-stateful.xml" \
    --report-ndjson-path "$out/events-stateful.ndjson" || rc=$?
exit "$rc"
