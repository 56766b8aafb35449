#!/usr/bin/env bash
# Build the image daiv-sandbox-busybox:local with `docker import` from a rootfs made of Debian's
# busybox-static (no registry needed). Skips when the tag exists, unless FORCE=1.
# Env: FORCE=1 to rebuild; IMAGE to change the tag; DAIV_CACHE_DIR for the cached .deb.
set -euo pipefail
here=$(dirname "$(readlink -f "$0")")
# shellcheck source=scripts/lib.sh
. "$here/../../scripts/lib.sh"

IMAGE=${IMAGE:-daiv-sandbox-busybox:local}

build_once "$IMAGE" build-busybox

# The binary comes from Debian's busybox-static .deb, fetched into the cache and unpacked there:
# installing the package on the host would conflict with Debian's dynamic `busybox` package.
cache="$DAIV_CACHE_DIR/busybox"
mkdir -p "$cache"
newest_deb() {
    find "$cache" -maxdepth 1 -name 'busybox-static_*.deb' | sort -V | tail -n 1
}
deb=$(newest_deb)
if [ -z "$deb" ]; then
    if ! (cd "$cache" && apt-get download -q busybox-static >/dev/null 2>&1); then
        apt_update_once
        (cd "$cache" && run_quiet "apt-get download busybox-static" apt-get download -q busybox-static)
    fi
    deb=$(newest_deb)
    [ -n "$deb" ] || die "apt-get download busybox-static left no .deb in $cache"
fi

work=$(mktemp -d /var/tmp/daiv-busybox.XXXXXX)
trap 'rm -rf --one-file-system "$work"' EXIT
run_quiet "unpacking $deb" dpkg-deb -x "$deb" "$work/pkg"
bb="$work/pkg/bin/busybox"
[ -x "$bb" ] || die "no bin/busybox in $deb"

root="$work/rootfs"
mkdir -p "$root"/{bin,sbin,usr/bin,usr/sbin,etc,root,home/sandbox,tmp,proc,sys,dev,var/tmp,run}
install -m 0755 "$bb" "$root/bin/busybox"
# Symlink every applet at its usual place (what `busybox --install -s` does, without a chroot).
"$bb" --list-full | while read -r applet; do
    [ "$applet" = bin/busybox ] && continue
    [ -L "$root/$applet" ] || [ -e "$root/$applet" ] || ln -s /bin/busybox "$root/$applet"
done
for a in sh ls find grep cat mkdir rm sleep ps kill timeout setsid id env stat base64 head tail \
         wc sed awk tar chmod chown; do
    found=0
    for d in bin usr/bin sbin usr/sbin; do
        [ -L "$root/$d/$a" ] && found=1
    done
    [ "$found" = 1 ] || die "busybox in $deb has no applet '$a'"
done

cat >"$root/etc/passwd" <<'PASSWD'
root:x:0:0:root:/root:/bin/sh
sandbox:x:1000:1000:sandbox:/home/sandbox:/bin/sh
nobody:x:65534:65534:nobody:/nonexistent:/bin/false
PASSWD
cat >"$root/etc/group" <<'GROUP'
root:x:0:
sandbox:x:1000:
nogroup:x:65534:
GROUP
printf 'root:*::0:::::\nsandbox:*::0:::::\nnobody:*::0:::::\n' >"$root/etc/shadow"
chmod 0644 "$root/etc/passwd" "$root/etc/group"
chmod 0600 "$root/etc/shadow"
chmod 1777 "$root/tmp" "$root/var/tmp"
chmod 0700 "$root/root"
chown 1000:1000 "$root/home/sandbox"

# shellcheck disable=SC2016 # expanded by the inner sh
run_quiet "docker import $IMAGE" sh -c '
    tar -C "$1" --numeric-owner -cf - . | docker import \
        --change "CMD [\"/bin/sh\"]" \
        --change "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
        - "$2"' sh "$root" "$IMAGE"
