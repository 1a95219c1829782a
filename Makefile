# corral — two commands do everything on a fresh Debian 12 machine (as root):
#   make run    installs what is missing, builds corral and the base template, starts the server
#   make test   installs what is missing and runs every test, integration tests included
#               (building the code-interpreter template once, when it is missing)

GO       ?= go
BIN      := bin/corral
DATA     ?= /var/lib/corral
LISTEN   ?= 127.0.0.1:7420
# Debian packages the server and the tests need (python3 and python3-venv:
# the Python SDK is installed into a venv and tested, test/integration/python_test.go;
# chromium: the console's browser test, test/integration/console_test.go).
DEB_PKGS := runc runsc debootstrap iproute2 nftables protobuf-compiler ca-certificates python3
# What only the tests need: python3-venv (the Python SDK's tests), postgresql
# (the store's second backend, started by the tests on 127.0.0.1), chromium
# (the console's browser tests).
TEST_PKGS := python3-venv postgresql chromium

# gVisor: runsc built from the Go module proxy at the version pinned in
# internal/runtime/oci/runsc.version (the one place; the server reads the
# same file), once, cached by version outside the repository. The server
# runs it by default; Debian's runsc (in DEB_PKGS) is only the fallback
# when this build is impossible, which the server says at start.
RUNSC_VERSION := $(shell cat internal/runtime/oci/runsc.version)
RUNSC_CACHE   ?= /var/cache/corral/runsc
RUNSC         := $(RUNSC_CACHE)/$(RUNSC_VERSION)/runsc

.PHONY: run test build deps test-deps install-pkgs runsc e2b-deps mcp-deps ui-deps code-interpreter kube-tools vet bench bench-deps proto clean

# corral-agent, beside corral, is the lean agent and supervisor the server
# runs beside and inside sandboxes (docs/performance.md, "Idle sandbox density").
build:
	CGO_ENABLED=0 $(GO) build -trimpath -o $(BIN) ./cmd/corral
	CGO_ENABLED=0 $(GO) build -trimpath -o $(dir $(BIN))corral-agent ./cmd/corral-agent

deps:
	@$(MAKE) --no-print-directory install-pkgs PKGS="$(DEB_PKGS)"

test-deps:
	@$(MAKE) --no-print-directory install-pkgs PKGS="$(TEST_PKGS)"

install-pkgs:
	@missing=""; for p in $(PKGS); do dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "ok installed" || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
		echo "installing:$$missing"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	fi

runsc: $(RUNSC)

$(RUNSC):
	@echo "building runsc $(RUNSC_VERSION) (gVisor, about 2 minutes, once)"
	@tmp=$$(mktemp -d) && \
	GOBIN=$$tmp CGO_ENABLED=0 nice -n 10 $(GO) install gvisor.dev/gvisor/runsc@$(RUNSC_VERSION) && \
	install -D -m 0755 $$tmp/runsc $@.tmp && mv $@.tmp $@; rc=$$?; rm -rf $$tmp; exit $$rc

# The e2b SDK (npm, pinned in test/e2b/package-lock.json) for the E2B
# compatibility tests. Node.js 20 comes with the machine; Debian's nodejs
# is installed when node is missing.
e2b-deps:
	@command -v node >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm; }
	@test -d test/e2b/node_modules/e2b && cmp -s test/e2b/package-lock.json test/e2b/node_modules/.package-lock.json.src 2>/dev/null || \
		{ npm ci --prefix test/e2b --no-audit --no-fund --loglevel=error && cp test/e2b/package-lock.json test/e2b/node_modules/.package-lock.json.src; }

# The official MCP TypeScript SDK (npm, pinned in test/mcp/package-lock.json)
# for the MCP client tests (TestMCPTypeScript).
mcp-deps:
	@command -v node >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm; }
	@test -d test/mcp/node_modules/@modelcontextprotocol/sdk && cmp -s test/mcp/package-lock.json test/mcp/node_modules/.package-lock.json.src 2>/dev/null || \
		{ npm ci --prefix test/mcp --no-audit --no-fund --loglevel=error && cp test/mcp/package-lock.json test/mcp/node_modules/.package-lock.json.src; }

