#!/usr/bin/env bash
# Installs AgentENV as system services on Debian 12/13 or Ubuntu 22.04/24.04
# (run as root; no sudo needed):
#
#   binaries      PREFIX/bin/{aenv,aenvd,aenv-storaged,aenv-netcheck[,aenv-scheduler,aenv-gateway]}
#                 PREFIX/lib/aenv/aenv-agent        (the in-guest agent aenvd injects into images)
#   config        /etc/aenv/aenvd.toml               (written once, kept on reinstall and uninstall)
#                 /etc/aenv/aenv-{scheduler,gateway}.env
#   state         /var/lib/aenv (mode 0700), cache /var/cache/aenv (guest image)
#   user          aenv (system user for the services that need no root), /etc/sysusers.d/aenv.conf
#   units         /etc/systemd/system/{aenv-storaged,aenvd,aenv-scheduler,aenv-gateway}.service
#                 aenv-storaged and aenvd enabled (and started); scheduler and gateway installed, disabled
#
# Usage:
#   scripts/install.sh [--prefix /usr/local] [--from DIR] [--root DIR] [--no-deps] [--no-guest] [--no-start]
#   scripts/install.sh --uninstall [--purge] [--prefix /usr/local] [--root DIR]
#
#   --from DIR    take the binaries from DIR (a `make release` directory or bin/); default: the
#                 directory of this script in a release tarball, else this checkout's bin/ (make build)
#   --root DIR    install into DIR as the future root filesystem (image builds, tests): nothing on this
#                 host is touched (no packages, no guest image, no systemctl but `systemctl --root`)
#   --no-deps     do not apt-get install the runtime packages (QEMU, e2fsprogs, debootstrap, ...)
#   --no-guest    do not build the guest image now (aenvd builds it on its first start)
#   --no-start    enable the units but do not start them
#   --uninstall   stop and disable the units, remove binaries, units and the sysusers entry;
#                 config, state and the aenv user stay unless --purge
set -euo pipefail

ROOT=/
PREFIX=/usr/local
FROM=
DEPS=1 GUEST=1 START=1 UNINSTALL=0 PURGE=0
here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")
# The unit and config templates: beside this script in a release tarball
# (make release), deploy/systemd in a checkout.
tpl=$repo/deploy/systemd
[ -f "$here/systemd/aenvd.service.in" ] && tpl=$here/systemd
units=(aenv-storaged aenvd aenv-scheduler aenv-gateway)
enabled_units=(aenv-storaged aenvd)
bins=(aenv aenvd aenv-storaged aenv-netcheck aenv-scheduler aenv-gateway)
required_bins=(aenv aenvd aenv-storaged aenv-agent)

die() { echo "install.sh: $*" >&2; exit 1; }
say() { echo "install.sh: $*"; }

while [ $# -gt 0 ]; do
  case "$1" in
    --root) ROOT=${2:?--root needs a directory}; shift ;;
    --root=*) ROOT=${1#*=} ;;
    --prefix) PREFIX=${2:?--prefix needs a directory}; shift ;;
    --prefix=*) PREFIX=${1#*=} ;;
    --from) FROM=${2:?--from needs a directory}; shift ;;
    --from=*) FROM=${1#*=} ;;
    --no-deps) DEPS=0 ;;
    --no-guest) GUEST=0 ;;
    --no-start) START=0 ;;
    --uninstall) UNINSTALL=1 ;;
    --purge) PURGE=1 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument $1 (see --help)" ;;
  esac
  shift
done

