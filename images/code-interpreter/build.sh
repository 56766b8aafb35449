#!/usr/bin/env bash
# Build the image daiv-sandbox-code-interpreter:local (E2B's template `code-interpreter-v1`): the
# project's Debian image (images/sandbox/build-debian.sh), the Python packages of
# requirements.txt installed offline from wheels (fetched from PyPI once into the cache), and
# this checkout's static daiv-code-interpreter, which the sandbox's helper starts as the sandbox
# user (DAIV_SANDBOX_START) on port 49999. No registry: `FROM` the local Debian image.
# Skips when the tag exists, built from the same inputs (its daiv.recipe label), unless FORCE=1.
# Env: FORCE=1 to rebuild; IMAGE to change the tag; DAIV_CACHE_DIR (default /var/cache/daiv-sandbox).
set -euo pipefail
here=$(dirname "$(readlink -f "$0")")
root="$(cd "$here/../.." && pwd)"
# shellcheck source=scripts/lib.sh
. "$root/scripts/lib.sh"

IMAGE=${IMAGE:-daiv-sandbox-code-interpreter:local}
BASE=daiv-sandbox-debian:local
triple="x86_64-unknown-linux-gnu"
target_dir="${CARGO_TARGET_DIR:-$root/target}"
cache="${DAIV_CACHE_DIR:-/var/cache/daiv-sandbox}/code-interpreter-wheels"

"$root/scripts/build-static.sh"
bin="$target_dir/$triple/release/daiv-code-interpreter"
if ldd "$bin" 2>/dev/null | grep -q '=>'; then
    die "$bin is dynamically linked; the sandbox image may not have its libraries"
fi
image_exists "$BASE" || "$root/images/sandbox/build-debian.sh"

# The inputs: this script, the pins, the server and the base image.
RECIPE=$( { cat "$0" "$here/requirements.txt" "$bin"; docker image inspect -f '{{.Id}}' "$BASE"; } | sha256sum | cut -c1-12)
build_once "$IMAGE" build-code-interpreter "$RECIPE"

# The wheels, once: for Debian bookworm's CPython 3.11 on x86_64, whatever the host's Python is.
mkdir -p "$cache"
pip_args=(--only-binary=:all: --python-version 3.11 --implementation cp --abi cp311
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64
    --platform manylinux2014_x86_64 --platform any)
if ! python3 -m pip download --quiet --disable-pip-version-check --no-deps \
    "${pip_args[@]}" -d "$cache" -r "$here/requirements.txt" --no-index --find-links "$cache" \
    >/dev/null 2>&1; then
    run_quiet "fetching the code interpreter's wheels" python3 -m pip download --quiet \
        --disable-pip-version-check --no-deps "${pip_args[@]}" -d "$cache" -r "$here/requirements.txt"
fi

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
site="$stage/rootfs/usr/local/lib/python3.11/dist-packages"
mkdir -p "$site" "$stage/rootfs/usr/local/bin"
run_quiet "installing the wheels" python3 -m pip install --quiet --disable-pip-version-check \
    --no-index --find-links "$cache" --no-deps --no-compile "${pip_args[@]}" \
    --target "$site" -r "$here/requirements.txt"
# Entry-point scripts name the host's interpreter; the kernels start as `python3 -m`.
rm -rf "$site/bin"
install -m 0755 "$bin" "$stage/rootfs/usr/local/bin/daiv-code-interpreter"
strip "$stage/rootfs/usr/local/bin/daiv-code-interpreter" 2>/dev/null || true

cat > "$stage/Dockerfile" <<DOCKERFILE
FROM $BASE
COPY rootfs/ /
# Byte code, compiled by the image's own python3: the sandbox user cannot write it beside the
# sources, so without it every kernel would compile pandas again at its first import.
# Debian marks its Python externally managed (PEP 668): a sandbox is the user's own, and a cell's
# `pip install` goes to the sandbox user's site directory (the system's is not theirs to write).
RUN python3 -m compileall -q -j 0 /usr/local/lib/python3.11/dist-packages >/dev/null \
    && rm -f /usr/lib/python3*/EXTERNALLY-MANAGED \
    && python3 -c "import ipykernel, numpy, pandas, matplotlib, bash_kernel, pip"
ENV DAIV_SANDBOX_START="/usr/local/bin/daiv-code-interpreter --port 49999 --cwd /home/user"
ENV MPLBACKEND=module://matplotlib_inline.backend_inline
LABEL daiv.recipe=$RECIPE
DOCKERFILE

old=$(docker image inspect -f '{{.Id}}' "$IMAGE" 2>/dev/null || true)
run_quiet "docker build $IMAGE" env DOCKER_BUILDKIT=0 docker build --quiet --network none \
    -t "$IMAGE" "$stage"
if [ -n "$old" ] && [ "$old" != "$(docker image inspect -f '{{.Id}}' "$IMAGE")" ]; then
    docker image rm "$old" >/dev/null 2>&1 || true
fi
