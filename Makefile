# AgentENV build entry points. `make test` is the README's test command.
GO ?= go
BIN := bin
GOFLAGS_STATIC := CGO_ENABLED=0

.PHONY: build test bench guest vet clean

build:
	$(GOFLAGS_STATIC) $(GO) build -trimpath -o $(BIN)/ ./cmd/...

# The whole suite: unit, conformance (real QEMU VMs) and end-to-end tests.
# One package at a time: several packages boot a node server with VMs, and
# on 2 cores (TCG) running them side by side starves guests and has shown
# cross-node interference (see the session notes).
test: build
	$(GO) test -p 1 -count=1 -timeout 50m ./...

bench: build
	$(GO) test -run '^$$' -bench . -benchtime 1x -timeout 40m ./bench/...

# Guest assets (kernel, initramfs, rootfs) from Debian packages, cached by content hash.
guest: build
	$(BIN)/aenv guest build

vet:
	$(GO) vet ./...

clean:
	rm -rf $(BIN)
