#!/usr/bin/env bash
# API fuzzing: schemathesis against the served /api/v1/openapi.json of a freshly built service
# on a free loopback port (dev key, deployment `apifuzz-<pid>`, egress on with the dev CA), with
# hooks.py keeping every generated session on the local busybox image, forks to one or two
# sessions, and removing every session and snapshot it saw at the end.
#
#   integration/schemathesis/run.sh [--smoke]
#
# Long form: API_FUZZ_EXAMPLES (300) cases per operation in the examples, coverage and fuzzing
# phases (two operations at a time), then the stateful phase (the document's links, scenarios
# from every operation that has some) for API_FUZZ_STATEFUL_SECONDS (600).
# --smoke: API_FUZZ_SMOKE_EXAMPLES (15) per operation, a 30 s stateful phase; under 2 minutes.
#
# Links: after the stateful phase link_coverage.py prints "links covered: N/M", M being every
# link of the served /api/v1/openapi.json (OpenAPI `links`, see control-plane's
# routes/openapi/links.rs) and N those a scenario followed with the link's ids applied. The long
# form fails unless N = M. The smoke form starts every scenario from `POST /session/` (the only
# root: DAIV_FUZZ_STATEFUL_ROOTS, see hooks.py), as a client does, and fails unless it followed
# every link of a create's answer: what a client does with a session it just created.
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
deployment="apifuzz-$$"
# A directory of its own: runs side by side (worktrees sharing a CARGO_TARGET_DIR) would
# otherwise write, and count links from, each other's reports. The five newest are kept.
out="$target_dir/api-fuzz/$deployment"
mkdir -p "$out"
find "$target_dir/api-fuzz" -mindepth 1 -maxdepth 1 -type d -name 'apifuzz-*' -printf '%T@ %p\n' |
    sort -rn | tail -n +6 | cut -d' ' -f2- | xargs -r rm -rf
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
# One operation at a time unless API_FUZZ_WORKERS says more (each worker gets a live session of
# its own, see hooks.py). Two saved a quarter of the smoke's time, but race CPython 3.11's `ast`
# in hypothesis's lambda descriptions ("AST constructor recursion depth mismatch", a runtime error
# in the coverage phase of a full run). The stateful phase stays one scenario at a time.
"${st[@]}" --workers "${API_FUZZ_WORKERS:-1}" --phases examples,coverage,fuzzing || rc=$?

# The document the links are counted from: the one served (and fuzzed).
curl -fsS "$SERVICE_URL/api/v1/openapi.json" -o "$out/openapi.json"
events="$out/events-stateful.ndjson"
rm -f "$events"
if $smoke; then
    echo "api-fuzz: stateful phase (the document's links, every scenario from POST /session/), at most $stateful s"
    export DAIV_FUZZ_STATEFUL_ROOTS="POST /session/"
    # Every link of a create's answer (run, status, close, seed, the file and process routes, the
    # listing, info, timeout, metrics, snapshot, fork): the phase's first scenario follows them
    # all in a few seconds (see schemathesis.toml's max-steps). The links further on (a started
    # process's poll, a seed's, a fork's, a snapshot's) are mostly followed too, by the scenarios
    # after it, but a loaded machine does not reach each of them in 30 s.
    required=(--require 'create>*')
else
    echo "api-fuzz: stateful phase (the document's links), at most $stateful s"
    required=(--require all)
fi
"${st[@]}" --phases stateful --max-time "$stateful" --report-junit-path "$out/junit-stateful.xml" \
    --report-ndjson-path "$events" || rc=$?
"$venv/bin/python" "$here/link_coverage.py" "$out/openapi.json" "$events" "${required[@]}" || rc=1
exit "$rc"
