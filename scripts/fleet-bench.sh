#!/usr/bin/env bash
# The fleet's targets, measured: what a remote engine and placement add to the hot path, and how
# a dead or frozen engine is noticed and survived. Runs the release build against the DinD engines
# of scripts/fleet-engines.sh (started if they are not running) and prints two tables.
#
#   scripts/fleet-bench.sh [--runs N] [--n N] [--only hot|death] [--no-pool] [--out DIR]
#
# 1. Hot path: `cp-bench --sections create,commands,fs,stream,process --docker none` (no floors:
#    they need the engine's local socket) against three services started in turn, each with a
#    fresh deployment and caches dropped before it:
#      A  no engines file (the single local engine of today);
#      B  an engines file listing only the local engine, as default (placement, health checks and
#         the fleet's machinery on the same engine: what they add to a create);
#      C  an engines file listing only engine b (sessions on a remote engine over mutual TLS).
#    Plus (unless --no-pool) pool-bench's `pool claim` row, a create from a warm pool of 4, on a
#    second instance of each: a create of ~5 ms where placement's own cost would show; and the
#    same claims as the service's request log times them (every claim of pool-bench's phases,
#    ~45 per run, without the client's noise).
#    Printed: each row's p50 for A, B, C and B−A, C−A (the median over --runs runs, and the
#    range), then the targets: a command on a remote engine ≤ 2 ms more than local; placement
#    adds ≤ 1 ms to a create.
# 2. Engine death: a service over [a, b] with a session on b. Faults, in turn: `kill b` (the
#    engine's container dies: its connections drop, its address stops answering) and `pause b`
#    (frozen: TCP accepted, never answered).
#    GET /engines/ is polled every 50 ms from the fault until b reads `down`; `run true` and
#    `fs ls` on b's session are issued in two loops for 10 s from the fault (the longest any one
#    waited is reported, with their status codes) and a `sleep 30` run is in flight when the fault
#    lands. Then b is started (unpaused) again and the time until b is `up` and the session
#    answers 200 (its workspace file intact) is measured. Targets: death noticed ≤ 5 s; no
#    request waits more than 10 s.
#
# Needs root (drop_caches, the engines), jq, curl and the release build:
#   cargo build --release -p control-plane -p integration     (target/release/daiv-sandbox,
#   cp-bench, pool-bench; the helper at target/helper/daiv-sandbox-helper, `make helper`)
# Nothing else should run on the machine meanwhile (2 cores). Takes about 2.7 minutes per hot-path
# run and 1 for the deaths (9 minutes with the defaults).
#
# Everything it starts goes at the end, pass or fail: the services (by pid), every session
# (cp-bench and pool-bench force-delete theirs; this script its own), and then anything still
# labelled with one of its deployments on the host or an engine is removed and reported as a leak
# (exit 1). Engine b is started / unpaused again if a fault left it down. The engines a, b, c stay
# up. Objects of other deployments are left alone (their count is printed when there are any).
#
# Env: FLEET_BENCH_RUNS (3), FLEET_BENCH_N (20), FLEET_BENCH_SECTIONS
#      (create,commands,fs,stream,process), FLEET_BENCH_IMAGE (daiv-sandbox-busybox:local),
#      FLEET_BENCH_WINDOW (10, seconds of requests after a fault), FLEET_BENCH_OUT (results: the
#      services' logs, cp-bench/pool-bench output, the raw samples; default
#      /var/tmp/daiv-fleet-bench/<time>, kept), DAIV_SANDBOX_BIN / CP_BENCH_BIN / POOL_BENCH_BIN /
#      DAIV_SANDBOX_HELPER_BIN (the binaries), plus fleet-engines.sh's (FLEET_DIR, FLEET_IMAGES).
set -euo pipefail
here=$(dirname "$(readlink -f "$0")")
root=$(cd "$here/.." && pwd)
# shellcheck source=scripts/lib.sh
. "$here/lib.sh"

RUNS=${FLEET_BENCH_RUNS:-3}
N=${FLEET_BENCH_N:-20}
SECTIONS=${FLEET_BENCH_SECTIONS:-create,commands,fs,stream,process}
IMAGE=${FLEET_BENCH_IMAGE:-daiv-sandbox-busybox:local}
WINDOW=${FLEET_BENCH_WINDOW:-10}
OUT=${FLEET_BENCH_OUT:-/var/tmp/daiv-fleet-bench/$(date +%Y%m%d-%H%M%S)}
BIN=${DAIV_SANDBOX_BIN:-$root/target/release/daiv-sandbox}
CP_BENCH=${CP_BENCH_BIN:-$root/target/release/cp-bench}
POOL_BENCH=${POOL_BENCH_BIN:-$root/target/release/pool-bench}
HELPER=${DAIV_SANDBOX_HELPER_BIN:-$root/target/helper/daiv-sandbox-helper}
FLEET=$here/fleet-engines.sh
POOL=1
ONLY=
ENGINES=(a b c)

