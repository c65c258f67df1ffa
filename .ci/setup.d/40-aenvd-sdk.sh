#!/usr/bin/env bash
# Installs E2B's npm SDK 2.50.0 (the last release on the v1 create/connect paths)
# into api/e2e/sdk-2.50.0/node_modules for aenvd's e2e test; 2.45.0 and 2.51.0
# come from 30-e2b-sdk.sh (guest/agent/e2e). Idempotent.
set -euo pipefail
cd "$(dirname "$0")/../.."
for ver in 2.50.0; do
  dir="api/e2e/sdk-$ver"
  if [ -f "$dir/node_modules/e2b/package.json" ] &&
     grep -q "\"version\": \"$ver\"" "$dir/node_modules/e2b/package.json"; then
    echo "e2b $ver already installed in $dir"
    continue
  fi
  mkdir -p "$dir"
  [ -f "$dir/package.json" ] || echo '{"name":"aenvd-e2b-sdk-'"$ver"'","private":true}' >"$dir/package.json"
  npm install --prefix "$dir" --no-audit --no-fund --loglevel=error "e2b@$ver"
done
