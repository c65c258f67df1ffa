#!/usr/bin/env bash
# The main job on one machine, on the embedded defaults: install, build, assemble
# the guest image from Debian packages (cached; ~4 minutes the first time), start
# the node server aenvd (which builds the `base` template on first start), then
# create a sandbox with E2B's own npm SDK, run a command and move a file in it.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=/usr/local/go/bin:$PATH
./scripts/setup.sh
make build
./bin/aenv guest build

data=${AENV_DATA_DIR:-/var/lib/aenv}
log=$data/aenvd.log
mkdir -p "$data"
if ! curl -fsS -o /dev/null http://127.0.0.1:3000/health 2>/dev/null; then
  echo "starting aenvd (log: $log)"
  AENVD_DATA_DIR=$data nohup ./bin/aenvd >"$log" 2>&1 &
  echo $! >"$data/aenvd.pid"
fi
echo -n "waiting for aenvd (the first start builds the base template) "
for _ in $(seq 600); do
  curl -fsS -o /dev/null http://127.0.0.1:3000/health 2>/dev/null && break
  echo -n .; sleep 1
done
echo
curl -fsS -o /dev/null http://127.0.0.1:3000/health || { echo "aenvd did not come up; see $log" >&2; tail -20 "$log" >&2; exit 1; }

sdk=.cache/quickstart
[ -d "$sdk/node_modules/e2b" ] || { mkdir -p "$sdk"; npm install --prefix "$sdk" --no-audit --no-fund --loglevel=error e2b@2.51.0 >/dev/null; }
cp scripts/quickstart/demo.mjs "$sdk/demo.mjs"
export E2B_API_KEY=$(cat "$data/api-key") E2B_API_URL=http://127.0.0.1:3000 E2B_SANDBOX_URL=http://127.0.0.1:3001
node "$sdk/demo.mjs"
echo "aenvd keeps running (pid $(cat "$data/aenvd.pid" 2>/dev/null || echo '?'); API $E2B_API_URL, key in $data/api-key)."
