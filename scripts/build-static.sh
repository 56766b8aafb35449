#!/usr/bin/env bash
# Builds every static (glibc, crt-static) release binary of this checkout in ONE cargo
# invocation: daiv-egress-gateway and daiv-sandbox (their `FROM scratch` images), the session
# helper every sandbox gets, and the e2e tests' hostile helper (a fixture, never shipped).
# One invocation, so the dependency graph is built once, with one feature set: built one package
# at a time, each build unifies features differently (serde, tokio, hyper, regex...) and rebuilds
# most of the graph. The image scripts call this; when nothing changed it is a no-op.
#
#   scripts/build-static.sh        # -> $CARGO_TARGET_DIR/x86_64-unknown-linux-gnu/release/
#
# Honours CARGO_TARGET_DIR (default target/) and CARGO_BUILD_JOBS.
set -euo pipefail

root="$(cd "$(dirname "$(readlink -f "$0")")/.." && pwd)"
triple="x86_64-unknown-linux-gnu"

cd "$root"
# Relative relocations packed (RELR, glibc >= 2.36, binutils >= 2.38): a static PIE relocates
# itself at start-up, and in the usual format reading its 800 KB table alone was that much of
# the control plane's resident memory; packed, it is 9 KB. The binaries stay position-
# independent (ASLR).
RUSTFLAGS='-C target-feature=+crt-static -C link-arg=-Wl,-z,pack-relative-relocs' \
    cargo build --release --target "$triple" \
    -p egress-gateway --bin daiv-egress-gateway \
    -p control-plane --bin daiv-sandbox \
    -p sandbox-helper --bin daiv-sandbox-helper \
    -p hostile-helper --bin daiv-e2e-hostile-helper \
    -p code-interpreter --bin daiv-code-interpreter
