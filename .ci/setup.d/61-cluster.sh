#!/usr/bin/env bash
# What the cluster's tests use: Debian's redis-server (the scheduler's state
# store, started by the tests on a loopback port). The generated gRPC code is
# committed, so CI needs no protoc. Idempotent: installs only what is missing.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
if command -v redis-server >/dev/null; then
  echo "cluster test tools present"
  exit 0
fi
echo "installing redis-server"
apt-get install -y -q --no-install-recommends redis-server >/dev/null 2>&1 ||
  { apt-get update -q && apt-get install -y -q --no-install-recommends redis-server >/dev/null; }
# The package starts a system service; the tests run their own servers.
systemctl disable --now redis-server >/dev/null 2>&1 || true
