#!/usr/bin/env bash
# Make sure a Docker engine answers `docker info`: install docker.io if dockerd is missing and
# start dockerd in the background. Keeps any existing /etc/docker/daemon.json as it is.
# Quiet on success. Env: DOCKERD_LOG (default /var/log/dockerd.log), DOCKER_WAIT (seconds, 60).
set -euo pipefail
# shellcheck source=scripts/lib.sh
. "$(dirname "$(readlink -f "$0")")/lib.sh"

docker_ok && exit 0
need_root

pkgs=()
command -v dockerd >/dev/null 2>&1 || pkgs+=(docker.io)
command -v docker >/dev/null 2>&1 || pkgs+=(docker.io)
# A storage driver named in the existing config must have its helper installed.
if [ -f /etc/docker/daemon.json ] && grep -q '"fuse-overlayfs"' /etc/docker/daemon.json; then
    command -v fuse-overlayfs >/dev/null 2>&1 || pkgs+=(fuse-overlayfs)
fi
if [ "${#pkgs[@]}" -gt 0 ]; then
    # docker.io's Depends bring containerd, runc, tini and iptables.
    mapfile -t pkgs < <(printf '%s\n' "${pkgs[@]}" | sort -u)
    apt_ensure "${pkgs[@]}"
fi

if ! pidof dockerd >/dev/null 2>&1; then
    log=${DOCKERD_LOG:-/var/log/dockerd.log}
    { : >>"$log"; } 2>/dev/null || log=$(mktemp /tmp/dockerd.XXXXXX.log)
    # setsid + nohup: the daemon outlives this script and its shell.
    setsid nohup dockerd >>"$log" 2>&1 </dev/null &
else
    log=${DOCKERD_LOG:-/var/log/dockerd.log}
fi

wait_s=${DOCKER_WAIT:-60}
for _ in $(seq 1 $((wait_s * 2))); do
    docker_ok && exit 0
    if ! pidof dockerd >/dev/null 2>&1; then
        echo "error: ensure-docker.sh: dockerd exited; last lines of $log:" >&2
        tail -n 30 "$log" >&2 2>/dev/null || true
        exit 1
    fi
    sleep 0.5
done
echo "error: ensure-docker.sh: docker info did not answer within ${wait_s}s; last lines of $log:" >&2
tail -n 30 "$log" >&2 2>/dev/null || true
exit 1
