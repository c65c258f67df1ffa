#!/usr/bin/env bash
# The S3 server the snapshot repository's tests run against: versitygw (an
# S3-compatible gateway, Apache-2.0) with its POSIX backend, built from the Go
# module proxy into $(go env GOPATH)/bin. Idempotent: a binary of the pinned
# version is kept.
set -euo pipefail
export PATH=/usr/local/go/bin:$HOME/go/bin:$PATH
version=v1.8.0
bin="$(go env GOPATH)/bin/versitygw"
if [ -x "$bin" ] && go version -m "$bin" 2>/dev/null | grep -q "mod[[:space:]]*github.com/versity/versitygw[[:space:]]*$version"; then
  echo "versitygw $version present"
  exit 0
fi
echo "installing versitygw $version"
go install "github.com/versity/versitygw/cmd/versitygw@$version"
"$bin" --version >/dev/null 2>&1 || { echo "versitygw $version did not build a runnable binary" >&2; exit 1; }
