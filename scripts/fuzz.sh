#!/usr/bin/env bash
# Runs every fuzz target of the module for a short while (make fuzz; part of
# make test). Each target first runs its seed corpus and testdata/fuzz, then
# mutates for FUZZTIME; -fuzzminimizetime is short so that a failing input is
# reported quickly instead of minimised for a minute. A failure leaves the
# input under the package's testdata/fuzz/<Target>/ (commit it as a
# regression case once fixed) and makes this script fail.
#
#   FUZZTIME=30s ./scripts/fuzz.sh                 # every target, 30 s each
#   ./scripts/fuzz.sh ./storage/lsmt/ ./proxy/     # the targets of some packages
set -euo pipefail
cd "$(dirname "$0")/.."
fuzztime=${FUZZTIME:-3s}
minimize=${FUZZMINIMIZETIME:-1s}

if [ $# -gt 0 ]; then dirs=("$@"); else
	mapfile -t dirs < <(grep -rlE '^func Fuzz[A-Za-z0-9_]*\(f \*testing\.F\)' --include='*_test.go' . |
		xargs -r -n1 dirname | sort -u)
fi

failed=()
count=0
start=$SECONDS
for dir in "${dirs[@]}"; do
	dir=./${dir#./}
	mapfile -t targets < <(grep -hoE '^func Fuzz[A-Za-z0-9_]*\(f \*testing\.F\)' "$dir"/*_test.go |
		sed -E 's/^func (Fuzz[A-Za-z0-9_]*)\(.*/\1/' | sort -u)
	for t in "${targets[@]}"; do
		count=$((count + 1))
		echo "== fuzz $dir $t ($fuzztime)"
		if ! go test -run '^$' -fuzz "^${t}\$" -fuzztime "$fuzztime" -fuzzminimizetime "$minimize" "$dir" >"/tmp/aenv-fuzz-$t.log" 2>&1; then
			tail -n 40 "/tmp/aenv-fuzz-$t.log"
			failed+=("$dir $t")
		fi
	done
done
echo "fuzz: $count targets in $((SECONDS - start)) s"
if [ ${#failed[@]} -gt 0 ]; then
	printf 'fuzz: FAILED %s\n' "${failed[@]}"
	exit 1
fi
[ "$count" -gt 0 ] || { echo "fuzz: no targets found" >&2; exit 1; }
