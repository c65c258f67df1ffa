#!/usr/bin/env bash
# Installs E2B's Code Interpreter npm SDK (the version the code-interpreter
# e2e test drives) into guest/agent/e2e/code-interpreter-<version>/node_modules.
# Idempotent: skips a version already present.
set -euo pipefail
cd "$(dirname "$0")/../.."
ver=2.8.0
dir="guest/agent/e2e/code-interpreter-$ver"
pkg="$dir/node_modules/@e2b/code-interpreter/package.json"
if [ -f "$pkg" ] && grep -q "\"version\": \"$ver\"" "$pkg"; then
  echo "@e2b/code-interpreter $ver already installed in $dir"
  exit 0
fi
mkdir -p "$dir"
[ -f "$dir/package.json" ] || echo '{"name":"aenv-e2b-code-interpreter-'"$ver"'","private":true}' >"$dir/package.json"
npm install --prefix "$dir" --no-audit --no-fund --loglevel=error "@e2b/code-interpreter@$ver"
