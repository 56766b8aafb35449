# daiv-sandbox: `make run` starts the service on an embedded default; `make test` runs everything.
SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help

CARGO ?= cargo
DEV_DIR := .dev
PORT ?= 8000
# E2B's API (`make run`): its control API and envd on one port of their own.
E2B_PORT ?= 49983
OPENSANDBOX_PORT ?= 8090
FUZZ_SECONDS ?= 60
FUZZ_SMOKE_SECONDS ?= 10
LEAK_BASELINE := $(DEV_DIR)/leak-baseline
SOAK_SESSIONS ?= 50
SOAK_SECONDS ?= 600
SOAK_SMOKE_SESSIONS ?= 8
SOAK_SMOKE_SECONDS ?= 60
# `make test-e2e SUITE=pool`: one e2e suite (tests/tests/pool.rs); empty: all of them.
SUITE ?=
# KEEP_ENGINES=1: `make test` / `make test-e2e` leave the fleet's Docker-in-Docker engines up for
# the next run (by default they stop at the end what they started, pass or fail).
KEEP_ENGINES ?= 0
JUNIT := target/nextest/ci/junit.xml

.PHONY: help fmt lint clippy build static helper images images-static images-code-interpreter images-host host compose-smoke docker gvisor redis registry chromium venv run test test-steps e2e-steps test-unit test-quick test-e2e check-leaks clean-docker cargo-fuzz fuzz fuzz-smoke chaos deny api-fuzz api-fuzz-smoke soak soak-smoke fleet-engines engines-up fleet

help: ## List the targets
	@grep -E '^[a-zA-Z0-9_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-14s %s\n", $$1, $$2}'

fmt: ## Format the code
	$(CARGO) fmt --all

lint: ## cargo fmt --check and clippy with -D warnings
	$(CARGO) fmt --all -- --check
	@$(MAKE) --no-print-directory clippy

clippy:
	$(CARGO) clippy --workspace --all-targets -- -D warnings

# `--tests` too: the binaries then get the features the test build has (dev-dependencies turn on
# tokio's test-util, for one), so `cargo nextest run` and clippy reuse these artifacts instead of
# rebuilding half the dependency graph with another feature set.
build: helper ## Build every binary and test (debug), and the static session helper
	$(CARGO) build --workspace --bins --tests

static: ## The static release binaries of the images and sandboxes, in one cargo invocation
	@scripts/build-static.sh

helper: static ## Build the static session helper every sandbox gets (target/helper/)
	@images/helper/build.sh

docker: ## Start the Docker engine if none answers
	@scripts/ensure-docker.sh

gvisor: docker ## Register gVisor (runsc) with Docker and check it works
	@scripts/ensure-gvisor.sh

redis: ## Install redis-server (tests start their own on free loopback ports)
	@scripts/ensure-redis.sh >/dev/null

registry: ## Install docker-registry and htpasswd (the private-registry tests start their own registry)
	@scripts/ensure-registry.sh >/dev/null

chromium: ## Install Debian's chromium (the /docs browser test drives it headless)
	@scripts/ensure-chromium.sh >/dev/null

venv: ## Make target/venv with the official MCP Python SDK, and target/venv-e2b-* with E2B's (the e2e tests drive the service with them)
	@scripts/ensure-python-venv.sh >/dev/null
	@for r in integration/python/e2b-*.txt integration/python/opensandbox-*.txt; do scripts/ensure-python-venv.sh "$$(basename "$$r" .txt)" >/dev/null; done

images: images-host images-static images-code-interpreter ## Build the local images (no registry needed): sandboxes, code interpreter, gateway, service, Redis

# The images built from this checkout's static binaries (cargo).
images-static: docker static
	@images/egress-gateway/build-local.sh
	@images/control-plane/build-local.sh

# The code interpreter's image: the Debian image, pinned wheels (fetched from PyPI once) and this
# checkout's static daiv-code-interpreter.
images-code-interpreter: images-host images-static
	@images/code-interpreter/build.sh

# The images that need no cargo: debootstrapped sandboxes, Debian's Redis.
images-host: docker
	@images/sandbox/build.sh
	@integration/compose/build-redis-image.sh

# Everything `make test` prepares on the host without cargo (packages, debootstrapped images, the
# Docker-in-Docker image, the Python venv): it runs beside the compilation.
host: images-host gvisor redis registry chromium venv
	@images/dind/build.sh

compose-smoke: images ## Bring up integration/compose.yaml, check health and a session end to end, tear it down
	@integration/compose/smoke.sh

