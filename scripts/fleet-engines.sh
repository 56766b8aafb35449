#!/usr/bin/env bash
# A fleet of Docker engines for the fleet tests: each a Docker-in-Docker container
# (daiv-sandbox-dind:local, images/dind/) on the host bridge network `daiv-fleet`, at a fixed IP,
# served on tcp://IP:2376 with mutual TLS only. Everything made here is labelled daiv.fleet=true.
#
#   fleet-engines.sh up [NAME...]        start the engines (default: a b c), load the images into
#                                        them, print the engines file (JSON) and write it to
#                                        $FLEET_DIR/engines.json; an engine that answers is left alone
#   fleet-engines.sh endpoint NAME       print tcp://IP:2376
#   fleet-engines.sh docker NAME ARGS... the docker CLI against that engine, with the client's TLS
#   fleet-engines.sh kill NAME           docker kill the engine (sudden death); returns once it is dead
#   fleet-engines.sh stop NAME           docker stop the engine (its dockerd stops its containers)
#   fleet-engines.sh start NAME          start it again (unpause it if paused) and wait until it answers;
#                                        one that dies while starting is started again (3 tries)
#   fleet-engines.sh pause NAME          freeze it: it accepts TCP connections but never answers
#   fleet-engines.sh unpause NAME        thaw it
#   fleet-engines.sh status [NAME...]    one line per engine: name, state, endpoint, answering or not
#   fleet-engines.sh leaks               per answering engine, the objects labelled
#                                        daiv.sandbox.managed=true; exit 1 if there is any
#   fleet-engines.sh down [--purge]      remove the engines and the network (--purge: and their data
#                                        volumes, i.e. their loaded images and containers)
#
# Engine NAME is the container daiv-fleet-NAME with its data root on the volume
# daiv-fleet-NAME-data (kept by `down`, so images stay loaded). A one-letter name a..z gets the IP
# .11.. .36 of the subnet (a=.11, b=.12, c=.13); any other name the first free one from .40.
# Certificates (openssl, reused when still valid): $FLEET_DIR/ca.pem (and ca-key.pem), the control
# plane's client-cert.pem and client-key.pem, and per engine $FLEET_DIR/engines/NAME/ (mounted
# read-only at /certs) with a server certificate for DNS NAME, its IP and 127.0.0.1.
# The network is --internal: the engines (and their containers) reach nothing but the host's
# address on it (.1) and each other.
#
# Env: FLEET_DIR (default /var/tmp/daiv-fleet); FLEET_SUBNET (default 10.213.0.0/24, a /24);
#      FLEET_IMAGES (default "daiv-sandbox-busybox:local daiv-sandbox-egress:local"; add
#      daiv-sandbox-debian:local for the Debian sandboxes), loaded from the host's engine into each
#      engine that lacks them or has another build; FLEET_WAIT (seconds an engine may take to
#      answer, default 60); DIND_IMAGE (default daiv-sandbox-dind:local).
# Quiet on success but for what a subcommand prints; errors say what failed.
set -euo pipefail
here=$(dirname "$(readlink -f "$0")")
# shellcheck source=scripts/lib.sh
. "$here/lib.sh"

FLEET_DIR=${FLEET_DIR:-/var/tmp/daiv-fleet}
FLEET_SUBNET=${FLEET_SUBNET:-10.213.0.0/24}
FLEET_IMAGES=${FLEET_IMAGES:-daiv-sandbox-busybox:local daiv-sandbox-egress:local}
FLEET_WAIT=${FLEET_WAIT:-60}
DIND_IMAGE=${DIND_IMAGE:-daiv-sandbox-dind:local}
NETWORK=daiv-fleet
LABEL=daiv.fleet=true
PORT=2376
DEFAULT_NAMES=(a b c)
# The bridge (only one-letter-to-IP mapping is fixed; see above).
case $FLEET_SUBNET in
*.0/24) PREFIX=${FLEET_SUBNET%.0/24} ;;
*) die "FLEET_SUBNET must be a /24 ending in .0/24 (got $FLEET_SUBNET)" ;;
esac

