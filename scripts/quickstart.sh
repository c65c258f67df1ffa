#!/usr/bin/env bash
# The main job on one machine: install, build, assemble the guest image from
# Debian packages (cached; ~4 minutes the first time), boot a sandbox VM on
# the embedded defaults, run a command in it through the agent, snapshot it,
# restore it and run the command again.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=/usr/local/go/bin:$PATH
./scripts/setup.sh
make build
./bin/aenv guest build
./bin/aenv vm run "$@"