[ "$(id -u)" = 0 ] || die "run as root (for example: sudo $0, or as root: $0)"
case "$PREFIX" in /*) ;; *) die "--prefix must be absolute: $PREFIX" ;; esac
ROOT=$(realpath -m "$ROOT")
host=0
[ "$ROOT" = / ] && host=1
R=${ROOT%/}                 # "" for the host, so "$R/etc" is /etc
bindir=$PREFIX/bin
libdir=$PREFIX/lib/aenv

# systemctl on the host only when systemd runs it (not in a container without it).
systemd_running() { [ "$host" = 1 ] && [ -d /run/systemd/system ]; }

check_os() {
  [ "$host" = 1 ] || return 0
  . /etc/os-release
  case "${ID:-}:${VERSION_ID:-}" in
    debian:12|debian:13|ubuntu:22.04|ubuntu:24.04) ;;
    *) say "warning: ${PRETTY_NAME:-this system} is not Debian 12/13 or Ubuntu 22.04/24.04; continuing" ;;
  esac
}

install_deps() {
  [ "$host" = 1 ] && [ "$DEPS" = 1 ] || return 0
  say "installing runtime packages"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  # debian-archive-keyring: the guest root filesystem is Debian's, on Ubuntu too.
  apt-get install -y -q --no-install-recommends qemu-system-x86 qemu-utils e2fsprogs debootstrap \
    debian-archive-keyring zstd xz-utils cpio busybox-static iproute2 nftables ca-certificates systemd >/dev/null
}

# find_binaries sets FROM to a directory holding the binaries.
find_binaries() {
  if [ -z "$FROM" ] && [ -x "$here/aenvd" ]; then
    FROM=$here # a release tarball
  fi
  if [ -z "$FROM" ]; then
    FROM=$repo/bin
    if [ ! -x "$FROM/aenvd" ] && [ -f "$repo/Makefile" ]; then
      say "building the binaries (make build)"
      [ -x /usr/local/go/bin/go ] || command -v go >/dev/null || "$here/install-go.sh"
      make -C "$repo" build
    fi
  fi
  for b in "${required_bins[@]}"; do
    [ -x "$FROM/$b" ] || die "$FROM/$b missing (build with make build or make release, or pass --from DIR)"
  done
}

# render TEMPLATE DEST MODE: the template with its @PLACEHOLDERS@ filled in.
render() {
  local tmp
  tmp=$(mktemp "$2.XXXXXX")
  sed -e "s|@BINDIR@|$bindir|g" -e "s|@LIBDIR@|$libdir|g" "$1" >"$tmp"
  chmod "$3" "$tmp"
  mv -f "$tmp" "$2"
}

create_user() {
  install -d -m 0755 "$R/etc" "$R/etc/sysusers.d"
  install -m 0644 "$tpl/aenv.sysusers" "$R/etc/sysusers.d/aenv.conf"
  if command -v systemd-sysusers >/dev/null; then
    if [ "$host" = 1 ]; then
      systemd-sysusers /etc/sysusers.d/aenv.conf
    else
      systemd-sysusers --root="$ROOT" "$R/etc/sysusers.d/aenv.conf"
    fi
  elif ! grep -q '^aenv:' "$R/etc/passwd" 2>/dev/null; then
    local p=()
    [ "$host" = 1 ] || p=(--prefix "$ROOT")
    useradd "${p[@]}" --system --user-group --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin --comment "AgentENV services" aenv
  fi
  grep -q '^aenv:' "$R/etc/passwd" || die "user aenv was not created in $R/etc/passwd"
}

# gid_of NAME: the group's id in the target root's /etc/group.
gid_of() { awk -F: -v n="$1" '$1 == n { print $3 }' "$R/etc/group"; }

install_files() {
  say "installing into ${ROOT} (prefix $PREFIX)"
  install -d -m 0755 "$R$bindir" "$R$libdir" "$R/etc/systemd/system"
  local b
  for b in "${bins[@]}"; do
    if [ -x "$FROM/$b" ]; then
      install -m 0755 "$FROM/$b" "$R$bindir/$b"
    fi
  done
  install -m 0755 "$FROM/aenv-agent" "$R$libdir/aenv-agent"

  local gid
  gid=$(gid_of aenv)
  install -d -m 0750 -o 0 -g "$gid" "$R/etc/aenv"
  [ -e "$R/etc/aenv/aenvd.toml" ] || render "$tpl/aenvd.toml.in" "$R/etc/aenv/aenvd.toml" 0640
  for b in aenv-scheduler aenv-gateway; do
    if [ ! -e "$R/etc/aenv/$b.env" ]; then
      install -m 0640 -o 0 -g "$gid" /dev/null "$R/etc/aenv/$b.env"
      echo "# Flags of $b (see $b --help), read by $b.service." >"$R/etc/aenv/$b.env"
      local var=${b#aenv-}
      echo "AENV_${var^^}_FLAGS=" >>"$R/etc/aenv/$b.env"
    fi
  done
  install -d -m 0700 "$R/var/lib/aenv"
  install -d -m 0755 "$R/var/cache/aenv"

  local u
  for u in "${units[@]}"; do
    render "$tpl/$u.service.in" "$R/etc/systemd/system/$u.service" 0644
  done
}

enable_units() {
  if [ "$host" = 0 ]; then
    if command -v systemctl >/dev/null; then
      systemctl --root="$ROOT" enable "${enabled_units[@]/%/.service}" 2>&1 | grep -v 'non-existent unit' | sed 's/^/  /' || true
    fi
    return 0
  fi
  if ! systemd_running; then
    say "systemd is not running here: start aenv-storaged and aenvd yourself"
    return 0
  fi
  systemctl daemon-reload
  if [ "$START" = 1 ]; then
    systemctl enable --now "${enabled_units[@]/%/.service}"
  else
    systemctl enable "${enabled_units[@]/%/.service}"
  fi
}

# The guest kernel is Debian's package, fetched with this host's apt (guest/image).
guest_kernel=linux-image-6.12-cloud-amd64

build_guest() {
  [ "$host" = 1 ] && [ "$GUEST" = 1 ] || return 0
  if ! apt-cache show "$guest_kernel" >/dev/null 2>&1; then
    say "warning: $guest_kernel (the guest kernel) is not in this system's apt sources (on Ubuntu: add Debian 12's"
    say "  bookworm-security source, see the README), then run: $bindir/aenv guest build --agent $libdir/aenv-agent"
    say "  --cache /var/cache/aenv/guest && systemctl start aenvd. aenvd is enabled but not started now."
    START=0
    return 0
  fi
  say "building the guest image (cached in /var/cache/aenv/guest; minutes the first time)"
  "$bindir/aenv" guest build --agent "$libdir/aenv-agent" --cache /var/cache/aenv/guest >/dev/null
}

uninstall() {
  local u b
  if systemd_running; then
    for u in "${units[@]}"; do
      systemctl disable --now "$u.service" 2>/dev/null || true
    done
  elif [ "$host" = 0 ] && command -v systemctl >/dev/null; then
    systemctl --root="$ROOT" disable "${units[@]/%/.service}" >/dev/null 2>&1 || true
  fi
  for u in "${units[@]}"; do
    rm -f "$R/etc/systemd/system/$u.service"
  done
  systemd_running && systemctl daemon-reload
  for b in "${bins[@]}"; do
    rm -f "$R$bindir/$b"
  done
  rm -rf "$R$libdir"
  rm -f "$R/etc/sysusers.d/aenv.conf"
  if [ "$PURGE" = 1 ]; then
    rm -rf "$R/etc/aenv" "$R/var/lib/aenv" "$R/var/cache/aenv" "$R/var/lib/aenv-scheduler" "$R/var/lib/aenv-gateway"
    if grep -q '^aenv:' "$R/etc/passwd" 2>/dev/null; then
      local p=()
      [ "$host" = 1 ] || p=(--prefix "$ROOT")
      userdel "${p[@]}" aenv
    fi
    say "removed AgentENV, its configuration, state and the aenv user"
  else
    say "removed AgentENV; kept /etc/aenv, /var/lib/aenv, /var/cache/aenv and the aenv user (--purge removes them)"
  fi
}

if [ "$UNINSTALL" = 1 ]; then
  uninstall
  exit 0
fi
check_os
install_deps
find_binaries
create_user
install_files
build_guest
enable_units
say "done. $bindir/aenvd --version: $("$R$bindir/aenvd" --version 2>/dev/null || echo '?')"
if [ "$host" = 1 ]; then
  echo "  API: http://127.0.0.1:3000 (key: /var/lib/aenv/api-key, written at aenvd's first start)"
  echo "  logs: journalctl -u aenvd -u aenv-storaged; config: /etc/aenv/aenvd.toml"
fi
