#!/usr/bin/env bash
# Make the OCI runtime `runsc` (gVisor, Debian's package) available to Docker and prove it works:
# installs runsc if missing, merges a `runsc` runtime into /etc/docker/daemon.json (other keys are
# kept; the file is rewritten only when it changes), reloads dockerd with SIGHUP, and runs a
# busybox container under runsc. Quiet on success; exits non-zero with a reason otherwise.
# Env: RUNSC_PLATFORM (default ptrace); GVISOR_TEST_IMAGE (default daiv-sandbox-busybox:local).
set -euo pipefail
here=$(dirname "$(readlink -f "$0")")
# shellcheck source=scripts/lib.sh
. "$here/lib.sh"

CONF=/etc/docker/daemon.json
PLATFORM=${RUNSC_PLATFORM:-ptrace}
TEST_IMAGE=${GVISOR_TEST_IMAGE:-daiv-sandbox-busybox:local}

"$here/ensure-docker.sh"

runtime_listed() {
    docker info --format '{{range $k, $v := .Runtimes}}{{$k}} {{end}}' 2>/dev/null \
        | tr ' ' '\n' | grep -qx runsc
}

verify() {
    local out rc=0
    out=$(timeout 120 docker run --rm --pull never --runtime runsc --network none "$TEST_IMAGE" \
        dmesg 2>&1) || rc=$?
    if [ "$rc" -ne 0 ] || ! grep -q 'Starting gVisor' <<<"$out"; then
        echo "error: ensure-gvisor.sh: a container under runsc did not start (exit $rc):" >&2
        tail -n 30 <<<"$out" >&2
        return 1
    fi
}

need_root
take_lock gvisor
command -v runsc >/dev/null 2>&1 || apt_ensure runsc
RUNSC=$(command -v runsc) || die "runsc is not installed and could not be installed"

mkdir -p "$(dirname "$CONF")"
changed=$(python3 - "$CONF" "$RUNSC" "$PLATFORM" <<'PY'
import json, os, sys, tempfile
conf, path, platform = sys.argv[1:4]
try:
    with open(conf) as f:
        text = f.read()
    data = json.loads(text) if text.strip() else {}
except FileNotFoundError:
    data = {}
except ValueError as e:
    sys.exit(f"error: ensure-gvisor.sh: {conf} is not valid JSON: {e}")
# --network=host: gVisor's own network stack cannot attach to a container's namespace on the
# test machines ("cannot run with network enabled in root network namespace"), so gVisor uses the
# container namespace's kernel stack instead. Isolated sessions stay isolated (their namespace has
# only loopback); egress sandboxes reach their gateway over the internal network.
want = {"path": path, "runtimeArgs": [f"--platform={platform}", "--network=host"]}
runtimes = data.setdefault("runtimes", {})
if runtimes.get("runsc") == want:
    print("no")
    sys.exit(0)
runtimes["runsc"] = want
runtimes.pop("runsc-net", None)
fd, tmp = tempfile.mkstemp(dir=os.path.dirname(conf) or ".", prefix=".daemon.json.")
with os.fdopen(fd, "w") as f:
    json.dump(data, f, indent=2)
    f.write("\n")
os.chmod(tmp, 0o644)
try:
    os.replace(tmp, conf)
except OSError:  # e.g. the file is a bind mount: write it in place
    os.unlink(tmp)
    with open(conf, "w") as f:
        json.dump(data, f, indent=2)
        f.write("\n")
print("yes")
PY
)

if [ "$changed" = yes ] || ! runtime_listed; then
    pid=$(pidof dockerd || true)
    [ -n "$pid" ] || die "dockerd is not running here, so $CONF cannot be reloaded (is Docker remote?)"
    # shellcheck disable=SC2086
    kill -HUP $pid
    ok=0
    for _ in $(seq 1 60); do
        if runtime_listed; then ok=1; break; fi
        sleep 0.5
    done
    [ "$ok" = 1 ] || die "dockerd did not list runtime runsc 30s after SIGHUP (see its log, e.g. /var/log/dockerd.log)"
fi

if ! image_exists "$TEST_IMAGE"; then
    [ "$TEST_IMAGE" = daiv-sandbox-busybox:local ] \
        || die "test image $TEST_IMAGE is missing (no registry here: build it locally)"
    "$here/../images/sandbox/build-busybox.sh"
fi
verify || die "gVisor (runsc $("$RUNSC" --version 2>/dev/null | head -n 1), platform $PLATFORM) cannot run containers here"
