#!/usr/bin/env bash
# The web dashboard's toolchain: its npm packages (esbuild, TypeScript,
# xterm.js, uPlot, playwright-core; versions pinned by
# dashboard/web/package-lock.json, installed with `npm ci`, which npm's
# cache serves offline once fetched) and Debian's chromium, the headless
# browser its end-to-end test drives. Idempotent: skips what is present.
set -euo pipefail
cd "$(dirname "$0")/../.."
web=dashboard/web
stamp="$web/node_modules/.aenv-lock.sha256"
want=$(sha256sum "$web/package-lock.json" | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  echo "dashboard npm packages already installed"
else
  npm ci --prefix "$web" --no-audit --no-fund --prefer-offline --loglevel=error
  echo "$want" >"$stamp"
fi
if [ -x /usr/bin/chromium ]; then
  echo "chromium already installed"
else
  SUDO=""
  [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core
fi
