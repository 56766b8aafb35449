#!/usr/bin/env bash
# Build the image daiv-sandbox-dind:local: a Docker engine (Debian bookworm's docker.io: dockerd,
# containerd, runc, tini) in a Debian minbase rootfs made by debootstrap, imported with
# `docker import`. Its entrypoint (entrypoint.sh here) serves the engine on tcp://0.0.0.0:2376
# with mutual TLS only, overlay2 on /var/lib/docker (a volume), iptables on. The fleet tests run
# three of them (scripts/fleet-engines.sh, which also has the `docker run` flags it needs).
# The mirror is the machine's own (from its apt sources); the .debs are cached as a debootstrap
# tarball, so a rebuild needs no network. Skips when the tag exists, unless FORCE=1.
# Env: FORCE=1 to rebuild; IMAGE to change the tag; DEBIAN_MIRROR to override the mirror;
#      DAIV_CACHE_DIR (default /var/cache/daiv-sandbox).
set -euo pipefail
here=$(dirname "$(readlink -f "$0")")
# shellcheck source=scripts/lib.sh
. "$here/../../scripts/lib.sh"

IMAGE=${IMAGE:-daiv-sandbox-dind:local}
SUITE=bookworm
VARIANT=minbase
# docker.io's Depends bring containerd, runc, tini (docker-init, and the PID 1 here) and iptables.
INCLUDE=docker.io,iptables,ca-certificates,procps,iproute2

build_once "$IMAGE" build-dind
apt_ensure debootstrap

debootstrap_workdir daiv-dind
MIRROR=$(debian_mirror)
debootstrap_rootfs "$work" "$SUITE" "$VARIANT" "$INCLUDE" "$MIRROR"

for f in dockerd containerd runc docker-init tini iptables; do
    [ -x "$root/usr/bin/$f" ] || [ -x "$root/usr/sbin/$f" ] || [ -x "$root/sbin/$f" ] \
        || die "the rootfs has no $f"
done
install -m 0755 "$here/entrypoint.sh" "$root/usr/local/bin/dind-entrypoint"

# Keep it small, and leave to Docker what Docker mounts (and the engine's state to its volume).
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/cache/apt/*.bin \
    "$root"/var/lib/apt/lists/* "$root"/var/log/apt/* "$root"/var/log/*.log \
    "$root"/usr/share/man/* "$root"/usr/share/info/* "$root"/debootstrap \
    "$root"/tmp/* "$root"/var/tmp/* "$root"/var/lib/docker "$root"/var/lib/containerd \
    "$root"/etc/docker/key.json
mkdir -p "$root/var/lib/docker"
find "$root/usr/share/doc" -mindepth 1 ! -name copyright ! -type d -delete 2>/dev/null || true
find "$root/usr/share/doc" -mindepth 1 -type d -empty -delete 2>/dev/null || true
rm -f "$root/etc/hostname" "$root/etc/resolv.conf"
: >"$root/etc/machine-id"
printf 'deb %s %s main\n' "$MIRROR" "$SUITE" >"$root/etc/apt/sources.list"

# shellcheck disable=SC2016 # expanded by the inner sh
run_quiet "docker import $IMAGE" sh -c '
    tar -C "$1" --numeric-owner -cf - . | docker import \
        --change "ENTRYPOINT [\"/usr/bin/tini\", \"-g\", \"--\", \"/usr/local/bin/dind-entrypoint\"]" \
        --change "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
        --change "VOLUME /var/lib/docker" \
        --change "EXPOSE 2376" \
        - "$2"' sh "$root" "$IMAGE"
