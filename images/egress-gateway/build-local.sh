#!/usr/bin/env bash
# Builds the egress gateway image with no registry: a static binary from this checkout, staged
# into a `FROM scratch` image (same runtime layout as ./Dockerfile).
#
#   images/egress-gateway/build-local.sh            # tag daiv-sandbox-egress:local
#   TAG=daiv-sandbox-egress:dev images/egress-gateway/build-local.sh
#
# Honours CARGO_TARGET_DIR. Needs cargo and docker; nothing is pulled.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
tag="${TAG:-daiv-sandbox-egress:local}"
triple="x86_64-unknown-linux-gnu"
target_dir="${CARGO_TARGET_DIR:-$root/target}"

# One static release build of every image's binary (scripts/build-static.sh): a no-op when fresh.
echo "building static daiv-egress-gateway ($triple, release)" >&2
"$root/scripts/build-static.sh"

bin="$target_dir/$triple/release/daiv-egress-gateway"
# A static-pie binary makes ldd print "statically linked"; a dynamic one lists "lib => path".
if ldd "$bin" 2>/dev/null | grep -q '=>'; then
    echo "error: $bin is dynamically linked; a scratch image cannot run it" >&2
    exit 1
fi

stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/rootfs/etc/daiv-egress"
chmod 0755 "$stage/rootfs/etc/daiv-egress"
install -m 0755 "$bin" "$stage/rootfs/daiv-egress-gateway"
# Symbols are for debugging on the build machine; the image does not need them.
if command -v strip >/dev/null 2>&1; then strip "$stage/rootfs/daiv-egress-gateway"; fi
cp "$here/Dockerfile.local" "$stage/Dockerfile"

docker build --quiet -t "$tag" "$stage" >/dev/null
echo "built $tag" >&2
