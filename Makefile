# AgentENV build entry points. `make check` is the README's test command
# (setup, then the tests); `make test` runs the tests on a machine set up.
export PATH := /usr/local/go/bin:$(PATH)
GO ?= go
BIN := bin
GOFLAGS_STATIC := CGO_ENABLED=0

.PHONY: build setup check test bench guest vet clean

build:
	$(GOFLAGS_STATIC) $(GO) build -trimpath -o $(BIN)/ ./cmd/...

# The whole suite: unit, conformance (real QEMU VMs) and end-to-end tests.
# One package at a time: several packages boot a node server with VMs, and
# on 2 cores (TCG) running them side by side starves guests and has shown
# cross-node interference (see the session notes).
test: build
	$(GO) test -p 1 -count=1 -timeout 50m ./...

# Everything the tests need, installed from scratch when missing (idempotent):
# packages, Go, Node.js (scripts/setup.sh), E2B's npm SDKs and the other
# per-area setup (.ci/setup.d), the binaries and the guest image (built once up
# front, so VM tests sharing it do not race for it on the clock).
setup:
	./scripts/setup.sh
	for s in .ci/setup.d/*.sh; do echo "== setup: $$s"; bash "$$s" || exit 1; done
	$(MAKE) build
	$(BIN)/aenv guest build

check: setup
	$(MAKE) test

bench: build
	$(GO) test -run '^$$' -bench . -benchtime 1x -timeout 40m ./bench/...

# Guest assets (kernel, initramfs, rootfs) from Debian packages, cached by content hash.
guest: build
	$(BIN)/aenv guest build

vet:
	$(GO) vet ./...

clean:
	rm -rf $(BIN)
