#!/usr/bin/env bash
# Tools the deploy package's tests use: systemd-analyze and systemd-sysusers
# (Debian's systemd: unit verification, the install into a temporary root),
# userdel (passwd: --purge), shellcheck (lint of install.sh) and Debian's docker-compose, whose `config`
# validates deploy/compose.yaml without a Docker engine. Idempotent: installs
# only what is missing.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
need=()
{ command -v systemd-analyze && command -v systemd-sysusers; } >/dev/null || need+=(systemd)
command -v userdel >/dev/null || need+=(passwd)
command -v systemd-nspawn >/dev/null || need+=(systemd-container) # TestSystemdBoot
command -v shellcheck >/dev/null || need+=(shellcheck)
command -v docker-compose >/dev/null || docker compose version >/dev/null 2>&1 || need+=(docker-compose)
if [ ${#need[@]} -eq 0 ]; then
  echo "deploy test tools present"
  exit 0
fi
echo "installing ${need[*]}"
apt-get install -y -q --no-install-recommends "${need[@]}" >/dev/null 2>&1 ||
  { apt-get update -q && apt-get install -y -q --no-install-recommends "${need[@]}" >/dev/null; }
