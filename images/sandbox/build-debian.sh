#!/usr/bin/env bash
# Build the image daiv-sandbox-debian:local: a Debian bookworm minbase rootfs made by debootstrap
# (bash, git, curl, ca-certificates, python3, procps, iproute2, libcap2-bin, vim-tiny) with a user
# `sandbox` (uid/gid 1000) and, for E2B's SDK, `user` (the same ids, home /home/user, listed first so
# `whoami` says `user`), imported
# with `docker import`. The mirror is the machine's own
# (from its apt sources). The downloaded .debs are cached as a debootstrap tarball, so a rebuild
# needs no network. Skips when the tag exists, built by this very script (its daiv.recipe label),
# unless FORCE=1.
# Env: FORCE=1 to rebuild; IMAGE to change the tag; DEBIAN_MIRROR to override the mirror;
#      DAIV_CACHE_DIR (default /var/cache/daiv-sandbox).
set -euo pipefail
here=$(dirname "$(readlink -f "$0")")
# shellcheck source=scripts/lib.sh
. "$here/../../scripts/lib.sh"

IMAGE=${IMAGE:-daiv-sandbox-debian:local}
SUITE=bookworm
VARIANT=minbase
INCLUDE=bash,git,curl,ca-certificates,python3,procps,iproute2,libcap2-bin,vim-tiny

# An image built by an older version of this script is built again.
RECIPE=$(recipe_of "$0")
build_once "$IMAGE" build-debian "$RECIPE"
apt_ensure debootstrap

debootstrap_workdir daiv-debian
MIRROR=$(debian_mirror)
debootstrap_rootfs "$work" "$SUITE" "$VARIANT" "$INCLUDE" "$MIRROR"

run_quiet "adding user sandbox" chroot "$root" sh -c \
    'getent group sandbox >/dev/null || groupadd -g 1000 sandbox
     getent passwd sandbox >/dev/null || useradd -m -u 1000 -g 1000 -s /bin/bash sandbox'
# E2B's templates run as `user` in /home/user: the same uid, a second name and that home (the E2B
# API's `base` template is this image).
run_quiet "adding user user" chroot "$root" sh -c \
    'getent group user >/dev/null || groupadd -o -g 1000 user
     getent passwd user >/dev/null || useradd -o -M -u 1000 -g 1000 -d /home/user -s /bin/bash user
     mkdir -p /home/user && chown 1000:1000 /home/user && chmod 755 /home/user'
# uid and gid 1000 are named by their first entries: `user` first, so `whoami` and `id` say
# `user`, as E2B's SDK and its users assume (`sandbox` still names them for `-u sandbox`, `~sandbox`).
for f in passwd group; do
    awk -F: '$1 == "user" { next } $1 == "sandbox" { while ((getline l < u) > 0) if (l ~ /^user:/) print l } { print }' \
        u="$root/etc/$f" "$root/etc/$f" >"$root/etc/$f.new"
    chmod --reference="$root/etc/$f" "$root/etc/$f.new"
    mv "$root/etc/$f.new" "$root/etc/$f"
done

# Keep it small, and leave to Docker what Docker mounts.
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/cache/apt/*.bin \
    "$root"/var/lib/apt/lists/* "$root"/var/log/apt/* "$root"/var/log/*.log \
    "$root"/usr/share/man/* "$root"/usr/share/info/* "$root"/debootstrap \
    "$root"/tmp/* "$root"/var/tmp/*
find "$root/usr/share/doc" -mindepth 1 ! -name copyright ! -type d -delete 2>/dev/null || true
find "$root/usr/share/doc" -mindepth 1 -type d -empty -delete 2>/dev/null || true
find "$root/usr/lib" -name '__pycache__' -type d -prune -exec rm -rf {} + 2>/dev/null || true
rm -f "$root/etc/hostname" "$root/etc/resolv.conf"
: >"$root/etc/machine-id"
printf 'deb %s %s main\n' "$MIRROR" "$SUITE" >"$root/etc/apt/sources.list"

# The build this one replaces, removed once the tag moves (unless a container still uses it).
old=$(docker image inspect -f '{{.Id}}' "$IMAGE" 2>/dev/null || true)
# shellcheck disable=SC2016 # expanded by the inner sh
run_quiet "docker import $IMAGE" sh -c '
    tar -C "$1" --numeric-owner -cf - . | docker import \
        --change "CMD [\"/bin/bash\"]" \
        --change "LABEL daiv.recipe=$3" \
        --change "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
        - "$2"' sh "$root" "$IMAGE" "$RECIPE"
if [ -n "$old" ] && [ "$old" != "$(docker image inspect -f '{{.Id}}' "$IMAGE")" ]; then
    docker image rm "$old" >/dev/null 2>&1 || true
fi