usage() {
    sed -n '/^#   scripts\/fleet-bench.sh/p' "$0" | sed 's/^# *//' >&2
    echo "(see the comments at the top of $0)" >&2
    exit 2
}

while [ "$#" -gt 0 ]; do
    case $1 in
    --runs) RUNS=${2:?}; shift 2 ;;
    --n) N=${2:?}; shift 2 ;;
    --only) ONLY=${2:?}; shift 2 ;;
    --no-pool) POOL=0; shift ;;
    --out) OUT=${2:?}; shift 2 ;;
    -h | --help) usage ;;
    *) usage ;;
    esac
done
case $ONLY in "" | hot | death) ;; *) usage ;; esac
[[ $RUNS =~ ^[1-9][0-9]*$ && $N =~ ^[1-9][0-9]*$ && $WINDOW =~ ^[1-9][0-9]*$ ]] \
    || die "--runs, --n and FLEET_BENCH_WINDOW must be positive integers"

need_root
for tool in jq curl ss; do
    command -v "$tool" >/dev/null || die "$tool is needed"
done
for f in "$BIN" "$CP_BENCH" "$HELPER" $([ "$POOL" -eq 1 ] && echo "$POOL_BENCH"); do
    [ -x "$f" ] || die "$f missing: cargo build --release -p control-plane -p integration (and make helper)"
done
mkdir -p "$OUT"
KEY=fleet-bench-$(head -c 12 /dev/urandom | od -An -tx1 | tr -d ' \n')
say() { echo "fleet-bench: $*" >&2; }

# ---- cleanup -------------------------------------------------------------------------------------

SERVICES=()    # pids of the services started
BACKGROUND=()  # pids of this script's background loops
DEPLOYMENTS=() # every deployment a service ran as
B_FAULT=       # kill | pause while engine b is faulted by us
LEAKS=0

# engine_docker NAME ARGS...: the docker CLI of the host (NAME=local) or of a fleet engine.
engine_docker() {
    local name=$1
    shift
    if [ "$name" = local ]; then
        docker "$@"
    else
        timeout 20 "$FLEET" docker "$name" "$@"
    fi
}

# leftovers DEPLOYMENT: "engine kind id" per object of the deployment on the host and each engine.
leftovers() {
    local dep=$1 e label="label=daiv.sandbox.deployment=$1"
    for e in local "${ENGINES[@]}"; do
        if [ "$e" != local ] && ! timeout 5 "$FLEET" docker "$e" version >/dev/null 2>&1; then
            echo "$e unreachable -"
            continue
        fi
        engine_docker "$e" ps -aq --no-trunc --filter "$label" 2>/dev/null | sed "s/^/$e container /"
        engine_docker "$e" network ls -q --no-trunc --filter "$label" 2>/dev/null | sed "s/^/$e network /"
        engine_docker "$e" volume ls -q --filter "$label" 2>/dev/null | sed "s/^/$e volume /"
        engine_docker "$e" images -aq --no-trunc --filter "$label" 2>/dev/null | sort -u | sed "s/^/$e image /"
    done
}

# sweep DEPLOYMENT: remove what is left of it; a leak is reported (and counted).
sweep() {
    local dep=$1 left e kind id
    left=$(leftovers "$dep" | grep -v ' unreachable -$' || true)
    [ -n "$left" ] || return 0
    echo "fleet-bench: LEAK: left by deployment $dep (removed now):" >&2
    printf '  %s\n' "${left//$'\n'/$'\n'  }" >&2
    LEAKS=$((LEAKS + $(wc -l <<<"$left")))
    while read -r e kind id; do
        case $kind in
        container) engine_docker "$e" rm -f -v "$id" >/dev/null 2>&1 || true ;;
        esac
    done <<<"$left"
    while read -r e kind id; do
        case $kind in
        network) engine_docker "$e" network rm "$id" >/dev/null 2>&1 || true ;;
        volume) engine_docker "$e" volume rm -f "$id" >/dev/null 2>&1 || true ;;
        image) engine_docker "$e" rmi -f "$id" >/dev/null 2>&1 || true ;;
        esac
    done <<<"$left"
}

