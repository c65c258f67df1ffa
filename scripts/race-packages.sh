#!/usr/bin/env bash
# Lists the Go packages whose tests boot no VM, for `go test -race` (make
# test-race). A package is VM-booting when its tests use the guest assets, a
# VMM driver, a node server or QEMU directly.
set -euo pipefail
cd "$(dirname "$0")/.."
vm=$(grep -rlE 'guestassets|qemu\.New|aenvdtest|vmtest\.|memsnaptest|qemu-system|vmmtest\.' --include='*_test.go' . |
	xargs -r -n1 dirname | sed 's|^\./||' | sort -u)
go list ./... | while read -r pkg; do
	dir=${pkg#github.com/agentenv/agentenv}
	dir=${dir#/}
	# bench/: benchmarks; deploy/: file checks with nothing concurrent (its
	# race build of the Kubernetes API types alone costs minutes).
	case "$dir" in bench/* | deploy) continue ;; esac
	if ! grep -qxF "$dir" <<<"$vm"; then echo "$pkg"; fi
done
