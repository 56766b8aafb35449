#!/usr/bin/env bash
# Builds the static session helper (`daiv-sandbox-helper`, crate sandbox-helper) that every
# sandbox gets in its skeleton, and puts it where the control plane looks for it by default:
# $CARGO_TARGET_DIR/helper/daiv-sandbox-helper (target/helper/ beside target/{debug,release}/).
# Static (glibc, crt-static) so it runs in busybox and in images without libc or a shell.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
triple="x86_64-unknown-linux-gnu"
target_dir="${CARGO_TARGET_DIR:-$root/target}"

# With the e2e tests' hostile helper (a fixture, never shipped), the gateway and the service: one
# static release build of them all (scripts/build-static.sh).
"$root/scripts/build-static.sh"

bin="$target_dir/$triple/release/daiv-sandbox-helper"
if ldd "$bin" 2>/dev/null | grep -q '=>'; then
    echo "error: $bin is dynamically linked; busybox and shell-less images cannot run it" >&2
    exit 1
fi
out="$target_dir/helper"
mkdir -p "$out"
install -m 0755 "$bin" "$out/daiv-sandbox-helper.tmp"
if command -v strip >/dev/null 2>&1; then strip "$out/daiv-sandbox-helper.tmp"; fi
mv -f "$out/daiv-sandbox-helper.tmp" "$out/daiv-sandbox-helper"
install -m 0755 "$target_dir/$triple/release/daiv-e2e-hostile-helper" "$out/daiv-e2e-hostile-helper"
