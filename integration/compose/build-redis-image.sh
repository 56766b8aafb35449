#!/usr/bin/env bash
# Builds daiv-sandbox-redis:local with no registry: Debian's redis-server binary and the shared
# libraries `ldd` lists for it (loader included), staged at their paths into a `FROM scratch`
# image. Chosen over installing the package into the debootstrapped sandbox image: it needs no
# package mirror at build time, takes a second, and the image holds nothing but Redis (~15 MB).
#
#   integration/compose/build-redis-image.sh        # tag daiv-sandbox-redis:local
#   TAG=... integration/compose/build-redis-image.sh
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
tag="${TAG:-daiv-sandbox-redis:local}"

bin="$("$root/scripts/ensure-redis.sh")"
bin="$(readlink -f "$bin")"

stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/rootfs/usr/bin" "$stage/data"
install -m 0755 "$bin" "$stage/rootfs/usr/bin/redis-server"
# Every "lib => /path" line, and the loader (the line without "=>"), copied at its own path.
ldd "$bin" | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}' | while read -r lib; do
    mkdir -p "$stage/rootfs$(dirname "$lib")"
    cp -L "$lib" "$stage/rootfs$lib"
done
cat > "$stage/Dockerfile" <<'DOCKERFILE'
FROM scratch
COPY rootfs/ /
COPY --chown=999:999 data/ /data/
USER 999:999
WORKDIR /data
EXPOSE 6379
# Coordination data only (locks, activity, reaper leader): nothing to persist.
ENTRYPOINT ["/usr/bin/redis-server"]
CMD ["--bind", "0.0.0.0", "--protected-mode", "no", "--save", "", "--appendonly", "no"]
DOCKERFILE

docker build --quiet -t "$tag" "$stage" >/dev/null
echo "built $tag" >&2