usage() {
    sed -n '/^#   fleet-engines.sh/,/^#$/p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
}

container() { echo "daiv-fleet-$1"; }
volume() { echo "daiv-fleet-$1-data"; }

valid_name() {
    [[ $1 =~ ^[a-z0-9][a-z0-9-]{0,30}$ ]] || die "bad engine name '$1' (lowercase letters, digits, -)"
}

# state NAME: running, paused, exited, created, ... or absent.
state() {
    local s
    if s=$(docker inspect -f '{{.State.Status}}' "$(container "$1")" 2>/dev/null); then
        echo "$s"
    else
        echo absent
    fi
}

# ip_of NAME: the engine's IP: its container's on the network, else the fixed one of a one-letter name.
ip_of() {
    local ip
    ip=$(docker inspect -f "{{with index .NetworkSettings.Networks \"$NETWORK\"}}{{.IPAddress}}{{end}}" \
        "$(container "$1")" 2>/dev/null || true)
    [ -z "$ip" ] && ip=$(docker inspect -f '{{index .Config.Labels "daiv.fleet.ip"}}' \
        "$(container "$1")" 2>/dev/null || true)
    if [ -z "$ip" ] && [[ $1 =~ ^[a-z]$ ]]; then
        ip="$PREFIX.$(($(printf '%d' "'$1") - 97 + 11))"
    fi
    [ -n "$ip" ] || return 1
    echo "$ip"
}

# new_ip NAME: the IP for an engine about to be created.
new_ip() {
    local n used
    if [[ $1 =~ ^[a-z]$ ]]; then
        ip_of "$1"
        return
    fi
    used=$(docker ps -a --filter "label=$LABEL" --format '{{.Label "daiv.fleet.ip"}}')
    for n in $(seq 40 250); do
        grep -qx "$PREFIX.$n" <<<"$used" || { echo "$PREFIX.$n"; return; }
    done
    die "no free IP left in $FLEET_SUBNET"
}

# engine_cli NAME: set ENGINE_CLI to the docker CLI command (an array) for engine NAME.
engine_cli() {
    local ip
    ip=$(ip_of "$1") || die "no engine '$1' (fleet-engines.sh up $1)"
    ENGINE_CLI=(docker --tlsverify --tlscacert="$FLEET_DIR/ca.pem"
        --tlscert="$FLEET_DIR/client-cert.pem" --tlskey="$FLEET_DIR/client-key.pem"
        -H "tcp://$ip:$PORT")
}

# answers NAME: the engine answers `docker info` within 5 s.
answers() {
    engine_cli "$1"
    timeout 5 "${ENGINE_CLI[@]}" info >/dev/null 2>&1
}

# wait_answering NAME...: wait (FLEET_WAIT s in all) until every engine answers `docker info`.
# RESTARTS (default 0): how many times an engine found exited is started again instead of failing.
wait_answering() {
    local deadline=$((SECONDS + FLEET_WAIT)) pending=("$@") left n s restarts=${RESTARTS:-0}
    while [ "${#pending[@]}" -gt 0 ]; do
        left=()
        for n in "${pending[@]}"; do
            answers "$n" && continue
            s=$(state "$n")
            if [ "$s" = exited ] && [ "$restarts" -gt 0 ]; then
                restarts=$((restarts - 1))
                echo "$(basename "$0"): engine $n exited while starting; starting it again" >&2
                docker logs --tail 10 "$(container "$n")" >&2 2>&1 || true
                run_quiet "docker start $(container "$n")" docker start "$(container "$n")"
                left+=("$n")
                continue
            fi
            if [ "$s" != running ]; then
                echo "error: $(basename "$0"): engine $n is $s, not running; its last log lines:" >&2
                docker logs --tail 30 "$(container "$n")" >&2 2>&1 || true
                exit 1
            fi
            left+=("$n")
        done
        pending=("${left[@]}")
        [ "${#pending[@]}" -eq 0 ] && break
        if [ "$SECONDS" -ge "$deadline" ]; then
            for n in "${pending[@]}"; do
                echo "error: $(basename "$0"): engine $n ($(ip_of "$n"):$PORT) did not answer within ${FLEET_WAIT}s; its last log lines:" >&2
                docker logs --tail 30 "$(container "$n")" >&2 2>&1 || true
            done
            exit 1
        fi
        sleep 0.5
    done
}

