#!/usr/bin/env bash
# Fails when any container, network, volume or image created by the service (or by the tests' own
# fixtures) is still there: every test must clean up what it created, whatever its outcome.
# Images are the snapshots' (label daiv.sandbox.managed=true), dangling and untagged parents too,
# and their tags of base images (repository daiv-sandbox-snapshot).
#
#   scripts/check-leaks.sh                  everything labelled, whenever it was made
#   scripts/check-leaks.sh --record FILE    remember what exists now (before a test run)
#   scripts/check-leaks.sh --since FILE     only what appeared after --record: a run's own leaks,
#                                           not what an earlier run or a live deployment on the
#                                           same engine owns (those are listed as a warning)
set -euo pipefail
label=daiv.sandbox.managed
fixture=daiv.e2e

objects() {
    local l
    for l in "$label" "$fixture"; do
        docker ps -aq --no-trunc --filter "label=$l" | sed 's/^/container /'
        docker network ls -q --no-trunc --filter "label=$l" | sed 's/^/network /'
    done
    docker volume ls -q --filter "label=$label" | sed 's/^/volume /'
    # -a: an image whose tag went while a child image still needs it is untagged, not dangling.
    docker images -aq --no-trunc --filter "label=$label" | sed 's/^/image /'
    # A snapshot that commits nothing is its base image tagged: the tag carries none of our
    # labels, so it is found by its repository.
    docker images --format '{{.Repository}}:{{.Tag}}' --filter reference=daiv-sandbox-snapshot | sed 's/^/tag /'
}

case "${1:-}" in
--record)
    objects | sort -u >"$2"
    exit 0
    ;;
--since)
    before=$(sort -u "$2")
    ;;
"")
    before=
    ;;
*)
    echo "usage: $0 [--record FILE | --since FILE]" >&2
    exit 2
    ;;
esac

now=$(objects | sort -u)
new=$(comm -13 <(printf '%s\n' "$before" | sed '/^$/d') <(printf '%s\n' "$now" | sed '/^$/d'))
old=$(comm -12 <(printf '%s\n' "$before" | sed '/^$/d') <(printf '%s\n' "$now" | sed '/^$/d'))
if [ -n "$old" ]; then
    echo "check-leaks: warning: $(printf '%s\n' "$old" | wc -l) object(s) existed before the run (not counted)" >&2
fi
if [ -n "$new" ]; then
    echo "error: left behind by the test suite (labels $label, $fixture):" >&2
    while read -r kind id; do
        case $kind in
        container) docker ps -a --no-trunc --filter "id=$id" --format '{{.ID}} {{.Image}} {{.Status}} {{.Labels}}' ;;
        network) docker network ls --no-trunc --filter "id=$id" --format '{{.ID}} {{.Name}} {{.Labels}}' ;;
        volume) docker volume inspect -f '{{.Name}} {{.Labels}}' "$id" 2>/dev/null || echo "$id" ;;
        tag) echo "$id" ;;
        image) docker image inspect -f '{{.Id}} {{.RepoTags}} {{.Created}} {{.Config.Labels}}' "$id" 2>/dev/null || echo "$id" ;;
        esac
    done <<<"$new" >&2
    exit 1
fi
echo "check-leaks: no container, network, volume or image left behind"
