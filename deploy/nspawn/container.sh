#!/usr/bin/env bash
# Runs the node image (deploy/docker/node.Dockerfile) as a container engine
# would, without one: the cached Debian 12 tree (tree.sh; it holds the
# image's packages) with the image's files bound at the image's paths, its
# environment, the Compose file's capabilities (and nothing else: setpriv
# sets the bounding set), no_new_privs, /dev/net/tun as the only device, its
# own network namespace, a state directory as the /var/lib/aenv volume, and
# the image's entrypoint as PID 1. systemd-nspawn gives the mount, PID, IPC,
# UTS and network namespaces and mounts the control groups read-only, as
# Docker does for a container that is not privileged. It then creates a
# sandbox, checks its VMM's group is under the container's, runs a command
# in it, stops the container as `docker stop` does (SIGTERM to PID 1),
# starts it again over the same state and resumes the sandbox.
#   CAPS=net_admin,sys_admin,... NODE_ENV=$'K=V\n...' deploy/nspawn/container.sh BINDIR
# (as root; exit 0 and a last line PASS when everything held)
set -euo pipefail
bin=$(realpath "${1:?usage: container.sh BINDIR}")
: "${CAPS:?CAPS: the capabilities of the node service, comma separated}"
repo=$(cd "$(dirname "$0")/../.." && pwd)
tree=$("$repo/deploy/nspawn/tree.sh")
guestcache=${AENV_GUEST_CACHE:-/var/cache/aenv/guest}
mkdir -p "$guestcache"
work=$(mktemp -d)
state=$work/state
mkdir -m 0700 "$state"
fail() { echo "FAIL: $*"; exit 1; }

setenv=()
while IFS= read -r kv; do [ -n "$kv" ] && setenv+=("--setenv=$kv"); done <<<"${NODE_ENV:-}"
bounding=-all
for c in ${CAPS//,/ }; do bounding="$bounding,+$c"; done

nspawn=
# container_init prints the pid of the container's PID 1: the child of
# systemd-nspawn that is PID 1 in its own namespace. nspawn first forks an
# outer child that forks PID 1 and exits; a plain `pgrep -P` can catch that
# short-lived one, and every nsenter into it would then fail.
container_init() {
  local c
  for c in $(pgrep -P "$1" || true); do
    awk '/^NSpid:/ { found = ($NF == 1) } END { exit !found }' "/proc/$c/status" 2>/dev/null && { echo "$c"; return 0; }
  done
  return 0
}
# start runs the container in the background; its log is $work/run-N.log.
start() {
  local log=$work/run-$1.log
  systemd-nspawn -q -D "$tree" --volatile=overlay --register=no --keep-unit -M "aenvnode$$" --private-network \
    --kill-signal=SIGTERM "${setenv[@]}" \
    --bind-ro="$bin/aenvd:/usr/local/bin/aenvd" --bind-ro="$bin/aenv-storaged:/usr/local/bin/aenv-storaged" \
    --bind-ro="$bin/aenv:/usr/local/bin/aenv" --bind-ro="$bin/aenv-netcheck:/usr/local/bin/aenv-netcheck" \
    --bind-ro="$bin/aenv-agent:/usr/local/lib/aenv/aenv-agent" \
    --bind-ro="$repo/deploy/docker/node-entrypoint.sh:/usr/local/bin/aenv-node-entrypoint" \
    --bind=/dev/net/tun --bind="$state:/var/lib/aenv" --bind="$guestcache:/var/cache/aenv/guest" \
    -- setpriv --bounding-set="$bounding" --inh-caps=-all --no-new-privs /usr/local/bin/aenv-node-entrypoint >"$log" 2>&1 &
  nspawn=$!
  pid=
  for _ in $(seq 100); do
    pid=$(container_init "$nspawn")
    [ -n "$pid" ] && break
    sleep 0.2
  done
  [ -n "$pid" ] || { cat "$log"; fail "no process in the container"; }
}
inside() { nsenter -t "$pid" -a -- "$@"; }
# stop sends SIGTERM to the container (nspawn hands it to PID 1) and waits.
stop() {
  [ -n "$nspawn" ] || return 0
  kill -TERM "$nspawn" 2>/dev/null || true
  for _ in $(seq 300); do kill -0 "$nspawn" 2>/dev/null || { nspawn=; return 0; }; sleep 0.2; done
  kill -KILL "$nspawn" 2>/dev/null || true
  nspawn=
}
trap 'stop; rm -rf "$work"' EXIT
health() {
  for _ in $(seq 900); do
    inside curl -fsS http://127.0.0.1:3000/health >/dev/null 2>&1 && return 0
    kill -0 "$nspawn" 2>/dev/null || { cat "$work/run-$1.log" | cut -c1-600 | tail -30; fail "the container exited"; }
    [ -d "/proc/$pid" ] || fail "the container's PID 1 ($pid) is gone while systemd-nspawn runs"
    sleep 1
  done
  tail -30 "$work/run-$1.log" | cut -c1-600
  fail "aenvd in the container did not answer /health"
}

start 1
health 1
echo "PID 1 in the container: $(inside cat /proc/1/comm); its capabilities: $(inside grep CapBnd /proc/1/status)"
echo "health: $(inside curl -sS -o /dev/null -w "%{http_code}" http://127.0.0.1:3000/health)"
grep -E "control groups|vmm selected|root disk backend|aenvd ready" "$work/run-1.log" | cut -c1-300

key=$(cat "$state/api-key") || fail "no API key in the state volume"
cli() { inside env AENV_URL=http://127.0.0.1:3000 AENV_API_KEY="$key" /usr/local/bin/aenv "$@"; }
created=$(inside curl -sS -X POST -H "X-API-Key: $key" -H 'Content-Type: application/json' \
  -d '{"templateID":"base","timeout":900}' http://127.0.0.1:3000/sandboxes) || fail "POST /sandboxes"
id=$(printf '%s' "$created" | sed -n 's/.*"sandboxID":"\([^"]*\)".*/\1/p')
[ -n "$id" ] || { tail -30 "$work/run-1.log" | cut -c1-400; fail "create: $created"; }
echo "sandbox $id created"
vmm=$(inside sh -c 'for p in /proc/[0-9]*; do case $(cat $p/comm 2>/dev/null) in qemu*) echo ${p#/proc/} ;; esac; done' | tail -1)
[ -n "$vmm" ] || fail "no QEMU process in the container"
echo "VMM $vmm groups:"; inside cat /proc/"$vmm"/cgroup | grep -E 'memory|pids|^0::' | sed 's/^/  /'
inside grep -Eq '(:memory:|^0::)/.*aenv/' /proc/"$vmm"/cgroup || fail "the VMM is not in a group the node made"
out=$(cli exec "$id" -- sh -c 'echo hello from $(uname -n)') || fail "aenv exec: $out"
echo "aenv exec: $out"
case $out in *hello*) ;; *) fail "aenv exec printed no greeting" ;; esac

# docker stop: SIGTERM to PID 1 (aenvd pauses its sandboxes), then a new
# container over the same state volume.
stop
grep -E "paus|shutting|stopped" "$work/run-1.log" | tail -3 | cut -c1-300
start 2
health 2
cli resume "$id" >/dev/null || { tail -20 "$work/run-2.log" | cut -c1-400; fail "aenv resume $id in the new container"; }
out=$(cli exec "$id" -- echo kept) || fail "aenv exec after the restart: $out"
echo "after a stop and a new container: $out"
[ "$out" = kept ] || fail "the sandbox did not survive the container's restart"
cli rm "$id" >/dev/null || fail "aenv rm $id"
echo "PASS"