# ---- certificates --------------------------------------------------------------------------------

cert_ok() { # cert_ok CERT [SAN-needle...]: signed by our CA, valid for a week more, names it needs
    local cert=$1 san needle
    shift
    [ -s "$cert" ] || return 1
    openssl verify -CAfile "$FLEET_DIR/ca.pem" "$cert" >/dev/null 2>&1 || return 1
    openssl x509 -in "$cert" -noout -checkend 604800 >/dev/null 2>&1 || return 1
    san=$(openssl x509 -in "$cert" -noout -ext subjectAltName 2>/dev/null || true)
    for needle in "$@"; do
        grep -qF "$needle" <<<"$san" || return 1
    done
}

# issue OUT-CERT OUT-KEY SUBJECT EXTENSIONS: a P-256 key and a certificate signed by the fleet CA.
issue() {
    local cert=$1 key=$2 subj=$3 ext=$4 tmp
    tmp=$(mktemp -d)
    (umask 077 && openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$tmp/key.pem") \
        >/dev/null 2>&1 || die "openssl genpkey for $subj failed"
    printf '%s\n' "$ext" >"$tmp/ext.cnf"
    run_quiet "openssl req for $subj" openssl req -new -key "$tmp/key.pem" -subj "$subj" -out "$tmp/req.csr"
    run_quiet "openssl x509 (signing $subj)" openssl x509 -req -in "$tmp/req.csr" -days 825 -sha256 \
        -CA "$FLEET_DIR/ca.pem" -CAkey "$FLEET_DIR/ca-key.pem" -set_serial "0x$(openssl rand -hex 16)" \
        -extfile "$tmp/ext.cnf" -out "$tmp/cert.pem"
    chmod 600 "$tmp/key.pem"
    chmod 644 "$tmp/cert.pem"
    mv -f "$tmp/key.pem" "$key"
    mv -f "$tmp/cert.pem" "$cert"
    rm -rf "$tmp"
}

ensure_ca_and_client() {
    mkdir -p "$FLEET_DIR/engines"
    chmod 755 "$FLEET_DIR"
    if ! { [ -s "$FLEET_DIR/ca-key.pem" ] && [ -s "$FLEET_DIR/ca.pem" ] \
        && openssl x509 -in "$FLEET_DIR/ca.pem" -noout -checkend 2592000 >/dev/null 2>&1; }; then
        (umask 077 && openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 \
            -out "$FLEET_DIR/ca-key.pem") >/dev/null 2>&1 || die "openssl genpkey for the CA failed"
        chmod 600 "$FLEET_DIR/ca-key.pem"
        run_quiet "openssl req (the fleet CA)" openssl req -x509 -new -key "$FLEET_DIR/ca-key.pem" \
            -sha256 -days 3650 -subj "/CN=daiv-fleet CA" \
            -addext "basicConstraints=critical,CA:TRUE" \
            -addext "keyUsage=critical,keyCertSign,cRLSign" \
            -addext "subjectKeyIdentifier=hash" \
            -out "$FLEET_DIR/ca.pem"
        chmod 644 "$FLEET_DIR/ca.pem"
    fi
    if ! cert_ok "$FLEET_DIR/client-cert.pem" || [ ! -s "$FLEET_DIR/client-key.pem" ]; then
        issue "$FLEET_DIR/client-cert.pem" "$FLEET_DIR/client-key.pem" "/CN=daiv-sandbox control plane" \
            "basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature
extendedKeyUsage=clientAuth
subjectKeyIdentifier=hash
authorityKeyIdentifier=keyid"
    fi
}

# ensure_server_cert NAME IP: (re)issue the engine's certificate unless it is still good; sets
# CERT_ISSUED=1 when it did.
ensure_server_cert() {
    local name=$1 ip=$2 dir="$FLEET_DIR/engines/$1"
    CERT_ISSUED=0
    mkdir -p "$dir"
    if ! cert_ok "$dir/cert.pem" "IP Address:$ip" "DNS:$name" "IP Address:127.0.0.1" \
        || [ ! -s "$dir/key.pem" ] || ! cmp -s "$FLEET_DIR/ca.pem" "$dir/ca.pem"; then
        issue "$dir/cert.pem" "$dir/key.pem" "/CN=$name" \
            "basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature
extendedKeyUsage=serverAuth
subjectKeyIdentifier=hash
authorityKeyIdentifier=keyid
subjectAltName=DNS:$name,DNS:$(container "$name"),IP:$ip,IP:127.0.0.1"
        cp "$FLEET_DIR/ca.pem" "$dir/ca.pem"
        chmod 644 "$dir/ca.pem"
        CERT_ISSUED=1
    fi
}

# ---- up ------------------------------------------------------------------------------------------

ensure_network() {
    local subnet
    if subnet=$(docker network inspect -f '{{range .IPAM.Config}}{{.Subnet}}{{end}}' "$NETWORK" 2>/dev/null); then
        [ "$subnet" = "$FLEET_SUBNET" ] \
            || die "network $NETWORK exists with subnet $subnet, not $FLEET_SUBNET (fleet-engines.sh down first)"
        return
    fi
    run_quiet "docker network create $NETWORK ($FLEET_SUBNET)" docker network create \
        --driver bridge --internal --subnet "$FLEET_SUBNET" --gateway "$PREFIX.1" \
        -o com.docker.network.bridge.name="$NETWORK" --label "$LABEL" "$NETWORK"
}

create_engine() { # NAME IP
    local name=$1 ip=$2
    docker volume inspect "$(volume "$name")" >/dev/null 2>&1 \
        || run_quiet "docker volume create $(volume "$name")" docker volume create \
            --label "$LABEL" --label "daiv.fleet.engine=$name" "$(volume "$name")"
    # --privileged fails here (CAP_SYS_RESOURCE is not in the bounding set): every other capability,
    # no seccomp/AppArmor, /proc and /sys unmasked, the host's cgroups (v1) writable.
    run_quiet "docker run $(container "$name")" docker run -d --pull never \
        --name "$(container "$name")" --hostname "$name" \
        --label "$LABEL" --label "daiv.fleet.engine=$name" --label "daiv.fleet.ip=$ip" \
        --network "$NETWORK" --ip "$ip" --dns 127.0.0.1 \
        --cap-add ALL --cap-drop SYS_RESOURCE \
        --security-opt seccomp=unconfined --security-opt apparmor=unconfined \
        --security-opt systempaths=unconfined \
        --cgroupns host -v /sys/fs/cgroup:/sys/fs/cgroup:rw \
        -v "$(volume "$name"):/var/lib/docker" \
        -v "$FLEET_DIR/engines/$name:/certs:ro" \
        --stop-timeout 20 \
        "$DIND_IMAGE"
}

# load_images NAME...: each of FLEET_IMAGES into each engine lacking it (or holding another build).
load_images() {
    local img host_id have n pids=() names=() i rc=0
    for img in $FLEET_IMAGES; do
        host_id=$(docker image inspect -f '{{.Id}}' "$img" 2>/dev/null || true)
        pids=()
        names=()
        for n in "$@"; do
            engine_cli "$n"
            have=$(timeout 30 "${ENGINE_CLI[@]}" image inspect -f '{{.Id}}' "$img" 2>/dev/null || true)
            if [ -z "$host_id" ]; then
                [ -n "$have" ] || die "image $img is not on the host's engine (make images), nor in engine $n"
                continue
            fi
            [ "$have" = "$host_id" ] && continue
            if [ ! -s "$tmp/image.tar" ]; then
                run_quiet "docker save $img" docker save -o "$tmp/image.tar" "$img"
            fi
            "${ENGINE_CLI[@]}" load -q -i "$tmp/image.tar" >"$tmp/load-$n.log" 2>&1 &
            pids+=("$!")
            names+=("$n")
        done
        for i in "${!pids[@]}"; do
            if ! wait "${pids[$i]}"; then
                echo "error: $(basename "$0"): loading $img into engine ${names[$i]} failed:" >&2
                tail -n 20 "$tmp/load-${names[$i]}.log" >&2
                rc=1
            fi
        done
        rm -f "$tmp/image.tar"
        [ "$rc" -eq 0 ] || exit 1
    done
}

engines_json() {
    local n first=1 ca cert key
    ca="$FLEET_DIR/ca.pem"
    cert="$FLEET_DIR/client-cert.pem"
    key="$FLEET_DIR/client-key.pem"
    printf '{"engines":['
    for n in "$@"; do
        [ "$first" -eq 1 ] || printf ','
        first=0
        printf '{"name":"%s","endpoint":"tcp://%s:%s","tls":{"ca":"%s","cert":"%s","key":"%s"}}' \
            "$n" "$(ip_of "$n")" "$PORT" "$ca" "$cert" "$key"
    done
    printf ']}\n'
}

cmd_up() {
    local names=("$@") n s ip fresh=() waiting=() json
    [ "${#names[@]}" -gt 0 ] || names=("${DEFAULT_NAMES[@]}")
    for n in "${names[@]}"; do valid_name "$n"; done
    need_root
    "$here/ensure-docker.sh"
    "$here/../images/dind/build.sh"
    take_lock fleet-engines
    tmp=$(mktemp -d /var/tmp/daiv-fleet.XXXXXX)
    trap 'rm -rf "$tmp"' EXIT
    ensure_ca_and_client
    ensure_network
    for n in "${names[@]}"; do
        s=$(state "$n")
        ip=$(if [ "$s" = absent ]; then new_ip "$n"; else ip_of "$n"; fi)
        # A new server certificate (first run, CA renewed) is read at dockerd's start: restart.
        ensure_server_cert "$n" "$ip"
        if [ "$CERT_ISSUED" -eq 1 ] && [ "$s" != absent ]; then
            run_quiet "docker rm -f $(container "$n") (its certificate changed)" docker rm -f "$(container "$n")"
            s=absent
        fi
        case $s in
        absent) create_engine "$n" "$ip" ;;
        running) ;;
        paused) run_quiet "docker unpause $(container "$n")" docker unpause "$(container "$n")" ;;
        restarting) ;;
        *) run_quiet "docker start $(container "$n")" docker start "$(container "$n")" ;;
        esac
        fresh+=("$n")
    done
    for n in "${fresh[@]}"; do
        answers "$n" || waiting+=("$n")
    done
    [ "${#waiting[@]}" -eq 0 ] || wait_answering "${waiting[@]}"
    load_images "${names[@]}"
    json=$(engines_json "${names[@]}")
    printf '%s\n' "$json" >"$FLEET_DIR/engines.json.tmp"
    mv -f "$FLEET_DIR/engines.json.tmp" "$FLEET_DIR/engines.json"
    printf '%s\n' "$json"
}

