#!/usr/bin/env bash
# Builds the control-plane image with no registry: a static binary from this checkout, staged
# into a `FROM scratch` image (same runtime layout as ./Dockerfile).
#
#   images/control-plane/build-local.sh                   # tag daiv-sandbox:local
#   TAG=daiv-sandbox:dev DOCKER_GID=998 images/control-plane/build-local.sh
#
# DOCKER_GID is the group the service runs in, so it can use the mounted Docker socket; it
# defaults to the gid of this host's /var/run/docker.sock. Honours CARGO_TARGET_DIR. Needs cargo
# and docker; nothing is pulled.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
tag="${TAG:-daiv-sandbox:local}"
triple="x86_64-unknown-linux-gnu"
target_dir="${CARGO_TARGET_DIR:-$root/target}"
socket="${DOCKER_SOCKET:-/var/run/docker.sock}"
gid="${DOCKER_GID:-$(stat -c %g "$socket" 2>/dev/null || echo 999)}"

# One static release build of every image's binary (scripts/build-static.sh): a no-op when fresh.
echo "building static daiv-sandbox ($triple, release)" >&2
"$root/scripts/build-static.sh"

"$root/images/helper/build.sh"
helper="$target_dir/helper/daiv-sandbox-helper"

bin="$target_dir/$triple/release/daiv-sandbox"
# A static-pie binary makes ldd print "statically linked"; a dynamic one lists "lib => path".
if ldd "$bin" 2>/dev/null | grep -q '=>'; then
    echo "error: $bin is dynamically linked; a scratch image cannot run it" >&2
    exit 1
fi

stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/rootfs/tmp"
chmod 1777 "$stage/rootfs/tmp"
install -m 0755 "$bin" "$stage/rootfs/daiv-sandbox"
# The session helper every sandbox gets; the service finds it beside itself.
install -m 0755 "$helper" "$stage/rootfs/daiv-sandbox-helper"
# Symbols are for debugging on the build machine; the image does not need them.
if command -v strip >/dev/null 2>&1; then strip "$stage/rootfs/daiv-sandbox"; fi
cp "$here/Dockerfile.local" "$stage/Dockerfile"

docker build --quiet --build-arg "DOCKER_GID=$gid" -t "$tag" "$stage" >/dev/null
echo "built $tag (runs as 10001:$gid)" >&2
