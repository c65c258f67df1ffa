#!/usr/bin/env bash
# Builds kube-apiserver and etcd from the Go module proxy for the Kubernetes
# discovery tests, cached by version (one build per version per machine).
# Prints the cache directory holding kube-apiserver-<v> and etcd-<v>.
# Concurrent runs wait for each other (make setup starts one in the
# background, make test-k8s waits for it), so the binaries are built once.
set -euo pipefail
K8S_VERSION=v1.37.2
ETCD_VERSION=v3.7.3
here=$(cd "$(dirname "$0")" && pwd)
cache=${AENV_K8S_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/agentenv/k8s}
mkdir -p "$cache"
exec 9>"$cache/.build.lock"
flock 9
build() { # module-dir package output
	local out=$cache/$3
	[ -x "$out" ] && return 0
	(cd "$here/$1" && go mod tidy && CGO_ENABLED=0 go build -trimpath -o "$out.tmp" "$2")
	mv "$out.tmp" "$out"
}
build etcd go.etcd.io/etcd/server/v3 "etcd-$ETCD_VERSION" >&2
build apiserver k8s.io/kubernetes/cmd/kube-apiserver "kube-apiserver-$K8S_VERSION" >&2
echo "$cache"
