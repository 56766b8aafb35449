# shellcheck shell=bash
# Shared helpers for the scripts under scripts/ and images/. Source it; don't run it.
# Everything here is quiet on success and prints the captured output on failure.

export DEBIAN_FRONTEND=noninteractive
: "${DAIV_CACHE_DIR:=/var/cache/daiv-sandbox}"

die() {
    echo "error: $(basename "$0"): $*" >&2
    exit 1
}

note() {
    echo "$(basename "$0"): $*" >&2
}

# run_quiet DESCRIPTION CMD...: run CMD with its output captured; on failure print it and die.
run_quiet() {
    local what=$1 log rc=0
    shift
    log=$(mktemp)
    "$@" >"$log" 2>&1 </dev/null || rc=$?
    if [ "$rc" -ne 0 ]; then
        echo "error: $(basename "$0"): $what failed (exit $rc):" >&2
        tail -n 60 "$log" >&2
        rm -f "$log"
        exit "$rc"
    fi
    rm -f "$log"
}

need_root() {
    [ "$(id -u)" -eq 0 ] || die "must run as root (it installs packages / talks to dockerd)"
}

pkg_installed() {
    dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'
}

_apt_has_candidate() {
    local cand
    cand=$(apt-cache policy "$1" 2>/dev/null | awk '/Candidate:/ {print $2}')
    [ -n "$cand" ] && [ "$cand" != "(none)" ]
}

_APT_UPDATED=0
apt_update_once() {
    [ "$_APT_UPDATED" -eq 1 ] && return 0
    run_quiet "apt-get update" apt-get update -q -o DPkg::Lock::Timeout=300
    _APT_UPDATED=1
}

# apt_run ARGS...: apt-get with a lock timeout, no prompts, and services kept from starting
# (tests start their own daemons); retries once after `apt-get update` (stale lists give 404s).
apt_run() {
    local made_policy=0 rc=0 log
    if [ ! -e /usr/sbin/policy-rc.d ]; then
        printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
        chmod 755 /usr/sbin/policy-rc.d
        made_policy=1
    fi
    log=$(mktemp)
    apt-get -y -q -o DPkg::Lock::Timeout=300 -o Dpkg::Options::=--force-confdef \
        -o Dpkg::Options::=--force-confold "$@" >"$log" 2>&1 </dev/null || rc=$?
    if [ "$rc" -ne 0 ] && [ "$_APT_UPDATED" -eq 0 ]; then
        apt_update_once
        rc=0
        apt-get -y -q -o DPkg::Lock::Timeout=300 -o Dpkg::Options::=--force-confdef \
            -o Dpkg::Options::=--force-confold "$@" >"$log" 2>&1 </dev/null || rc=$?
    fi
    [ "$made_policy" -eq 1 ] && rm -f /usr/sbin/policy-rc.d
    if [ "$rc" -ne 0 ]; then
        echo "error: $(basename "$0"): apt-get $* failed (exit $rc):" >&2
        tail -n 60 "$log" >&2
        rm -f "$log"
        exit "$rc"
    fi
    rm -f "$log"
}

# apt_ensure PKG...: install the packages that are not installed yet.
apt_ensure() {
    local missing=() p
    for p in "$@"; do
        pkg_installed "$p" || missing+=("$p")
    done
    [ "${#missing[@]}" -eq 0 ] && return 0
    need_root
    for p in "${missing[@]}"; do
        _apt_has_candidate "$p" || { apt_update_once; break; }
    done
    apt_run install --no-install-recommends "${missing[@]}"
}

docker_ok() {
    timeout 20 docker info >/dev/null 2>&1
}

image_exists() {
    docker image inspect "$1" >/dev/null 2>&1
}

# take_lock NAME: hold an exclusive lock until this script exits, so parallel callers (tests
# started side by side) build or configure once; later callers then find the work done.
take_lock() {
    mkdir -p "$DAIV_CACHE_DIR"
    exec 9>"$DAIV_CACHE_DIR/.$1.lock"
    flock -w 900 9 || die "timed out waiting for lock $DAIV_CACHE_DIR/.$1.lock"
}

# find_mirror: print the Debian main archive (bookworm) of the machine's apt sources (deb822 first,
# then one-line style); prints nothing when there is none.
find_mirror() {
    python3 - <<'PY'
import glob, re
def good(uri, suites):
    return uri.startswith(("http://", "https://")) and "security" not in uri \
        and any(s.split("-")[0] == "bookworm" or s in ("stable",) for s in suites)
for path in sorted(glob.glob("/etc/apt/sources.list.d/*.sources")):
    try:
        text = open(path).read()
    except OSError:
        continue
    for stanza in re.split(r"\n\s*\n", text):
        fields = {}
        for line in stanza.splitlines():
            if line.startswith("#") or ":" not in line or line[0].isspace():
                continue
            k, v = line.split(":", 1)
            fields[k.strip().lower()] = v.split()
        if fields.get("enabled", ["yes"])[0].lower() == "no":
            continue
        if "deb" not in fields.get("types", []):
            continue
        suites = fields.get("suites", [])
        for uri in fields.get("uris", []):
            if good(uri, suites):
                print(uri.rstrip("/")); raise SystemExit
for path in ["/etc/apt/sources.list"] + sorted(glob.glob("/etc/apt/sources.list.d/*.list")):
    try:
        lines = open(path).read().splitlines()
    except OSError:
        continue
    for line in lines:
        line = re.sub(r"\[[^]]*\]", " ", line.split("#", 1)[0]).split()
        if len(line) >= 3 and line[0] == "deb" and good(line[1], [line[2]]):
            print(line[1].rstrip("/")); raise SystemExit
PY
}