run: docker images helper ## Build and start the service on 127.0.0.1:$(PORT) with a dev API key
	@mkdir -p $(DEV_DIR) && chmod 700 $(DEV_DIR)
	@[ -s $(DEV_DIR)/api-key ] || (umask 077; head -c 24 /dev/urandom | base64 | tr -d '/+=' > $(DEV_DIR)/api-key)
	@[ -s $(DEV_DIR)/egress-ca.key ] || docker run --rm --pull never --user "$$(id -u):$$(id -g)" \
		-v "$(CURDIR)/$(DEV_DIR):/out" daiv-sandbox-egress:local \
		gen-ca --cert-out /out/egress-ca.crt --key-out /out/egress-ca.key >/dev/null
	$(CARGO) build --release -p control-plane
	@echo "daiv-sandbox dev API key: $$(cat $(DEV_DIR)/api-key)  (stored in $(DEV_DIR)/api-key)"
	@echo "try: curl -H \"X-API-Key: \$$(cat $(DEV_DIR)/api-key)\" http://127.0.0.1:$(PORT)/api/v1/-/health/"
	@echo "E2B's SDK (e2b 2.45.1 to 2.63.0) against it:"
	@echo "  export E2B_API_KEY=$$(cat $(DEV_DIR)/api-key)"
	@echo "  export E2B_API_URL=http://127.0.0.1:$(E2B_PORT)"
	@echo "  export E2B_SANDBOX_URL=http://127.0.0.1:$(E2B_PORT)"
	@echo "  export E2B_VALIDATE_API_KEY=false  # older e2b releases (2.45 among them) check the key's shape"
	@echo "OpenSandbox's SDK (opensandbox 1.1.1 to 1.2.1) against it:"
	@echo "  export OPEN_SANDBOX_DOMAIN=127.0.0.1:$(OPENSANDBOX_PORT)"
	@echo "  export OPEN_SANDBOX_API_KEY=$$(cat $(DEV_DIR)/api-key)"
	MALLOC_ARENA_MAX=$${MALLOC_ARENA_MAX:-2} \
	DAIV_SANDBOX_API_KEY="$$(cat $(DEV_DIR)/api-key)" \
	DAIV_SANDBOX_ENVIRONMENT=local \
	DAIV_SANDBOX_HOST="$${DAIV_SANDBOX_HOST:-127.0.0.1}" \
	DAIV_SANDBOX_PORT=$(PORT) \
	DAIV_SANDBOX_E2B_PORT=$(E2B_PORT) \
	DAIV_SANDBOX_OPENSANDBOX_PORT=$(OPENSANDBOX_PORT) \
	DAIV_SANDBOX_EGRESS_CA_CERT_FILE="$(CURDIR)/$(DEV_DIR)/egress-ca.crt" \
	DAIV_SANDBOX_EGRESS_CA_KEY_FILE="$(CURDIR)/$(DEV_DIR)/egress-ca.key" \
	exec ./target/release/daiv-sandbox

test-unit: ## Unit and in-process tests only (no Docker)
	$(CARGO) nextest run --workspace --exclude e2e

