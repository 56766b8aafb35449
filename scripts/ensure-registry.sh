#!/usr/bin/env bash
# Make sure Debian's container registry (`docker-registry`, the distribution registry) and
# `htpasswd` (apache2-utils) are installed, and print the path of the registry binary. The
# package's service is not started: the private-registry tests start their own registry on a
# free loopback port with an htpasswd file and a temporary storage directory.
set -euo pipefail
# shellcheck source=scripts/lib.sh
. "$(dirname "$(readlink -f "$0")")/lib.sh"

missing=()
command -v docker-registry >/dev/null 2>&1 || missing+=(docker-registry)
command -v htpasswd >/dev/null 2>&1 || missing+=(apache2-utils)
if [ "${#missing[@]}" -gt 0 ]; then
    take_lock registry
    apt_ensure "${missing[@]}"
fi
command -v htpasswd >/dev/null 2>&1 || die "htpasswd is not on PATH after installing apache2-utils"
bin=$(command -v docker-registry) || die "docker-registry is not on PATH after installing it"
echo "$bin"
