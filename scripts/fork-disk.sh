#!/usr/bin/env bash
# Host disk taken by 8 forks that each change 10 MB (issue 43's target: at most 8 x 10 MB + 1 %
# of the snapshot). Against a running service of its own deployment on this engine (BASE, KEY):
# a Debian session with a 20,000-file, 256 MB repo, a snapshot of it and a session from that
# snapshot (so a fork copies only what changed), then 8 forks of that session, each writing
# 10 MB. Measured with `du -x` over the engine's data root (a mounted overlay view is another
# file system: not counted twice), before the forks and after their writes, with nothing else
# running on the engine. Prints the figures; removes what it made.
#
#   BASE=http://127.0.0.1:18600 KEY=... scripts/fork-disk.sh
set -euo pipefail
BASE=${BASE:?the service, e.g. http://127.0.0.1:18600}
KEY=${KEY:?its API key}
IMAGE=${IMAGE:-daiv-sandbox-debian:local}
ROOT=$(docker info --format '{{.DockerRootDir}}')

api() { curl -fsS -H "X-API-Key: $KEY" -H 'content-type: application/json' -X "$1" "$BASE/api/v1$2" ${3:+-d "$3"}; }
run() { api POST "/session/$1/" "{\"commands\":[\"$2\"],\"timeout\":0}" >/dev/null; }
field() { python3 -c "import json,sys; print(json.load(sys.stdin)$1)"; }
kib() { sync; du -skx "$ROOT" | cut -f1; }

made=()
snaps=()
cleanup() {
    for s in "${made[@]}"; do api DELETE "/session/$s/?force=true" >/dev/null 2>&1 || true; done
    for s in "${snaps[@]}"; do api DELETE "/snapshots/$s/" >/dev/null 2>&1 || true; done
}
trap cleanup EXIT

src=$(api POST /session/ "{\"base_image\":\"$IMAGE\"}" | field "['session_id']")
made+=("$src")
run "$src" "mkdir -p /workspace/repo && cd /workspace/repo && head -c 268435456 /dev/urandom | split -b 13422 -a 5 - f && ls | wc -l"
snap=$(api POST "/session/$src/snapshot/" '{}' | field "['snapshot_id']")
snaps+=("$snap")
size=$(api GET "/snapshots/$snap/" | field "['size_bytes']")
from=$(api POST /session/ "{\"snapshot_id\":\"$snap\"}" | field "['session_id']")
made+=("$from")

before=$(kib)
forks=$(api POST "/session/$from/fork/" '{"count":8}' | field "['session_ids']" | tr -d "[]',")
for f in $forks; do
    made+=("$f")
    run "$f" "head -c 10485760 /dev/urandom > /workspace/repo/changed.bin"
done
after=$(kib)

grown=$(( (after - before) * 1024 ))
target=$(( 8 * 10485760 + size / 100 ))
echo "snapshot: $size bytes; 8 forks each writing 10 MB took $grown bytes of host disk (target $target: 8 x 10 MB + 1 % of the snapshot)"
