#!/bin/sh
# The node container's entrypoint: makes the container's own control
# groups writable, then runs aenvd (as PID 1, its arguments passed on).
#
# A container engine mounts the control group file system read-only in a
# container that is not privileged (Docker and containerd, cgroup v1 and
# v2; systemd-nspawn too). aenvd makes its VMMs' groups under the
# container's own group (sandbox.cgroups, on by default), and refuses at
# start a hierarchy it cannot write. These mounts show only the container's
# own group (its cgroup namespace on v2, a bind of its group on v1), so
# making them writable hands the node its own subtree and nothing above it;
# remounting needs CAP_SYS_ADMIN, which the node holds anyway for its
# network namespaces. AENVD_SANDBOX_CGROUPS=false leaves them as they are.
set -eu
case ${AENVD_SANDBOX_CGROUPS:-true} in
false | 0 | no) ;;
*)
  # Mount points of cgroup file systems mounted read-only (field 4 starts
  # with ro): a per-mount flag, so remount,bind changes only this mount.
  awk '($3 == "cgroup" || $3 == "cgroup2") && $4 ~ /^ro(,|$)/ { print $2 }' /proc/self/mounts |
    while read -r mp; do
      mount -o remount,bind,rw "$mp" || {
        echo "aenv-node: cannot make $mp writable (the node needs CAP_SYS_ADMIN, or set AENVD_SANDBOX_CGROUPS=false)" >&2
        exit 1
      }
    done
  ;;
esac
exec /usr/local/bin/aenvd "$@"