# The e2e suites' needs, read from their sources (so a new suite is covered): gVisor when one
# names runsc, Redis, the private registry, Chromium, the fleet's engines, the Python venv.
SUITE_FILES = $(if $(SUITE),tests/tests/$(SUITE).rs,$(wildcard tests/tests/*.rs))
suite_uses = $(shell grep -lE '$(1)' $(SUITE_FILES) 2>/dev/null)
E2E_NEEDS = $(if $(call suite_uses,runsc),gvisor) $(if $(call suite_uses,Redis::start),redis) \
	$(if $(call suite_uses,PrivateRegistry),registry) $(if $(call suite_uses,chromiumoxide),chromium) \
	$(if $(call suite_uses,e2e::fleet),fleet-engines) $(if $(call suite_uses,ensure-python-venv),venv)

test-e2e: ## One e2e suite, after starting only what it needs: `make test-e2e SUITE=pool`; no SUITE: all
	@if [ -n "$(SUITE)" ] && [ ! -f tests/tests/$(SUITE).rs ]; then \
		echo "no e2e suite '$(SUITE)'; one of: $$(cd tests/tests && ls *.rs | sed 's/\.rs$$//' | xargs)" >&2; \
		exit 2; fi
	@scripts/engines-guard.sh $(MAKE) --no-print-directory e2e-steps

# `--workspace` and a filter rather than `-p e2e --test SUITE`: features unify over the packages a
# build selects, so `-p e2e` alone would rebuild much of the graph `make build` just built.
e2e-steps: docker images build $(E2E_NEEDS)
	@rm -f $(JUNIT)
	@rc=0; $(CARGO) nextest run --workspace --profile ci \
		-E 'package(e2e)$(if $(SUITE), & binary(=$(SUITE)))' || rc=$$?; \
		python3 scripts/test-times.py $(JUNIT) || true; exit $$rc

test-quick: images redis registry chromium build ## All but the gVisor, fleet and chaos tests (nextest profile `quick`): no runsc, no DinD
	@rm -f target/nextest/quick/junit.xml
	@rc=0; $(CARGO) nextest run --workspace --profile quick || rc=$$?; \
		python3 scripts/test-times.py target/nextest/quick/junit.xml || true; exit $$rc

# scripts/test-all.sh: the host's preparation (no cargo) beside the compilation, then
# `test-steps`; per-binary test times at the end; the fleet's engines stopped if it started them.
test: ## Everything: lint, unit, in-process and end-to-end tests on real Docker (KEEP_ENGINES=1: keep the DinD engines)
	@scripts/engines-guard.sh scripts/test-all.sh

test-steps:
	@mkdir -p $(DEV_DIR) && scripts/check-leaks.sh --record $(LEAK_BASELINE)
	$(CARGO) nextest run --workspace --profile ci
	@SERVICE_PROFILE=debug SERVICE_PREBUILT=1 $(MAKE) --no-print-directory soak-smoke api-fuzz-smoke
	@scripts/check-leaks.sh --since $(LEAK_BASELINE)

cargo-fuzz: ## Install cargo-fuzz (runs the fuzz targets); a no-op when it is installed
	@command -v cargo-fuzz >/dev/null 2>&1 || $(CARGO) install cargo-fuzz --locked

fuzz: cargo-fuzz ## Fuzz each target (fuzz/) for FUZZ_SECONDS (60), one at a time; prints executions
	@fuzz/run.sh $(FUZZ_SECONDS)

fuzz-smoke: cargo-fuzz ## Replay the fuzz regressions, then fuzz each target for FUZZ_SMOKE_SECONDS (10)
	@fuzz/run.sh --smoke $(FUZZ_SMOKE_SECONDS)

chaos: images gvisor build ## Every fault test, including a dockerd restart (alone: it breaks whatever runs beside it)
	$(CARGO) nextest run --workspace -E 'package(e2e) & binary(=chaos)' --run-ignored all --test-threads 1
	@scripts/check-leaks.sh

deny: ## Licenses, bans and sources (offline); RustSec advisories too where their database can be fetched
	@command -v cargo-deny >/dev/null 2>&1 || $(CARGO) install cargo-deny --locked
	$(CARGO) deny check licenses bans sources
	@if $(CARGO) deny fetch >/dev/null 2>&1; then $(CARGO) deny check advisories; \
	else echo "advisory database unreachable (offline): advisories not checked"; fi

api-fuzz: docker images ## schemathesis against the served OpenAPI document, real sessions (~300 cases per operation + 600 s stateful; fails unless it follows every link)
	@integration/schemathesis/run.sh

api-fuzz-smoke: docker images ## The same, ~15 cases per operation and 30 s stateful from POST /session/ (fails unless it follows every link of a create's answer; under 2 minutes once built)
	@integration/schemathesis/run.sh --smoke

soak: docker images ## SOAK_SESSIONS (50) busy sessions for SOAK_SECONDS (600): errors, p50/p99, RSS, Docker objects left
	@SOAK_SESSIONS=$(SOAK_SESSIONS) SOAK_SECONDS=$(SOAK_SECONDS) integration/scripts/soak.sh

soak-smoke: docker images ## The soak with SOAK_SMOKE_SESSIONS (8) sessions for SOAK_SMOKE_SECONDS (60)
	@SOAK_SESSIONS=$(SOAK_SMOKE_SESSIONS) SOAK_SECONDS=$(SOAK_SMOKE_SECONDS) integration/scripts/soak.sh

fleet-engines: docker images ## Start three Docker-in-Docker engines over mutual TLS for the fleet tests (scripts/fleet-engines.sh)
	@$(MAKE) --no-print-directory engines-up

# The engines alone, the images being built (scripts/test-all.sh runs it beside the debug build:
# `images` would wait for cargo's lock).
engines-up:
	@FLEET_IMAGES="daiv-sandbox-busybox:local daiv-sandbox-debian:local daiv-sandbox-egress:local" \
		scripts/fleet-engines.sh up >/dev/null

fleet: fleet-engines redis build ## The fleet on three DinD engines: its e2e tests (also in `make test`), then scripts/fleet-bench.sh
	$(CARGO) nextest run --workspace -E 'package(e2e) & binary(=fleet)' --profile ci
	@scripts/fleet-bench.sh

check-leaks: ## Fail if containers or networks created by the service are left behind
	@scripts/check-leaks.sh

clean-docker: ## Remove every container, network, volume and image created by the service
	scripts/clean-docker.sh