# ---- the others ----------------------------------------------------------------------------------

exists_or_die() {
    [ "$(state "$1")" != absent ] || die "no engine '$1' (fleet-engines.sh up $1)"
}

cmd_start() {
    local n=$1
    exists_or_die "$n"
    take_lock fleet-engines
    # A container killed a moment ago may still read `running` while its processes die: wait for
    # it to settle before deciding whether it needs a start.
    settle "$n"
    case $(state "$n") in
    running | restarting) ;;
    paused) run_quiet "docker unpause $(container "$n")" docker unpause "$(container "$n")" ;;
    *) run_quiet "docker start $(container "$n")" docker start "$(container "$n")" ;;
    esac
    RESTARTS=3 wait_answering "$n"
}

# settle NAME: if the engine's container is running but its engine does not answer, give it a few
# seconds to either answer or finish dying.
settle() {
    local n=$1 i
    for i in 1 2 3 4 5 6 7 8 9 10; do
        [ "$(state "$n")" = running ] || return 0
        answers "$n" && return 0
        sleep 0.5
    done
}

# dead NAME: wait (30 s at most) until the engine's container is no longer running.
dead() {
    local n=$1 i
    for i in $(seq 60); do
        case $(state "$n") in running | restarting) sleep 0.5 ;; *) return 0 ;; esac
    done
    die "engine $n still runs 30 s after it was told to stop"
}

