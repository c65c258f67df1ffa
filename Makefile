# AgentENV build entry points. `make check` is the README's test command
# (setup, then the tests); `make test` runs the tests on a machine set up.
export PATH := /usr/local/go/bin:$(PATH)
GO ?= go
BIN := bin
GOFLAGS_STATIC := CGO_ENABLED=0

.PHONY: build dashboard setup check test test-unit test-race test-k8s fuzz soak bench guest vet clean release

build: dashboard
	$(GOFLAGS_STATIC) $(GO) build -trimpath -o $(BIN)/ ./cmd/...

# The web dashboard's front end (TypeScript under dashboard/web) into
# dashboard/dist, which aenvd and aenv-gateway embed. Its npm packages come
# from .ci/setup.d/64-dashboard.sh (npm ci, pinned by package-lock.json);
# installed here too when missing.
dashboard:
	[ -d dashboard/web/node_modules/esbuild ] || npm ci --prefix dashboard/web --no-audit --no-fund --prefer-offline --loglevel=error
	npm run --prefix dashboard/web --silent build

# The whole suite: unit, conformance (real QEMU VMs) and end-to-end tests.
# One package at a time: several packages boot a node server with VMs, and
# on 2 cores (TCG) running them side by side starves guests and has shown
# cross-node interference. The events of the test passes are kept as JSON
# under $(TESTLOG) and shown as plain `go test` output (internal/testenv/testsum);
# the skipped tests and their reasons are listed at the end, pass or fail.
# Under CI=true a test whose tool the setup should have installed fails
# instead of skipping (internal/testenv).
TESTLOG ?= $(BIN)/test-events
TESTSUM = $(GO) run ./internal/testenv/testsum
test: build
	@mkdir -p $(TESTLOG); rm -f $(TESTLOG)/*.json; rc=0; \
	$(MAKE) test-unit || rc=1; \
	if [ $$rc = 0 ]; then $(MAKE) test-race && $(MAKE) fuzz && $(MAKE) test-k8s || rc=1; fi; \
	$(TESTSUM) -report $(TESTLOG)/*.json; exit $$rc

test-unit:
	@mkdir -p $(TESTLOG)
	bash -o pipefail -c '$(GO) test -json -p 1 -count=1 -timeout 50m ./... | tee $(TESTLOG)/unit.json | $(TESTSUM)'

# The race detector over every package whose tests boot no VM
# (scripts/race-packages.sh), the tests that boot none in the packages
# where others do (scripts/race-vm-unit.sh: network, vmm/qemu, vmm/memsnap,
# template, storage/ublk, ...), and one end-to-end test against a race-built
# aenvd (api/aenvdtest builds it with -race when AENVDTEST_RACE=1; a race
# report makes its exit status, and so the test, fail).
test-race:
	$(GO) test -race -count=1 -timeout 30m $$(./scripts/race-packages.sh)
	./scripts/race-vm-unit.sh | while read -r pkg run; do $(GO) test -race -count=1 -timeout 10m -run "$$run" "$$pkg" || exit 1; done
	AENVDTEST_RACE=1 $(GO) test -count=1 -timeout 20m -run 'TestConcurrentLifecycleCalls$$' ./api/e2e/

# Kubernetes discovery against a real kube-apiserver over a real etcd, both
# built from the Go module proxy (cached by version; make setup starts the
# build in the background, this waits for it). In the run above the test
# skips when the binaries are not built yet; here it must run.
test-k8s:
	bash cluster/discovery/internal/k8stools/build.sh
	@mkdir -p $(TESTLOG)
	bash -o pipefail -c "AENV_K8S_REQUIRED=1 $(GO) test -json -count=1 -run 'TestKubernetesAPIServer\$$' ./cluster/discovery/ | tee $(TESTLOG)/k8s.json | $(TESTSUM)"

# Every fuzz target of the module, mutating for FUZZTIME each (default 3s;
# scripts/fuzz.sh): parsers of untrusted bytes keep being fuzzed, not only
# replayed from their seed corpora as `go test` does.
fuzz:
	./scripts/fuzz.sh

# The long runs, each at SOAK_RESTORES restores: vmm/qemu's restore torture
# test, of each variant named in SOAK_VARIANTS (comma-separated, or "all":
# every mapping, chain, CPU model, TCG option and clock source it compares),
# printing restores and guest panics per variant; then api/e2e's SDK restore
# soak, one sandbox on a node restored through E2B's SDK (pause and connect,
# snapshot and a create from it) with every seeded byte checked and the
# guest's kernel log and console scanned after each restore, printing
# restores, panics and the time per restore (docs/architecture.md, "Guest
# panics after restores", has the measured figures to schedule it by). The
# normal test run keeps their CI sizes. They boot VMs, so each waits for the
# machine's VM lock like every VM test here.
SOAK_RESTORES ?= 1000
SOAK_VARIANTS ?= base
soak:
	AENV_TORTURE_RESTORES=$(SOAK_RESTORES) AENV_TORTURE_VARIANTS=$(SOAK_VARIANTS) \
		flock /tmp/aenv-vm.lock $(GO) test -count=1 -timeout 12h -v -run 'TestRestoreTorture$$' ./vmm/qemu/
	AENV_SOAK_RESTORES=$(SOAK_RESTORES) \
		flock /tmp/aenv-vm.lock $(GO) test -count=1 -timeout 12h -v -run 'TestSDKRestoreSoak$$' ./api/e2e/

# Everything the tests need, installed from scratch when missing (idempotent):
# packages, Go, Node.js (scripts/setup.sh), E2B's npm SDKs and the other
# per-area setup (.ci/setup.d), the binaries and the guest image (built once up
# front, so VM tests sharing it do not race for it on the clock), with the
# code-interpreter-v1 and compose-v1 root filesystems (their apt installs done
# here, not in a test).
setup:
	./scripts/setup.sh
	for s in .ci/setup.d/*.sh; do echo "== setup: $$s"; bash "$$s" || exit 1; done
	$(MAKE) build
	$(BIN)/aenv guest build
	$(BIN)/aenv guest build --variant code-interpreter-v1
	$(BIN)/aenv guest build --variant compose-v1

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

# Versioned static binaries for linux/amd64 with their build identity stamped
# into internal/version, a reproducible tarball and SHA256SUMS:
#   dist/<version>/aenv-<version>-linux-amd64/{aenv,aenvd,aenv-storaged,...,install.sh,systemd/}
#   dist/<version>/aenv-<version>-linux-amd64.tar.gz
#   dist/<version>/SHA256SUMS           (check: cd dist/<version> && sha256sum -c SHA256SUMS)
# The date is the commit's (so a rebuild of one commit is byte-identical).
# Override VERSION, COMMIT, DATE, RELEASE_DIR or RELEASE_PKGS on the command line.
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo 0.1.0-dev)
COMMIT ?= $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
DATE ?= $(shell git log -1 --format=%cd --date=format-local:%Y-%m-%dT%H:%M:%SZ 2>/dev/null || TZ=UTC date +%Y-%m-%dT%H:%M:%SZ)
RELEASE_DIR ?= dist
RELEASE_PKGS ?= ./cmd/...
VERSION_PKG := github.com/agentenv/agentenv/internal/version
RELEASE_NAME = aenv-$(VERSION)-linux-amd64
RELEASE_LDFLAGS = -s -w -buildid= -X $(VERSION_PKG).version=$(VERSION) -X $(VERSION_PKG).commit=$(COMMIT) -X $(VERSION_PKG).date=$(DATE)

release: dashboard
	@case "$(VERSION)" in *[!A-Za-z0-9._+-]*|'') echo "release: bad VERSION '$(VERSION)'" >&2; exit 1;; esac
	rm -rf $(RELEASE_DIR)/$(VERSION)
	mkdir -p $(RELEASE_DIR)/$(VERSION)/$(RELEASE_NAME)
	CGO_ENABLED=0 GOOS=linux GOARCH=amd64 $(GO) build -trimpath -buildvcs=false -ldflags '$(RELEASE_LDFLAGS)' \
		-o $(RELEASE_DIR)/$(VERSION)/$(RELEASE_NAME)/ $(RELEASE_PKGS)
	install -m 0755 scripts/install.sh $(RELEASE_DIR)/$(VERSION)/$(RELEASE_NAME)/install.sh
	install -d $(RELEASE_DIR)/$(VERSION)/$(RELEASE_NAME)/systemd
	install -m 0644 deploy/systemd/* $(RELEASE_DIR)/$(VERSION)/$(RELEASE_NAME)/systemd/
	cd $(RELEASE_DIR)/$(VERSION) && TZ=UTC tar --sort=name --mtime='$(DATE)' --owner=0 --group=0 --numeric-owner \
		-cf - $(RELEASE_NAME) | gzip -n >$(RELEASE_NAME).tar.gz
	cd $(RELEASE_DIR)/$(VERSION) && find $(RELEASE_NAME) -type f | LC_ALL=C sort | xargs sha256sum $(RELEASE_NAME).tar.gz >SHA256SUMS
	@echo "release: $(RELEASE_DIR)/$(VERSION) ($(COMMIT), $(DATE))"