# playwright-core (npm, pinned in test/ui/package-lock.json) drives Debian's
# chromium (TEST_PKGS) in the console's browser test (TestConsole). It
# downloads no browser of its own.
ui-deps:
	@command -v node >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm; }
	@test -d test/ui/node_modules/playwright-core && cmp -s test/ui/package-lock.json test/ui/node_modules/.package-lock.json.src 2>/dev/null || \
		{ npm ci --prefix test/ui --no-audit --no-fund --loglevel=error && cp test/ui/package-lock.json test/ui/node_modules/.package-lock.json.src; }

# The code-interpreter template the integration tests start, built only
# when the cache (by content, under /var/cache/corral/templates) lacks it:
# the build fetches Debian packages, the tests never do. It is built for
# the uid range a test server picks, from copies of the host's id files
# (so nothing is recorded in /etc), and registered in a throwaway data dir;
# each test server registers the cached build at start.
code-interpreter: build
	@tmp=$$(mktemp -d) && mkdir $$tmp/etc && \
	for f in subuid subgid passwd group; do cat /etc/$$f > $$tmp/etc/$$f 2>/dev/null || : > $$tmp/etc/$$f; done && \
	$(BIN) template build-code-interpreter --data $$tmp/data --id-files $$tmp/etc; rc=$$?; rm -rf $$tmp; exit $$rc

# kube-apiserver, etcd and kwok for the kube driver's tests
# (internal/runtime/kube), built from the Go module proxy as pinned by
# tools/kube/go.mod and cached by version under /var/cache/corral/kube
# (outside the repository): the first run pays about 15 min on 2 cores,
# later runs find the cache and build nothing.
kube-tools:
	GO=$(GO) tools/kube/build.sh

run: deps build
	@$(MAKE) --no-print-directory runsc || echo "warning: could not build runsc $(RUNSC_VERSION); gVisor sandboxes fall back to Debian's runsc (network none, no volumes)"
	$(BIN) serve --listen $(LISTEN) --data $(DATA)

vet:
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { echo "gofmt needed:"; gofmt -l $$(git ls-files '*.go'); exit 1; }
	$(GO) vet ./...

test: deps test-deps e2b-deps mcp-deps ui-deps runsc build code-interpreter kube-tools vet
	$(GO) test -count=1 -timeout 45m ./...

# Docker (Debian's docker.io) for the benchmarks' Docker baseline
# (test/bench/docker_test.go starts its own daemon and stops it after).
# Installed without starting its service: a policy-rc.d that refuses
# service starts is put in place for the install when the host has none.
bench-deps:
	@command -v dockerd >/dev/null || { \
		tmp_policy=""; if [ ! -e /usr/sbin/policy-rc.d ]; then printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod 755 /usr/sbin/policy-rc.d && tmp_policy=1; fi; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends docker.io; rc=$$?; \
		if [ -n "$$tmp_policy" ]; then rm -f /usr/sbin/policy-rc.d; fi; exit $$rc; }

# Results: bench-results/<UTC time>.json (or $$CORRAL_BENCH_OUT) and the
# Markdown table on stdout; go run ./test/bench/report renders a file again.
# CORRAL_BENCH_DENSITY=500 for the full density run (default 50).
bench: deps bench-deps runsc build
	$(GO) test -run '^$$' -bench . -benchtime 50x -timeout 30m ./test/bench/
	$(GO) test -run '^$$' -bench ProxyRequest -benchtime 500x ./internal/egress/
	$(GO) test -run '^$$' -bench ProxyThroughput -benchtime 10x ./internal/egress/

proto:
	GOBIN=/usr/local/bin $(GO) install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
	GOBIN=/usr/local/bin $(GO) install connectrpc.com/connect/cmd/protoc-gen-connect-go@v1.21.1
	./proto/generate.sh

clean:
	rm -rf bin