cmd_status() {
    local names=("$@") n s line
    if [ "${#names[@]}" -eq 0 ]; then
        mapfile -t names < <(docker ps -a --filter "label=$LABEL" --format '{{.Label "daiv.fleet.engine"}}' | sort)
        [ "${#names[@]}" -gt 0 ] || { echo "no fleet engines"; return 0; }
    fi
    for n in "${names[@]}"; do
        s=$(state "$n")
        line="$n $s"
        if [ "$s" != absent ]; then
            line+=" tcp://$(ip_of "$n"):$PORT"
            if [ "$s" = running ] && answers "$n"; then line+=" answering"; else line+=" not-answering"; fi
        fi
        echo "$line"
    done
}

cmd_leaks() {
    local names n label=label=daiv.sandbox.managed=true c nw v i total=0
    mapfile -t names < <(docker ps --filter "label=$LABEL" --filter status=running \
        --format '{{.Label "daiv.fleet.engine"}}' | sort)
    for n in "${names[@]}"; do
        if ! answers "$n"; then
            echo "fleet-engines.sh: warning: engine $n does not answer; not checked" >&2
            continue
        fi
        engine_cli "$n"
        c=$("${ENGINE_CLI[@]}" ps -aq --no-trunc --filter "$label" | wc -l)
        nw=$("${ENGINE_CLI[@]}" network ls -q --no-trunc --filter "$label" | wc -l)
        v=$("${ENGINE_CLI[@]}" volume ls -q --filter "$label" | wc -l)
        i=$("${ENGINE_CLI[@]}" images -aq --no-trunc --filter "$label" | sort -u | wc -l)
        echo "$n containers=$c networks=$nw volumes=$v images=$i"
        total=$((total + c + nw + v + i))
    done
    [ "$total" -eq 0 ] || {
        echo "error: $(basename "$0"): $total object(s) labelled daiv.sandbox.managed=true left in the fleet" >&2
        exit 1
    }
}

