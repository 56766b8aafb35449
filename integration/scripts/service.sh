# shellcheck shell=bash
# Shared by integration/schemathesis/run.sh and integration/scripts/soak.sh: build and start the
# control plane on a free loopback port under a deployment name of its own, then remove (and
# count) what that deployment left in Docker. Source it; don't run it.
#
# Builds go to $CARGO_TARGET_DIR (default target/); SERVICE_PROFILE=debug|release (release).

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
target_dir="${CARGO_TARGET_DIR:-$root/target}"
SERVICE_PROFILE="${SERVICE_PROFILE:-release}"
LABEL_DEPLOYMENT=daiv.sandbox.deployment
LABEL_ROLE=daiv.sandbox.role

# build_service: the control plane and the static helper it gives every sandbox. SERVICE_PREBUILT=1
# (`make test`, after `make build`): already built with the workspace's features; a `-p` build
# here would rebuild much of the dependency graph with another feature set.
build_service() {
    [ "${SERVICE_PREBUILT:-0}" = 1 ] && return 0
    local flag=()
    [ "$SERVICE_PROFILE" = release ] && flag=(--release)
    (cd "$root" && cargo build --quiet "${flag[@]}" -p control-plane --bin daiv-sandbox)
    (cd "$root" && images/helper/build.sh)
}

# dev_key: the development API key (.dev/api-key, created like `make run` does).
dev_key() {
    mkdir -p "$root/.dev" && chmod 700 "$root/.dev"
    [ -s "$root/.dev/api-key" ] || (umask 077; head -c 24 /dev/urandom | base64 | tr -d '/+=' >"$root/.dev/api-key")
    cat "$root/.dev/api-key"
}

# dev_ca: the development egress CA (.dev/egress-ca.{crt,key}), made by the gateway image.
dev_ca() {
    [ -s "$root/.dev/egress-ca.key" ] && return 0
    docker run --rm --pull never --user "$(id -u):$(id -g)" -v "$root/.dev:/out" \
        daiv-sandbox-egress:local gen-ca --cert-out /out/egress-ca.crt --key-out /out/egress-ca.key >/dev/null
}

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# start_service DEPLOYMENT LOGFILE [VAR=VALUE...]: sets SERVICE_PID and SERVICE_URL (the
# origin, no prefix); extra settings go to the service's environment. Waits for health.
start_service() {
    local deployment=$1 log=$2
    shift 2
    local port key
    port=$(free_port)
    key=$(dev_key)
    # As the image runs it (see images/control-plane/Dockerfile): two malloc arenas.
    env MALLOC_ARENA_MAX="${MALLOC_ARENA_MAX:-2}" \
        DAIV_SANDBOX_API_KEY="$key" \
        DAIV_SANDBOX_ENVIRONMENT=local \
        DAIV_SANDBOX_HOST=127.0.0.1 \
        DAIV_SANDBOX_PORT="$port" \
        DAIV_SANDBOX_DEPLOYMENT="$deployment" \
        DAIV_SANDBOX_HELPER_BIN="$target_dir/helper/daiv-sandbox-helper" \
        "$@" \
        "$target_dir/$SERVICE_PROFILE/daiv-sandbox" >"$log" 2>&1 &
    SERVICE_PID=$!
    SERVICE_URL="http://127.0.0.1:$port"
    local i
    for i in $(seq 1 100); do
        if curl -fsS "$SERVICE_URL/-/health/" >/dev/null 2>&1; then
            return 0
        fi
        if ! kill -0 "$SERVICE_PID" 2>/dev/null; then
            echo "error: the service exited; its log:" >&2
            tail -n 30 "$log" >&2
            return 1
        fi
        sleep 0.2
    done
    echo "error: the service did not become healthy on $SERVICE_URL" >&2
    return 1
}

stop_service() {
    if [ -n "${SERVICE_PID:-}" ] && kill -0 "$SERVICE_PID" 2>/dev/null; then
        kill -TERM "$SERVICE_PID" 2>/dev/null || true
        local i
        for i in $(seq 1 50); do
            kill -0 "$SERVICE_PID" 2>/dev/null || break
            sleep 0.1
        done
        kill -KILL "$SERVICE_PID" 2>/dev/null || true
        wait "$SERVICE_PID" 2>/dev/null || true
    fi
    SERVICE_PID=
}

