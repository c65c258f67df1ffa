#!/usr/bin/env bash
# The kernel lane (internal/kernellane): QEMU, fio and cpio from Debian, and
# Debian's 6.12 cloud kernel package downloaded and extracted (not installed)
# into the lane's cache, where the lane would otherwise fetch it on first use.
# Idempotent: does nothing when everything is present.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
need=()
command -v qemu-system-x86_64 >/dev/null || need+=(qemu-system-x86)
command -v fio >/dev/null || need+=(fio)
command -v dpkg-deb >/dev/null || need+=(dpkg)
command -v ldd >/dev/null || need+=(libc-bin)
if [ ${#need[@]} -gt 0 ]; then
  echo "installing ${need[*]}"
  apt-get install -y -q --no-install-recommends "${need[@]}" >/dev/null 2>&1 ||
    { apt-get update -q && apt-get install -y -q --no-install-recommends "${need[@]}" >/dev/null; }
fi
cache=${AENV_KERNELLANE_CACHE:-/var/cache/aenv/kernellane}
pkg=linux-image-6.12-cloud-amd64
ref="$cache/kernel/$pkg.ref"
if [ -f "$ref" ] && [ -d "$cache/kernel/$(cat "$ref")/lib/modules" ]; then
  echo "kernel lane: $pkg present"
  exit 0
fi
apt-cache show "$pkg" >/dev/null 2>&1 || apt-get update -q >/dev/null
mkdir -p "$cache/kernel"
tmp=$(mktemp -d "$cache/.kernel-XXXXXX")
trap 'rm -rf "$tmp"' EXIT
real=$(apt-cache depends "$pkg" | awk '/Depends: linux-image-/ {print $2; exit}')
(cd "$tmp" && apt-get download -q "${real:-$pkg}" >/dev/null 2>&1)
deb=$(ls "$tmp"/*.deb)
sum=$(sha256sum "$deb" | cut -d' ' -f1)
if [ ! -d "$cache/kernel/$sum" ]; then
  dpkg-deb -x "$deb" "$tmp/root"
  basename "$deb" >"$tmp/root/package" # the exact build, as internal/kernelpkg records it
  mv "$tmp/root" "$cache/kernel/$sum"
fi
echo "$sum" >"$ref.tmp" && mv "$ref.tmp" "$ref"
echo "kernel lane: $pkg extracted as $sum"