cmd_down() {
    local purge=0
    case ${1:-} in
    "") ;;
    --purge) purge=1 ;;
    *) usage ;;
    esac
    take_lock fleet-engines
    docker ps -aq --filter "label=$LABEL" | xargs -r docker rm -f >/dev/null
    docker network ls -q --filter "label=$LABEL" | xargs -r docker network rm >/dev/null
    if [ "$purge" -eq 1 ]; then
        docker volume ls -q --filter "label=$LABEL" | xargs -r docker volume rm -f >/dev/null
    fi
}

one_name() { # SUBCOMMAND ARGS...: exactly one engine name
    [ "$#" -eq 2 ] || usage
    valid_name "$2"
}

[ "$#" -ge 1 ] || usage
sub=$1
shift
case $sub in
up) cmd_up "$@" ;;
endpoint)
    one_name endpoint "$@"
    ip=$(ip_of "$1") || die "no engine '$1' (fleet-engines.sh up $1)"
    echo "tcp://$ip:$PORT"
    ;;
docker)
    [ "$#" -ge 1 ] || usage
    valid_name "$1"
    engine_cli "$1"
    shift
    exec "${ENGINE_CLI[@]}" "$@"
    ;;
kill | stop | pause | unpause)
    one_name "$sub" "$@"
    exists_or_die "$1"
    run_quiet "docker $sub $(container "$1")" docker "$sub" "$(container "$1")"
    # `docker kill` returns once the signal is sent: the caller means the engine is gone.
    case $sub in kill | stop) dead "$1" ;; esac
    ;;
start)
    one_name start "$@"
    cmd_start "$1"
    ;;
status) cmd_status "$@" ;;
leaks)
    [ "$#" -eq 0 ] || usage
    cmd_leaks
    ;;
down) cmd_down "$@" ;;
-h | --help | help) usage ;;
*) usage ;;
esac
