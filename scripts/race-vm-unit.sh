#!/usr/bin/env bash
# Lists, for the packages scripts/race-packages.sh leaves out because some of
# their tests boot VMs, the tests that do not: those defined in test files
# that use no guest assets, VMM driver, node server or QEMU. Each line is
# "<package> <-run pattern>", for `go test -race` (make test-race).
set -euo pipefail
cd "$(dirname "$0")/.."
pat='guestassets|qemu\.New|aenvdtest|vmtest\.|memsnaptest|qemu-system|vmmtest\.'
vm=$(grep -rlE "$pat" --include='*_test.go' . | xargs -r -n1 dirname | sed 's|^\./||' | sort -u)
for dir in $vm; do
	case "$dir" in bench/* | deploy | */e2e | */e2e/*) continue ;; esac
	# The greps fail where no file is left or none declares a test: nothing
	# to list then (under pipefail that used to end the script silently,
	# and every package after it went unlisted).
	tests=$(grep -LE "$pat" "$dir"/*_test.go | xargs -r grep -hoE '^func (Test[A-Za-z0-9_]+)\(t \*testing\.T\)' |
		sed -E 's/^func (Test[A-Za-z0-9_]+).*/\1/' | sort -u | paste -sd'|' -) || true
	if [ -n "$tests" ]; then echo "github.com/agentenv/agentenv/$dir ^($tests)\$"; fi
done