# What a deployment leaves, and what counts as a leak. Snapshots (see docs/api/snapshots.md)
# make Docker objects besides containers and networks: a record volume
# (`daiv-snapshot-<id>`, role `snapshot`), a payload of an image (`daiv-sandbox-snapshot:<id>`)
# and a data volume (`daiv-snapshot-<id>-data`, role `snapshot-data`; with, once its snapshot is
# deleted while a layer above it still needs it, `daiv-snapshot-<id>-held`, role `snapshot-held`,
# which goes with the data volume), and copy-on-write
# workspace volumes for the sessions made from one (`daiv-ws-<token>-merged|upper|work`, role
# `workspace`), which go with their session.
#
# Payload is not counted as a leak: the service frees it at a snapshot's DELETE only when nothing
# uses it, and leaves the rest (a fork's snapshot, which has no record, always; a snapshot deleted
# while a session made from it lived) to its reaper, once older than min(grace, 10 min). The runs
# here disable the reaper (REAPER_ENABLED=false: it would remove the stopped sessions the fuzzer
# still uses), and enabling it with a short grace would do the same, so collecting payload is
# this sweep's job: removed silently (its count goes to stderr). Everything else counts: a
# container, a network, a snapshot record (a snapshot nobody deleted: the hooks delete every one
# they saw and every one `GET /snapshots/` lists) and a workspace volume (its session was removed
# without it). A record's payload is reported through its record.

# deployment_objects DEPLOYMENT: the leaks, one a line: containers, networks and volumes other
# than snapshot data.
deployment_objects() {
    local by="label=$LABEL_DEPLOYMENT=$1" data
    docker ps -aq --filter "$by" | sed 's/^/container /'
    docker network ls -q --filter "$by" | sed 's/^/network /'
    data=$({
        docker volume ls -q --filter "$by" --filter "label=$LABEL_ROLE=snapshot-data"
        docker volume ls -q --filter "$by" --filter "label=$LABEL_ROLE=snapshot-held"
    } | sort)
    docker volume ls -q --filter "$by" | sort | comm -23 - <(printf '%s\n' "$data" | sed '/^$/d') |
        sed 's/^/volume /'
}

# deployment_payload DEPLOYMENT: snapshot payload, one a line: images (untagged parents too)
# and data volumes.
deployment_payload() {
    local by="label=$LABEL_DEPLOYMENT=$1"
    docker images -aq --filter "$by" | sort -u | sed 's/^/image /'
    docker volume ls -q --filter "$by" --filter "label=$LABEL_ROLE=snapshot-data" | sed 's/^/volume /'
    docker volume ls -q --filter "$by" --filter "label=$LABEL_ROLE=snapshot-held" | sed 's/^/volume /'
}

# sweep_deployment DEPLOYMENT: prints how many objects were left that count as leaks (above),
# then force-removes everything of the deployment (containers with their anonymous volumes,
# networks, volumes with overlays before what they mount, images children first) and checks
# that nothing remains.
sweep_deployment() {
    local dep=$1 left n payload by="label=$LABEL_DEPLOYMENT=$1" ids
    left=$(deployment_objects "$dep")
    n=$(printf '%s' "$left" | grep -c . || true)
    echo "$n"
    if [ "$n" -gt 0 ]; then
        echo "left behind by deployment $dep:" >&2
        printf '%s\n' "$left" >&2
    fi
    payload=$(deployment_payload "$dep")
    if [ -n "$payload" ]; then
        echo "deployment $dep: $(printf '%s\n' "$payload" | grep -c .) snapshot payload object(s) collected (the reaper's job, off here; not leaks)" >&2
    fi
    docker ps -aq --filter "$by" | xargs -r docker rm -fv >/dev/null
    docker network ls -q --filter "$by" | xargs -r docker network rm >/dev/null
    {
        docker volume ls -q --filter "$by" | grep -- '-merged$' || true
        docker volume ls -q --filter "$by" | grep -v -- '-merged$' || true
    } | xargs -r docker volume rm -f >/dev/null
    # A parent image goes only once its children have: a few passes.
    for _ in 1 2 3 4; do
        ids=$(docker images -aq --filter "$by" | sort -u)
        [ -n "$ids" ] || break
        # shellcheck disable=SC2086
        docker rmi -f $ids >/dev/null 2>&1 || true
    done
    if [ -n "$(deployment_objects "$dep")$(deployment_payload "$dep")" ]; then
        echo "error: could not remove what deployment $dep left:" >&2
        deployment_objects "$dep" >&2
        deployment_payload "$dep" >&2
        return 1
    fi
}
