#!/usr/bin/env bash
# Boots the cached Debian 12 tree (tree.sh) under systemd-nspawn --boot with
# systemd as PID 1, installs this checkout's binaries and units with
# scripts/install.sh inside, and checks aenv-storaged.service and
# aenvd.service reach active and /health answers; prints the units'
# `systemd-analyze security` scores. The tree is mounted with
# --volatile=overlay, so the cache stays as debootstrap left it.
#   deploy/nspawn/boot.sh BINDIR   (as root; exit 0 when everything held)
set -euo pipefail
bin=$(realpath "${1:?usage: boot.sh BINDIR}")
repo=$(cd "$(dirname "$0")/../.." && pwd)
tree=$("$repo/deploy/nspawn/tree.sh")
guestcache=${AENV_GUEST_CACHE:-/var/cache/aenv/guest}
mkdir -p "$guestcache"
name=aenvboot$$
log=$(mktemp -d)/console.log
systemd-nspawn -q -D "$tree" --volatile=overlay --register=no --keep-unit -M "$name" --private-network \
  --bind-ro="$bin:/opt/aenv/bin" --bind-ro="$repo/scripts:/opt/aenv/scripts" \
  --bind-ro="$repo/deploy/systemd:/opt/aenv/deploy/systemd" --bind=/dev/net/tun \
  --bind="$guestcache:/var/cache/aenv/guest" --boot >"$log" 2>&1 &
nspawn=$!
stop() {
  kill -TERM "$nspawn" 2>/dev/null || true
  for _ in $(seq 50); do kill -0 "$nspawn" 2>/dev/null || return 0; sleep 0.2; done
  kill -KILL "$nspawn" 2>/dev/null || true
}
trap stop EXIT
fail() { echo "FAIL: $*"; exit 1; }

pid=
for _ in $(seq 100); do
  for c in $(pgrep -P "$nspawn" || true); do
    [ "$(cat /proc/"$c"/comm 2>/dev/null)" = systemd ] && pid=$c
  done
  [ -n "$pid" ] && break
  sleep 0.2
done
[ -n "$pid" ] || { cat "$log"; fail "no systemd in the container"; }
inside() { nsenter -t "$pid" -a -- "$@"; }
state=$(inside systemctl is-system-running --wait || true)
echo "systemd in the container (PID 1 is $(inside cat /proc/1/comm)): $state"

inside /opt/aenv/scripts/install.sh --from /opt/aenv/bin --no-deps --no-guest --no-start >/dev/null ||
  fail "install.sh inside the container"
# AENV_BOOT_CGROUPS=false runs the node without control groups of its own.
if [ "${AENV_BOOT_CGROUPS:-}" = false ]; then
  inside sh -c 'printf "\n[sandbox]\ncgroups = false\n" >>/etc/aenv/aenvd.toml'
else
  # On a cgroup v1 (hybrid) host nspawn mounts the controller hierarchies
  # read-only in the container (its root there is the container's own group).
  # Writable, and systemd re-executed to see them so, the container's
  # systemd manages them as on a hybrid host and realizes aenvd.service's
  # delegated group in each. A v2 host needs nothing of this: the
  # container's unified hierarchy is its own.
  v1=
  for c in cpu memory pids; do
    if inside mountpoint -q /sys/fs/cgroup/$c; then
      inside mount -o remount,bind,rw /sys/fs/cgroup/$c || fail "remount /sys/fs/cgroup/$c writable"
      v1=1
    fi
  done
  [ -z "$v1" ] || inside systemctl daemon-reexec || fail "systemctl daemon-reexec"
fi
# The first start builds the guest image when the cache has none (minutes).
inside systemctl start aenv-storaged.service aenvd.service --no-block
ok=
for _ in $(seq 900); do
  if inside systemctl is-active -q aenvd.service && inside curl -fsS http://127.0.0.1:3000/health >/dev/null 2>&1; then
    ok=1
    break
  fi
  # Restart=on-failure keeps a unit that cannot start cycling: give up after three tries.
  [ "$(inside systemctl show -p NRestarts --value aenvd.service)" -ge 3 ] && break
  sleep 1
done
for u in aenv-storaged aenvd; do echo "$u.service: $(inside systemctl is-active $u.service || true)"; done
echo "== systemd-analyze security"
for u in aenv-storaged aenvd; do inside systemd-analyze security "$u.service" --no-pager | tail -1 | sed "s/^/$u: /"; done
if [ -z "$ok" ]; then
  inside journalctl -u aenvd -u aenv-storaged --no-pager -n 40 | grep -v systemd | cut -c1-600
  fail "aenvd.service did not answer /health"
fi
echo "health: $(inside curl -sS -o /dev/null -w "%{http_code}" http://127.0.0.1:3000/health)"; inside journalctl -u aenvd --no-pager -o cat | grep -E "template|listen|serving|control groups" | tail -4 | cut -c1-400
[ "${AENV_BOOT_SANDBOX:-1}" = 0 ] && { echo "PASS"; exit 0; }
. "$repo/deploy/nspawn/sandbox.sh"
# E2B's SDK (installed in the checkout by .ci/setup.d/30-e2b-sdk.sh) with the
# host's Node.js, in the container's network namespace only.
sdk=$repo/guest/agent/e2e/sdk-2.51.0
if [ -f "$sdk/node_modules/e2b/package.json" ] && command -v node >/dev/null; then
  nsenter -t "$pid" -n -- env E2B_API_URL=http://127.0.0.1:3000 E2B_SANDBOX_URL=http://127.0.0.1:3001 \
    E2B_API_KEY="$key" AENV_E2B_SDK_DIR="$sdk" node "$repo/deploy/nspawn/e2b.mjs" || fail "the E2B SDK steps"
elif [ "${CI:-}" = true ]; then
  fail "no E2B SDK in $sdk or no node (.ci/setup.d/30-e2b-sdk.sh)"
else
  echo "SKIP the E2B SDK steps: no SDK in $sdk or no node (.ci/setup.d/30-e2b-sdk.sh)"
fi
echo "PASS"