# unmount_under DIR: lazily unmount everything mounted at or below DIR (deepest first).
unmount_under() {
    awk -v r="$1" 'index($2, r) == 1 { print $2 }' /proc/mounts | sort -r \
        | while read -r m; do umount -l "$m" 2>/dev/null || true; done
}

# debootstrap_rootfs WORK SUITE VARIANT INCLUDE MIRROR: a Debian rootfs at WORK/rootfs. The .debs
# are cached as a debootstrap tarball under $DAIV_CACHE_DIR/debian, keyed by what it holds, so a
# rebuild needs no network; a tarball that fails to unpack is dropped. Whatever debootstrap left
# mounted in the tree is unmounted. The caller removes WORK (after `unmount_under WORK/rootfs`).
debootstrap_rootfs() {
    local work=$1 suite=$2 variant=$3 include=$4 mirror=$5
    local arch cache key tarball root
    arch=$(dpkg --print-architecture)
    cache="$DAIV_CACHE_DIR/debian"
    mkdir -p "$cache"
    key=$(printf '%s\n' "$suite" "$variant" "$include" "$arch" | sha256sum | cut -c1-12)
    tarball="$cache/debootstrap-$suite-$variant-$arch-$key.tgz"
    root="$work/rootfs"
    local common=(--variant="$variant" --include="$include" --arch="$arch")
    if [ ! -s "$tarball" ]; then
        run_quiet "debootstrap --make-tarball from $mirror" \
            debootstrap "${common[@]}" --make-tarball="$work/debs.tgz" "$suite" "$work/dl" "$mirror"
        mv "$work/debs.tgz" "$tarball"
        rm -rf --one-file-system "$work/dl"
    fi
    if ! debootstrap "${common[@]}" --unpack-tarball="$tarball" "$suite" "$root" "$mirror" \
            >"$work/debootstrap.log" 2>&1 </dev/null; then
        echo "error: $(basename "$0"): debootstrap from $tarball failed; dropping that cache entry:" >&2
        tail -n 40 "$work/debootstrap.log" >&2
        tail -n 20 "$root/debootstrap/debootstrap.log" >&2 2>/dev/null || true
        rm -f "$tarball"
        exit 1
    fi
    unmount_under "$root"
}

# build_once IMAGE LOCK [RECIPE]: exit the calling script when IMAGE exists (unless FORCE=1) and,
# given RECIPE, carries it as its daiv.recipe label (an image built by an older script is built
# again); else take the lock LOCK (root), then check again: someone else may have built it while
# we waited.
build_once() {
    "$(dirname "${BASH_SOURCE[0]}")/ensure-docker.sh"
    if [ "${FORCE:-0}" != 1 ] && image_current "$1" "${3:-}"; then
        exit 0
    fi
    need_root
    take_lock "$2"
    if [ "${FORCE:-0}" != 1 ] && image_current "$1" "${3:-}"; then
        exit 0
    fi
}

# image_current IMAGE [RECIPE]: IMAGE exists and, given RECIPE, is labelled daiv.recipe=RECIPE.
image_current() {
    image_exists "$1" || return 1
    [ -z "${2:-}" ] && return 0
    [ "$(docker image inspect --format '{{ index .Config.Labels "daiv.recipe" }}' "$1" 2>/dev/null)" = "$2" ]
}

# recipe_of FILE...: a short digest of the files an image is built from.
recipe_of() {
    cat "$@" | sha256sum | cut -c1-12
}

# debootstrap_workdir NAME: set work (a new directory under /var/tmp) and root (work/rootfs), and
# remove them at exit, unmounting first whatever debootstrap left mounted in the tree.
debootstrap_workdir() {
    work=$(mktemp -d "/var/tmp/$1.XXXXXX")
    root="$work/rootfs"
    trap 'if [ -d "$root" ]; then unmount_under "$root"; fi; rm -rf --one-file-system "$work"' EXIT
}

# debian_mirror: the Debian archive to debootstrap from: $DEBIAN_MIRROR, else the machine's apt
# source, else deb.debian.org.
debian_mirror() {
    local m=${DEBIAN_MIRROR:-$(find_mirror || true)}
    echo "${m:-http://deb.debian.org/debian}"
}
