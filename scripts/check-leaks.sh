#!/usr/bin/env bash
# Fails when any container, network or volume created by the service is still there: every test
# must clean up what it created, whatever its outcome.
set -euo pipefail
label=daiv.sandbox.managed
# The tests' own fixtures (upstream servers and their networks) must be gone too.
fixture=daiv.e2e
containers=$(docker ps -aq --filter "label=$label"; docker ps -aq --filter "label=$fixture")
networks=$(docker network ls -q --filter "label=$label"; docker network ls -q --filter "label=$fixture")
volumes=$(docker volume ls -q --filter "label=$label")
if [ -n "$containers$networks$volumes" ]; then
    echo "error: left behind by the test suite (label $label):" >&2
    [ -z "$containers" ] || { docker ps -a --filter "label=$label"; docker ps -a --filter "label=$fixture"; } >&2
    [ -z "$networks" ] || { docker network ls --filter "label=$label"; docker network ls --filter "label=$fixture"; } >&2
    [ -z "$volumes" ] || docker volume ls --filter "label=$label" >&2
    exit 1
fi
echo "check-leaks: no container, network or volume left behind"
