#!/usr/bin/env bash
# Prints the path of a Debian 12 root file system with systemd and the node's
# runtime packages (those scripts/install.sh installs), debootstrapped once and
# cached by the hash of its recipe under $AENV_NSPAWN_CACHE
# (default /var/cache/aenv/nspawn): later calls print the cached tree at once.
set -euo pipefail
suite=bookworm
mirror=${AENV_DEBIAN_MIRROR:-http://deb.debian.org/debian}
pkgs=systemd,systemd-sysv,dbus,qemu-system-x86,qemu-utils,e2fsprogs,debootstrap,debian-archive-keyring,zstd,xz-utils,cpio,busybox-static,iproute2,nftables,ca-certificates,curl
cache=${AENV_NSPAWN_CACHE:-/var/cache/aenv/nspawn}
key=$(printf '%s\n' "$suite" "$mirror" "$pkgs" v1 | sha256sum | cut -c1-16)
dir=$cache/$key
if [ -f "$dir/done" ]; then
  echo "$dir/tree"
  exit 0
fi
mkdir -p "$cache"
exec 9>"$cache/.lock"
flock 9
if [ ! -f "$dir/done" ]; then
  rm -rf "$dir.tmp"
  mkdir -p "$dir.tmp"
  echo "nspawn tree: debootstrap $suite ($pkgs) into $dir (minutes, once)" >&2
  debootstrap --variant=minbase --include="$pkgs" "$suite" "$dir.tmp/tree" "$mirror" >"$dir.tmp/debootstrap.log" 2>&1 ||
    { tail -20 "$dir.tmp/debootstrap.log" >&2; exit 1; }
  echo aenv-boot >"$dir.tmp/tree/etc/hostname"
  # No login prompt on the console: the test drives the machine from outside.
  ln -sf /dev/null "$dir.tmp/tree/etc/systemd/system/console-getty.service"
  rm -rf "$dir"
  mv "$dir.tmp" "$dir"
  touch "$dir/done"
fi
echo "$dir/tree"
