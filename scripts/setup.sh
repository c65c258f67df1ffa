#!/usr/bin/env bash
# Installs what AgentENV needs on a fresh Debian 12 machine (as root):
# QEMU, disk and network tools, the Debian tools the guest image builder uses, Go and Node.js.
# Idempotent. Used by the README's quick start and by CI.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
if [ "$(id -u)" != 0 ]; then echo "setup.sh: run as root" >&2; exit 1; fi
apt-get update -q
apt-get install -y -q --no-install-recommends \
  qemu-system-x86 qemu-utils e2fsprogs debootstrap debian-archive-keyring zstd xz-utils cpio busybox-static \
  fio libnbd-bin iproute2 nftables tmux redis-server ca-certificates curl unzip make git binutils >/dev/null
here=$(dirname "$0")
# Go 1.26+ at /usr/local/go (from the Go module proxy when missing).
"$here/install-go.sh"
export PATH=/usr/local/go/bin:$PATH
# Node.js >= 20.18.1 and npm for E2B's npm SDK (from the npm registry when missing).
"$here/install-node.sh"
echo "setup.sh: done"
