#!/bin/sh
# Entrypoint of daiv-sandbox-dind:local (run under tini, PID 1): a Docker engine that listens only
# on tcp://0.0.0.0:2376 with mutual TLS (plus its own unix socket, inside the container only).
#
# Mounts it expects:
#   $DIND_CERT_DIR (default /certs), read-only: ca.pem (the CA that signs the clients), cert.pem
#       and key.pem (this engine's server certificate and key)
#   /var/lib/docker: a volume (overlay2 cannot sit on the container's own overlay filesystem)
# Extra arguments go to dockerd.
set -eu
certs=${DIND_CERT_DIR:-/certs}
for f in ca.pem cert.pem key.pem; do
    if [ ! -r "$certs/$f" ]; then
        echo "dind: $certs/$f is missing (mount the engine's certificate directory at $certs)" >&2
        exit 1
    fi
done

# A container started again after a kill finds the last run's pid files and sockets: clear them,
# as a reboot would (dockerd refuses to start over a pid file naming a live pid, maybe its own).
rm -rf /run/docker /run/containerd /run/docker.pid /run/docker.sock

# Nest the inner containers' cgroups under this container's own (cgroup v1, host cgroup namespace):
# pausing this container then freezes them too, and removing it removes their cgroups.
parent=$(awk -F: '$2 == "memory" { print $3; exit }' /proc/self/cgroup 2>/dev/null || true)
case $parent in
/ | "") set -- "$@" ;;
*) set -- --cgroup-parent="$parent" "$@" ;;
esac

# --dns: the inner containers get a loopback resolver, never the host's or a public one.
exec dockerd \
    --host=tcp://0.0.0.0:2376 \
    --host=unix:///run/docker.sock \
    --tlsverify \
    --tlscacert="$certs/ca.pem" \
    --tlscert="$certs/cert.pem" \
    --tlskey="$certs/key.pem" \
    --storage-driver=overlay2 \
    --data-root=/var/lib/docker \
    --exec-opt=native.cgroupdriver=cgroupfs \
    --iptables=true \
    --dns=127.0.0.1 \
    --shutdown-timeout=10 \
    "$@"
