#!/usr/bin/env bash
# Removes everything the service created on this engine (label daiv.sandbox.managed=true), in
# every deployment: containers (with their anonymous volumes), networks, named volumes (snapshot
# records and data, copy-on-write workspaces) and images (snapshot payloads, dangling and untagged
# parents included, and snapshot tags of base images); and the fleet tests' engines with their
# data volumes (fleet-engines.sh down --purge). For a development machine; a live deployment on
# the same engine loses its sessions and snapshots too.
set -euo pipefail
label=label=daiv.sandbox.managed=true

# The fleet tests' engines (scripts/fleet-engines.sh): containers, network and data volumes.
fleet=label=daiv.fleet=true
if [ -n "$(docker ps -aq --filter "$fleet"; docker network ls -q --filter "$fleet"; docker volume ls -q --filter "$fleet")" ]; then
    "$(dirname "$(readlink -f "$0")")/fleet-engines.sh" down --purge
fi

docker ps -aq --no-trunc --filter "$label" | xargs -r docker rm -fv >/dev/null
docker network ls -q --filter "$label" | xargs -r docker network rm >/dev/null
# Copy-on-write workspaces' overlay volumes (…-merged) before the ones they mount.
{
    docker volume ls -q --filter "$label" | grep -- '-merged$' || true
    docker volume ls -q --filter "$label" | grep -v -- '-merged$' || true
} | xargs -r docker volume rm -f >/dev/null
# Snapshots that commit nothing tag their base image: untag (never -f: the base image stays).
docker images --format '{{.Repository}}:{{.Tag}}' --filter reference=daiv-sandbox-snapshot |
    xargs -r docker rmi >/dev/null 2>&1 || true
# A parent image goes only once its children have: a few passes.
for _ in 1 2 3 4; do
    ids=$(docker images -aq --no-trunc --filter "$label" | sort -u)
    [ -n "$ids" ] || break
    # shellcheck disable=SC2086
    docker rmi -f $ids >/dev/null 2>&1 || true
done
left=$(docker images -aq --no-trunc --filter "$label" | sort -u | wc -l)
[ "$left" -eq 0 ] || { echo "clean-docker: $left image(s) could not be removed" >&2; exit 1; }
