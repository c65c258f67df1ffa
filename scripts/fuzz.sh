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
#
# One failure is not a finding: Go 1.26's fuzzing coordinator can report its
# own -fuzztime deadline as the target's failure (a bare "context deadline
# exceeded", no failing input; golang/go#75804, fixed in Go 1.27). It happens
# on a loaded machine when the deadline fires while a worker is busy. Such a
# run counts only when it wrote no input and the corpus then replays clean;
# anything else (a written input, a panic, another message) fails as before.
set -euo pipefail
cd "$(dirname "$0")/.."
fuzztime=${FUZZTIME:-3s}
minimize=${FUZZMINIMIZETIME:-1s}

if [ $# -gt 0 ]; then dirs=("$@"); else
	mapfile -t dirs < <(grep -rlE '^func Fuzz[A-Za-z0-9_]*\(f \*testing\.F\)' --include='*_test.go' . |
		xargs -r -n1 dirname | sort -u)
fi

# corpus_list DIR TARGET: the committed/written inputs of a target, one per line.
corpus_list() {
	ls -1 "$1/testdata/fuzz/$2" 2>/dev/null || true
}

# deadline_only LOG TARGET: the run's one failure is the coordinator's bare
# deadline message (the lines between "--- FAIL" and "FAIL" are exactly it).
deadline_only() {
	local body
	body=$(sed -n "/^--- FAIL: $2 (/,/^FAIL\$/p" "$1" | sed '1d;$d')
	[ "$body" = "    context deadline exceeded" ] &&
		[ "$(grep -c '^--- FAIL' "$1")" -eq 1 ] &&
		! grep -q 'Failing input written to' "$1"
}

failed=()
raced=()
count=0
start=$SECONDS
for dir in "${dirs[@]}"; do
	dir=./${dir#./}
	mapfile -t targets < <(grep -hoE '^func Fuzz[A-Za-z0-9_]*\(f \*testing\.F\)' "$dir"/*_test.go |
		sed -E 's/^func (Fuzz[A-Za-z0-9_]*)\(.*/\1/' | sort -u)
	for t in "${targets[@]}"; do
		count=$((count + 1))
		log=/tmp/aenv-fuzz-$t.log
		echo "== fuzz $dir $t ($fuzztime)"
		before=$(corpus_list "$dir" "$t")
		if go test -run '^$' -fuzz "^${t}\$" -fuzztime "$fuzztime" -fuzzminimizetime "$minimize" "$dir" >"$log" 2>&1; then
			continue
		fi
		if deadline_only "$log" "$t" && [ "$(corpus_list "$dir" "$t")" = "$before" ]; then
			echo "fuzz: $t: the coordinator reported its own deadline (golang/go#75804), no input written; replaying the corpus"
			if go test -count=1 -run "^${t}\$" "$dir" >>"$log" 2>&1; then
				raced+=("$dir $t")
				continue
			fi
		fi
		tail -n 40 "$log"
		failed+=("$dir $t")
	done
done
echo "fuzz: $count targets in $((SECONDS - start)) s"
if [ ${#raced[@]} -gt 0 ]; then
	printf 'fuzz: coordinator deadline only, corpus clean: %s\n' "${raced[@]}"
fi
if [ ${#failed[@]} -gt 0 ]; then
	printf 'fuzz: FAILED %s\n' "${failed[@]}"
	exit 1
fi
[ "$count" -gt 0 ] || { echo "fuzz: no targets found" >&2; exit 1; }