stop_pid() { # stop_pid PID: SIGINT, then SIGKILL after 15 s
    local pid=$1 i
    kill -0 "$pid" 2>/dev/null || { wait "$pid" 2>/dev/null || true; return 0; }
    kill -INT "$pid" 2>/dev/null || true
    for i in $(seq 150); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
}

heal_b() { # engine b running and answering again
    case $B_FAULT in
    pause) "$FLEET" unpause b >/dev/null 2>&1 || true ;;
    esac
    if [ -n "$B_FAULT" ]; then
        "$FLEET" start b >/dev/null 2>&1 || echo "fleet-bench: warning: engine b did not come back" >&2
    fi
    B_FAULT=
}

cleanup() {
    local rc=$? pid dep
    trap - EXIT INT TERM
    for pid in "${BACKGROUND[@]}"; do
        pkill -P "$pid" 2>/dev/null || true
        kill "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    done
    heal_b
    for pid in "${SERVICES[@]}"; do stop_pid "$pid"; done
    for dep in "${DEPLOYMENTS[@]}"; do sweep "$dep"; done
    if [ "$LEAKS" -gt 0 ]; then
        echo "fleet-bench: $LEAKS object(s) leaked (removed); logs in $OUT" >&2
        [ "$rc" -ne 0 ] || rc=1
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ---- services ------------------------------------------------------------------------------------

free_port() {
    local p
    while :; do
        p=$((20000 + RANDOM % 20000))
        [ -z "$(ss -Htln "sport = :$p")" ] && { echo "$p"; return; }
    done
}

drop_caches() { sync; echo 3 >/proc/sys/vm/drop_caches; }

# start_service LABEL ENGINES_FILE|- [VAR=VALUE...]: a service on a free loopback port with a
# fresh deployment, ready (every engine of its file up); sets URL, PID, DEP.
start_service() {
    local label=$1 file=$2 port i body want got
    shift 2
    port=$(free_port)
    DEP=fleet-bench-$$-$label-$RANDOM
    DEPLOYMENTS+=("$DEP")
    URL=http://127.0.0.1:$port
    local env=(DAIV_SANDBOX_API_KEY="$KEY" DAIV_SANDBOX_HOST=127.0.0.1 DAIV_SANDBOX_PORT="$port"
        DAIV_SANDBOX_ENVIRONMENT=local DAIV_SANDBOX_DEPLOYMENT="$DEP"
        DAIV_SANDBOX_REAPER_ENABLED=false DAIV_SANDBOX_HELPER_BIN="$HELPER" "$@")
    [ "$file" = - ] || env+=(DAIV_SANDBOX_ENGINES_FILE="$file")
    # Only these settings: none inherited from the caller's environment.
    local unset=()
    for v in $(compgen -e | grep -E '^(DAIV_SANDBOX_|DOCKER_HOST$|DOCKER_TLS|DOCKER_CERT)' || true); do
        unset+=(-u "$v")
    done
    env "${unset[@]}" "${env[@]}" "$BIN" >"$OUT/service-$label.log" 2>&1 </dev/null &
    PID=$!
    SERVICES+=("$PID")
    want=1
    [ "$file" = - ] || want=$(jq '.engines | length' "$file")
    for i in $(seq 300); do
        kill -0 "$PID" 2>/dev/null || {
            tail -n 30 "$OUT/service-$label.log" >&2
            die "service $label exited at start (log: $OUT/service-$label.log)"
        }
        body=$(curl -s -m 2 -H "X-API-Key: $KEY" "$URL/api/v1/engines/" 2>/dev/null || true)
        [ -n "$body" ] || body='{}'
        got=$(jq -r '[.engines[]? | select(.state == "up")] | length' <<<"$body" 2>/dev/null || echo 0)
        [ "$got" = "$want" ] && return 0
        sleep 0.1
    done
    die "service $label: its engines were not all up within 30 s: $body (log: $OUT/service-$label.log)"
}

stop_service() { # stop_service LABEL: the last started service (PID); then its leftovers
    stop_pid "$PID"
    local s=() p
    for p in "${SERVICES[@]}"; do [ "$p" = "$PID" ] || s+=("$p"); done
    SERVICES=("${s[@]}")
    sweep "$DEP"
}

# ---- the engines ---------------------------------------------------------------------------------

say "engines a b c (scripts/fleet-engines.sh up)"
FLEET_IMAGES=${FLEET_IMAGES:-daiv-sandbox-busybox:local daiv-sandbox-egress:local} \
    "$FLEET" up "${ENGINES[@]}" >"$OUT/engines-all.json"
jq -e --arg img "$IMAGE" '.engines | length == 3' "$OUT/engines-all.json" >/dev/null \
    || die "fleet-engines.sh up printed no engines file"
jq '{engines: [{name: "local", endpoint: "unix:///var/run/docker.sock", default: true}]}' \
    -n >"$OUT/engines-local.json"
jq '{engines: [.engines[] | select(.name == "b")]}' "$OUT/engines-all.json" >"$OUT/engines-b.json"
jq '{engines: [.engines[] | select(.name == "a" or .name == "b")]}' "$OUT/engines-all.json" \
    >"$OUT/engines-ab.json"
# What other deployments hold (not ours: never touched, only counted).
others=$(
    for e in local "${ENGINES[@]}"; do
        engine_docker "$e" ps -aq --filter label=daiv.sandbox.managed=true 2>/dev/null | sed "s/^/$e /"
    done | wc -l
)
[ "$others" -eq 0 ] || say "note: $others container(s) of other deployments on the host and the engines (left alone)"
{
    echo "commit $(git -C "$root" rev-parse --short HEAD 2>/dev/null)$(git -C "$root" diff --quiet 2>/dev/null || echo ' (work tree dirty)')"
    echo "work-tree diff sha1 $(git -C "$root" diff 2>/dev/null | sha1sum | cut -c1-12)"
    echo "binary $(stat -c '%y' "$BIN")"
    echo "runs $RUNS n $N sections $SECTIONS image $IMAGE window ${WINDOW}s"
} >"$OUT/about.txt"

# ---- 1. the hot path -----------------------------------------------------------------------------

CONFIGS=(A B C)
declare -A FILE_OF=([A]=- [B]="$OUT/engines-local.json" [C]="$OUT/engines-b.json")
declare -A NAME_OF=([A]="no engines file" [B]="file [local, default]" [C]="file [b] (TLS)")

hot_path() {
    local r cfg json
    : >"$OUT/hot.tsv"
    : >"$OUT/engine-calls.tsv"
    for r in $(seq "$RUNS"); do
        for cfg in "${CONFIGS[@]}"; do
            say "hot path, run $r/$RUNS: $cfg (${NAME_OF[$cfg]}): cp-bench --n $N"
            drop_caches
            start_service "hot$r$cfg" "${FILE_OF[$cfg]}"
            if ! "$CP_BENCH" --base "$URL" --key "$KEY" --image "$IMAGE" --n "$N" --docker none \
                --sections "$SECTIONS" >"$OUT/cp-bench-$r$cfg.txt" 2>"$OUT/cp-bench-$r$cfg.err"; then
                tail -n 20 "$OUT/cp-bench-$r$cfg.err" >&2
                die "cp-bench failed against $cfg (log: $OUT/service-hot$r$cfg.log)"
            fi
            # Every Docker API call the service made, timed per op (sum and count).
            curl -s -m 10 -H "X-API-Key: $KEY" "$URL/metrics" \
                | awk -v c="$cfg" '/^daiv_sandbox_engine_call_duration_seconds_(sum|count)\{/ {
                        match($0, /op="[^"]*"/); op = substr($0, RSTART + 4, RLENGTH - 5)
                        kind = ($0 ~ /_sum\{/) ? "sum" : "count"
                        print c "\t" op "\t" kind "\t" $NF }' >>"$OUT/engine-calls.tsv" || true
            stop_service
            json=$(sed -n '/^{/,$p' "$OUT/cp-bench-$r$cfg.txt")
            jq -r --arg r "$r" --arg c "$cfg" '.results[] | [$r, $c, .op, .p50_ms] | @tsv' \
                <<<"$json" >>"$OUT/hot.tsv"
            [ "$POOL" -eq 1 ] || continue
            say "hot path, run $r/$RUNS: $cfg: warm-pool claims (pool-bench)"
            drop_caches
            start_service "pool$r$cfg" "${FILE_OF[$cfg]}" \
                DAIV_SANDBOX_WARM_POOL="$IMAGE=4" DAIV_SANDBOX_WARM_POOL_REMOVE_ON_SHUTDOWN=true
            # The "cold" phase runs on the same instance (its pool): only `pool claim` is read.
            if ! "$POOL_BENCH" --pool-base "$URL" --cold-base "$URL" --key "$KEY" --image "$IMAGE" \
                --n "$N" --pool-size 4 >"$OUT/pool-bench-$r$cfg.txt" 2>"$OUT/pool-bench-$r$cfg.err"; then
                tail -n 20 "$OUT/pool-bench-$r$cfg.err" >&2
                die "pool-bench failed against $cfg (log: $OUT/service-pool$r$cfg.log)"
            fi
            stop_service
            tail -n 1 "$OUT/pool-bench-$r$cfg.txt" | jq -r --arg r "$r" --arg c "$cfg" \
                '.phases[] | select(.phase == "pool claim") | [$r, $c, "create (warm-pool claim)", .p50_ms] | @tsv' \
                >>"$OUT/hot.tsv"
            # The same claims (and those of pool-bench's other phases) as the service timed them:
            # the request line after each `session claimed from the warm pool`.
            sed 's/\x1b\[[0-9;]*m//g' "$OUT/service-pool$r$cfg.log" | awk '
                /claimed from the warm pool/ { c = 1; next }
                c && /route=\/session\/ status=200/ { match($0, /elapsed_ms=[0-9.]+/); print substr($0, RSTART + 11, RLENGTH - 11); c = 0 }' \
                | sort -n | awk -v r="$r" -v c="$cfg" '{ a[NR] = $1 }
                    END { if (NR) printf "%s\t%s\tclaim (service-side timing)\t%s\n", r, c, a[int((NR + 1) / 2)] }' \
                >>"$OUT/hot.tsv"
        done
    done
}

# The table: per row and config the median of the runs' p50s [min–max], and B−A, C−A.
hot_table() {
    echo
    echo "Hot path: p50 in ms, median of $RUNS run(s) [min-max over runs]; $N samples per row and run"
    echo "  (claim rows: pool-bench's paced claims, pool of 4; the service-side row every claim of its run)"
    echo "  A = ${NAME_OF[A]}, B = ${NAME_OF[B]}, C = ${NAME_OF[C]}"
    awk -F'\t' -v runs="$RUNS" '
        function med(s,   a, n, i, j, t) {
            n = split(s, a, " ")
            for (i = 2; i <= n; i++) { t = a[i]; for (j = i - 1; j >= 1 && a[j] + 0 > t + 0; j--) a[j + 1] = a[j]; a[j + 1] = t }
            lo = a[1]; hi = a[n]
            return (n % 2) ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
        }
        { if (!($3 in seen)) { seen[$3] = 1; order[++k] = $3 }; v[$3, $2] = v[$3, $2] " " $4 }
        END {
            cf = (runs > 1) ? "%22s" : "%10s"
            printf("%-28s " cf " " cf " " cf " %8s %8s\n", "row", "A", "B", "C", "B-A", "C-A")
            for (i = 1; i <= k; i++) {
                op = order[i]; line = sprintf("%-28s", op)
                for (c = 1; c <= 3; c++) {
                    cfg = substr("ABC", c, 1)
                    if ((op, cfg) in v) {
                        m[cfg] = med(v[op, cfg]); have[cfg] = 1
                        cell = (runs > 1) ? sprintf("%.1f [%.1f-%.1f]", m[cfg], lo, hi) : sprintf("%.1f", m[cfg])
                    } else { have[cfg] = 0; cell = "-" }
                    line = line sprintf(" " cf, cell)
                }
                line = line sprintf(" %8s", (have["A"] && have["B"]) ? sprintf("%+.1f", m["B"] - m["A"]) : "-")
                line = line sprintf(" %8s", (have["A"] && have["C"]) ? sprintf("%+.1f", m["C"] - m["A"]) : "-")
                print line
                if (have["A"] && have["C"]) dc[op] = m["C"] - m["A"]
                if (have["A"] && have["B"]) db[op] = m["B"] - m["A"]
            }
            print ""
            print "Targets"
            if ("run true" in dc)
                printf "  a command on a remote engine <= 2 ms more than local: run true C-A = %+.1f ms: %s\n", dc["run true"], (dc["run true"] <= 2) ? "met" : "MISSED"
            if ("fs read" in dc)
                printf "    (fs read C-A = %+.1f ms, first run true C-A = %+.1f ms, create session C-A = %+.1f ms)\n", dc["fs read"], dc["first run true"], dc["create session"]
            if ("create session" in db) {
                printf "  placement adds <= 1 ms to a create: create session B-A = %+.1f ms", db["create session"]
                if ("create (warm-pool claim)" in db) printf ", warm-pool claim B-A = %+.1f ms", db["create (warm-pool claim)"]
                if ("claim (service-side timing)" in db) printf " (as the service times it: %+.1f ms)", db["claim (service-side timing)"]
                ok = ("create (warm-pool claim)" in db) ? db["create (warm-pool claim)"] <= 1 : db["create session"] <= 1
                printf ": %s\n", ok ? "met" : "MISSED"
                print "    (a cold create moves by several ms between runs on this machine; the claim row resolves 1 ms)"
            }
        }' "$OUT/hot.tsv"
    echo
    echo "Where the time goes: the service's Docker API calls during cp-bench (its metrics), mean ms per call"
    echo "  (calls per run in brackets; health checks included: ping, list, info)"
    awk -F'\t' -v runs="$RUNS" '
        { if (!($2 in seen)) { seen[$2] = 1; order[++k] = $2 }; v[$1, $2, $3] += $4 }
        END {
            printf "%-16s %18s %18s %18s\n", "call", "A", "B", "C"
            for (i = 1; i <= k; i++) {
                op = order[i]; line = sprintf("%-16s", op)
                for (c = 1; c <= 3; c++) {
                    cfg = substr("ABC", c, 1); n = v[cfg, op, "count"]
                    line = line sprintf(" %18s", n > 0 ? sprintf("%.2f [%d]", 1000 * v[cfg, op, "sum"] / n, n / runs) : "-")
                }
                print line
            }
        }' "$OUT/engine-calls.tsv"
}

# ---- 2. engine death -----------------------------------------------------------------------------

now() { echo "${EPOCHREALTIME/./}"; } # microseconds

api() { # api METHOD PATH [JSON]: prints "CODE BODY"
    local m=$1 p=$2 d=${3:-}
    if [ -n "$d" ]; then
        curl -s -m 60 -w '\n%{http_code}' -X "$m" -H "X-API-Key: $KEY" -H 'content-type: application/json' \
            -d "$d" "$URL/api/v1$p"
    else
        curl -s -m 60 -w '\n%{http_code}' -X "$m" -H "X-API-Key: $KEY" "$URL/api/v1$p"
    fi
}

# poll_b OUT STOPFILE: GET /engines/ every 50 ms: "t_us state_of_b" lines.
poll_b() {
    local out=$1 stop=$2 body t s
    while [ ! -e "$stop" ]; do
        t=$(now)
        body=$(curl -s -m 5 -H "X-API-Key: $KEY" "$URL/api/v1/engines/" 2>/dev/null || true)
        s='?'
        [[ $body =~ \"name\":\"b\",\"state\":\"([a-z]+)\" ]] && s=${BASH_REMATCH[1]}
        echo "$t $s" >>"$out"
        sleep 0.05
    done
}

# hammer OUT END_US METHOD PATH JSON: the request in a loop until END_US: "t_us code seconds" lines
# in OUT; the first answer with each status code in OUT.CODE.body.
hammer() {
    local out=$1 end=$2 m=$3 p=$4 d=$5 t r code
    while [ "$(now)" -lt "$end" ]; do
        t=$(now)
        r=$(curl -s -o "$out.last" -m 120 -w '%{http_code} %{time_total}' -X "$m" -H "X-API-Key: $KEY" \
            -H 'content-type: application/json' -d "$d" "$URL/api/v1$p" 2>/dev/null || true)
        echo "$t ${r:-000 0}" >>"$out"
        code=${r%% *}
        [ -e "$out.${code:-000}.body" ] || mv -f "$out.last" "$out.${code:-000}.body" 2>/dev/null || true
    done
    rm -f "$out.last"
}

# fault KIND (kill|pause) SESSION: one fault of engine b and its recovery; appends a result row.
fault() {
    local kind=$1 id=$2 dir="$OUT/death-$1" t0 end stop t_fault t_heal t_answers down_at up_at ok_at r code body i
    local alive exit_code
    mkdir -p "$dir"
    stop=$dir/stop
    rm -f "$stop"
    # The session answers before the fault.
    r=$(api POST "/session/$id/" '{"commands":["cat fleet-bench-marker"]}')
    [ "$(tail -n 1 <<<"$r")" = 200 ] || die "session $id before the $kind: $r"
    t0=$(now)
    end=$((t0 + 500000 + WINDOW * 1000000))
    poll_b "$dir/engines.txt" "$stop" &
    BACKGROUND+=("$!")
    hammer "$dir/run.txt" "$end" POST "/session/$id/" '{"commands":["true"]}' &
    BACKGROUND+=("$!")
    hammer "$dir/fs.txt" "$end" POST "/session/$id/fs/ls/" '{"path":"/workspace"}' &
    BACKGROUND+=("$!")
    # A long run in flight when the fault lands (it would take 30 s on a live engine).
    (
        t=$(now)
        r=$(curl -s -o "$dir/inflight.body" -m 120 -w '%{http_code} %{time_total}' -X POST -H "X-API-Key: $KEY" \
            -H 'content-type: application/json' -d '{"commands":["sleep 30"]}' \
            "$URL/api/v1/session/$id/" 2>/dev/null || true)
        echo "$t ${r:-000 0}" >"$dir/inflight.txt"
    ) &
    BACKGROUND+=("$!")
    sleep 0.5
    t_fault=$(now)
    B_FAULT=$kind
    "$FLEET" "$kind" b
    echo "$t_fault" >"$dir/t_fault"
    # Until the window ends (and b read down, or 30 s).
    while [ "$(now)" -lt "$end" ] || { ! grep -q ' down$' "$dir/engines.txt" 2>/dev/null && [ "$(now)" -lt $((t_fault + 30000000)) ]; }; do
        sleep 0.2
    done
    touch "$stop"
    for i in "${BACKGROUND[@]}"; do wait "$i" 2>/dev/null || true; done
    BACKGROUND=()
    # Back: start (or thaw) b; until b is up, then until the session answers with its file.
    t_heal=$(now)
    if [ "$kind" = pause ]; then
        "$FLEET" unpause b
    else
        "$FLEET" start b
    fi
    B_FAULT=
    t_answers=$(now)
    up_at=
    ok_at=
    : >"$dir/recovery.txt"
    while [ "$(now)" -lt $((t_heal + 120000000)) ]; do
        if [ -z "$up_at" ]; then
            body=$(curl -s -m 5 -H "X-API-Key: $KEY" "$URL/api/v1/engines/" 2>/dev/null || true)
            [[ $body =~ \"name\":\"b\",\"state\":\"up\" ]] && up_at=$(now)
        fi
        r=$(api POST "/session/$id/" '{"commands":["cat fleet-bench-marker"]}')
        code=$(tail -n 1 <<<"$r")
        echo "$(now) $code $(head -n -1 <<<"$r" | head -c 300 | tr '\n' ' ')" >>"$dir/recovery.txt"
        if [ "$code" = 200 ]; then
            ok_at=$(now)
            break
        fi
        sleep 0.1
    done
    [ -n "$up_at" ] || up_at=${ok_at:-}
    # Is the `sleep 30` that was in flight still running in the session (a frozen engine thawed)?
    r=$(api POST "/session/$id/" "{\"commands\":[\"cat /proc/[0-9]*/stat 2>/dev/null | grep -c '(sleep)' || true\"]}")
    alive=$(head -n -1 <<<"$r" | jq -r '.results[0].output // "?"' 2>/dev/null | tr -d '[:space:]')
    exit_code=$(jq -r '.results[0].exit_code // .detail // "?"' "$dir/inflight.body" 2>/dev/null || echo '?')
    down_at=$(awk '$2 == "down" { print $1; exit }' "$dir/engines.txt")
    # The row.
    awk -v kind="$kind" -v tf="$t_fault" -v down="${down_at:-}" -v th="$t_heal" -v ta="$t_answers" \
        -v up="${up_at:-}" -v ok="${ok_at:-}" -v window="$WINDOW" \
        -v kept="$(grep -q 'fleet-bench-ok' <<<"$(tail -n 1 "$dir/recovery.txt")" && echo yes || echo NO)" \
        -v inflight="$(cat "$dir/inflight.txt" 2>/dev/null)" -v runf="$dir/run.txt" -v fsf="$dir/fs.txt" \
        -v xc="$exit_code" -v alive="${alive:-?}" '
        function load(f, label,   line, a) {
            while ((getline line < f) > 0) {
                split(line, a, " ")
                if (a[1] + a[3] * 1e6 < tf) continue  # ended before the fault
                n[label]++; codes[label, a[2]]++
                if (a[3] > worst[label]) worst[label] = a[3]
                if (!((label, a[2]) in seenc)) { seenc[label, a[2]] = 1; cl[label] = cl[label] " " a[2] }
            }
        }
        function summary(label,   s, i, c, k) {
            k = split(cl[label], c, " "); s = ""
            for (i = 1; i <= k; i++) s = s (s == "" ? "" : ",") c[i] "x" codes[label, c[i]]
            return sprintf("%d (%s), longest %.2f s", n[label], s, worst[label])
        }
        BEGIN {
            load(runf, "run"); load(fsf, "fs")
            split(inflight, f, " ")
            printf "%s|%s|%s|%s|%s|%s|%s|%s|%s|%s\n", kind,
                (down == "") ? "not within 30 s" : sprintf("%.2f s", (down - tf) / 1e6),
                summary("run"), summary("fs"),
                (inflight == "") ? "-" : sprintf("%s (exit_code %s) after %.2f s", f[2], xc, f[3] - (tf - f[1]) / 1e6),
                alive,
                sprintf("%.2f s", (ta - th) / 1e6),
                (up == "") ? "never" : sprintf("%.2f s", (up - th) / 1e6),
                (ok == "") ? "never (120 s)" : sprintf("%.2f s", (ok - th) / 1e6), kept
            w = (worst["run"] > worst["fs"]) ? worst["run"] : worst["fs"]
            if (f[3] > w) w = f[3]
            printf "%s %s %s\n", kind, (down == "") ? 1e9 : (down - tf) / 1e6, w > "/dev/stderr"
        }' >>"$OUT/death.rows" 2>>"$OUT/death.worst"
}

death() {
    local r id code _
    : >"$OUT/death.rows"
    : >"$OUT/death.worst"
    say "engine death: a service over [a, b]"
    drop_caches
    start_service death "$OUT/engines-ab.json" DAIV_SANDBOX_LOG_LEVEL=DEBUG
    # A session on b (placement picks; the ones on a go at once).
    id=
    for _ in $(seq 20); do
        r=$(api POST /session/ "{\"base_image\":\"$IMAGE\"}")
        code=$(tail -n 1 <<<"$r")
        [ "$code" = 200 ] || [ "$code" = 201 ] || die "create: $r"
        id=$(head -n -1 <<<"$r" | jq -r .session_id)
        [[ $id == b.* ]] && break
        api DELETE "/session/$id/?force=true" >/dev/null
        id=
    done
    [ -n "$id" ] || die "no session landed on b in 20 creates"
    echo "$id" >"$OUT/death-session"
    r=$(api POST "/session/$id/" '{"commands":["echo fleet-bench-ok > fleet-bench-marker"]}')
    [ "$(tail -n 1 <<<"$r")" = 200 ] || die "the session's first run: $r"
    for kind in kill pause; do
        say "engine death: $kind b, ${WINDOW} s of requests on $id, then b back"
        fault "$kind" "$id"
    done
    r=$(api DELETE "/session/$id/?force=true")
    [ "$(tail -n 1 <<<"$r")" = 204 ] || say "warning: force delete of $id: $r"
    stop_service
}

death_table() {
    echo
    echo "Engine death: service over [a, b], session on b; requests in two loops for ${WINDOW} s from the fault"
    echo "  (codes x count; 'longest' = the longest one request waited; times from the fault / from b's restart)"
    # One column per fault.
    awk -F'|' '
        BEGIN {
            split("fault|b down (GET /engines/) after the fault|run true loop: requests (codes)|fs ls loop: requests (codes)|in-flight sleep 30: answered|sleeps alive in the session after|b answers docker after its restart|b up in GET /engines/ after its restart|session answers 200 after its restart|workspace file kept", name, "|")
        }
        { for (i = 1; i <= NF; i++) cell[NR, i] = $i; if (NF > nf) nf = NF; rows = NR }
        END {
            for (i = 1; i <= nf; i++) {
                line = sprintf("  %-40s", name[i])
                for (r = 1; r <= rows; r++) line = line sprintf("  %-42s", cell[r, i])
                print line
            }
        }' "$OUT/death.rows"
    echo
    echo "Targets"
    awk '{ d = $2 > d ? $2 : d; w = $3 > w ? $3 : w }
        END {
            printf "  death noticed <= 5 s: slowest %s: %s\n", (d >= 1e9) ? "never" : sprintf("%.2f s", d), (d <= 5) ? "met" : "MISSED"
            printf "  no request waits more than 10 s: longest %.2f s: %s\n", w, (w <= 10) ? "met" : "MISSED"
        }' "$OUT/death.worst"
}

# ---- run -----------------------------------------------------------------------------------------

say "results and logs in $OUT"
[ "$ONLY" = death ] || hot_path
[ "$ONLY" = hot ] || death
# Nothing of ours on any engine (the sweeps above removed and reported any leak).
for dep in "${DEPLOYMENTS[@]}"; do sweep "$dep"; done
DEPLOYMENTS=()
[ "$ONLY" = death ] || hot_table | tee "$OUT/hot-table.txt"
[ "$ONLY" = hot ] || death_table | tee "$OUT/death-table.txt"
echo
echo "Leaks: $LEAKS object(s) of this run left on the host or the engines$( [ "$LEAKS" -eq 0 ] || echo ' (removed)'); results in $OUT"
