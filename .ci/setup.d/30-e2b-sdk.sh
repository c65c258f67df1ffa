#!/usr/bin/env bash
# Installs E2B's npm SDK (the versions the agent's e2e test runs against) into
# guest/agent/e2e/sdk-<version>/node_modules. Idempotent: skips versions already present.
set -euo pipefail
cd "$(dirname "$0")/../.."
for ver in 2.45.0 2.51.0; do
  dir="guest/agent/e2e/sdk-$ver"
  if [ -f "$dir/node_modules/e2b/package.json" ] &&
     grep -q "\"version\": \"$ver\"" "$dir/node_modules/e2b/package.json"; then
    echo "e2b $ver already installed in $dir"
    continue
  fi
  mkdir -p "$dir"
  [ -f "$dir/package.json" ] || echo '{"name":"aenv-e2b-sdk-'"$ver"'","private":true}' >"$dir/package.json"
  npm install --prefix "$dir" --no-audit --no-fund --loglevel=error "e2b@$ver"
done
