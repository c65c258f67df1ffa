# Sourced by boot.sh once aenvd.service answers: creates a sandbox through
# the API, checks its VMM sits in a group under aenvd.service's delegated
# group (when the node has control groups), runs a command in it with the
# aenv CLI, restarts aenvd.service (which pauses it) and resumes it and runs
# one again.
# Uses boot.sh's inside and fail.
key=$(inside cat /var/lib/aenv/api-key) || fail "no API key in /var/lib/aenv/api-key"
cli() { inside env AENV_URL=http://127.0.0.1:3000 AENV_API_KEY="$key" /usr/local/bin/aenv "$@"; }
t0=$(date +%s)
created=$(inside curl -sS -X POST -H "X-API-Key: $key" -H 'Content-Type: application/json' \
  -d '{"templateID":"base","timeout":900}' http://127.0.0.1:3000/sandboxes) || fail "POST /sandboxes"
id=$(printf '%s' "$created" | sed -n 's/.*"sandboxID":"\([^"]*\)".*/\1/p')
[ -n "$id" ] || { inside journalctl -u aenvd --no-pager -n 30 -o cat | cut -c1-400; fail "create: $created"; }
echo "sandbox $id created in $(($(date +%s) - t0)) s"
state=$(inside curl -fsS -H "X-API-Key: $key" "http://127.0.0.1:3000/sandboxes/$id" | sed -n 's/.*"state":"\([^"]*\)".*/\1/p')
echo "sandbox state: $state"
[ "$state" = running ] || fail "sandbox $id is $state, not running"
if [ "${AENV_BOOT_CGROUPS:-}" != false ]; then
  # The tree has no procps: the VMM is the QEMU process naming the sandbox.
  vmm=$(inside sh -c 'for p in /proc/[0-9]*; do case $(cat $p/comm 2>/dev/null) in qemu*) ;; *) continue ;; esac
    echo ${p#/proc/}; tr "\0" " " <$p/cmdline | grep -q "$1" && exit; done' sh "$id" | tail -1 || true)
  [ -n "$vmm" ] || { inside sh -c 'for p in /proc/[0-9]*; do echo "${p#/proc/} $(tr "\0" " " <$p/cmdline | cut -c1-150)"; done'; fail "no QEMU process for $id"; }
  echo "VMM $vmm groups:"; inside cat /proc/"$vmm"/cgroup | grep -E 'memory|pids|cpu:|^0::' | sed 's/^/  /'
  inside grep -q ":memory:/system.slice/aenvd.service/aenv/" /proc/"$vmm"/cgroup ||
    inside grep -q "^0::/system.slice/aenvd.service/aenv/" /proc/"$vmm"/cgroup ||
    fail "the VMM is not in a group under aenvd.service's delegated group"
fi
out=$(cli exec "$id" -- sh -c 'echo hello from $(uname -n)') || fail "aenv exec: $out"
echo "aenv exec: $out"
case $out in *hello*) ;; *) fail "aenv exec printed no greeting" ;; esac
inside systemctl restart aenvd.service
for _ in $(seq 120); do inside curl -fsS http://127.0.0.1:3000/health >/dev/null 2>&1 && break; sleep 1; done
# A graceful stop pauses running sandboxes (sandbox.pause_on_shutdown, on
# in the installed configuration); the restarted node keeps them.
cli resume "$id" >/dev/null || fail "aenv resume $id after systemctl restart aenvd"
out=$(cli exec "$id" -- echo adopted) || {
  inside journalctl -u aenvd --no-pager -n 30 -o cat | cut -c1-400
  fail "aenv exec after systemctl restart aenvd: $out"
}
echo "after systemctl restart aenvd and aenv resume: $out"
[ "$out" = adopted ] || fail "the sandbox did not survive the restart"
cli rm "$id" >/dev/null || fail "aenv rm $id"
