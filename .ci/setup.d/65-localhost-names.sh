#!/usr/bin/env bash
# Host routing on one box (docs/e2b-compat.md, "Host routing on a single
# box"): sandbox host names {port}-{id}.<domain>.localhost must resolve to
# loopback for every program, not only curl (which resolves *.localhost
# itself). glibc does so with the myhostname NSS module (systemd's, as on
# Ubuntu); Debian ships it as libnss-myhostname, whose installation adds it
# to the hosts line of /etc/nsswitch.conf. Idempotent.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
if ! dpkg -s libnss-myhostname >/dev/null 2>&1; then
  echo "installing libnss-myhostname"
  apt-get install -y -q --no-install-recommends libnss-myhostname >/dev/null 2>&1 ||
    { apt-get update -q && apt-get install -y -q --no-install-recommends libnss-myhostname >/dev/null; }
fi
if ! grep -Eq '^hosts:.*\bmyhostname\b' /etc/nsswitch.conf; then
  sed -i -E 's/^(hosts:.*)$/\1 myhostname/' /etc/nsswitch.conf
fi
getent hosts probe.sbx.localhost >/dev/null || { echo "*.localhost does not resolve after setup" >&2; exit 1; }
