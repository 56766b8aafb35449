#!/usr/bin/env bash
# Make sure Debian's chromium is installed (the docs page's browser test drives it headless over
# the DevTools protocol) and print the path of its binary.
set -euo pipefail
# shellcheck source=scripts/lib.sh
. "$(dirname "$(readlink -f "$0")")/lib.sh"

if ! command -v chromium >/dev/null 2>&1; then
    apt_ensure chromium
fi
bin=$(command -v chromium) || die "chromium is not on PATH after installing it"
echo "$bin"
