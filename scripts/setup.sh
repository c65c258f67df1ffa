#!/usr/bin/env bash
# Installs what AgentENV needs on a fresh Debian 12 / Ubuntu machine (as root):
# QEMU, disk and network tools, and the Debian tools the guest image builder uses.
# Idempotent. Used by the README's quick start and by CI.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
if [ "$(id -u)" != 0 ]; then echo "setup.sh: run as root" >&2; exit 1; fi
apt-get update -q
apt-get install -y -q --no-install-recommends \
  qemu-system-x86 qemu-utils e2fsprogs debootstrap debian-archive-keyring zstd xz-utils cpio busybox-static \
  fio libnbd-bin iproute2 nftables tmux redis-server ca-certificates make git >/dev/null
if ! command -v go >/dev/null && [ -x /usr/local/go/bin/go ]; then export PATH=/usr/local/go/bin:$PATH; fi
command -v go >/dev/null || { echo "setup.sh: Go 1.26+ is required (https://go.dev/dl), at /usr/local/go" >&2; exit 1; }
echo "setup.sh: done"
