#!/usr/bin/env bash
# Installs Debian's nodejs and npm when no node >= 20.15 with npm is on PATH.
# Sourced by ops/test.sh: clients/node/test.sh builds the TypeScript client
# and runs its tests with Node's own test runner (node --test).
_seatgate_node_ok() {
  command -v npm >/dev/null 2>&1 && command -v node >/dev/null 2>&1 \
    && node -e 'const [a, b] = process.versions.node.split(".").map(Number); process.exit(a > 20 || (a === 20 && b >= 15) ? 0 : 1)' 2>/dev/null
}
if ! _seatgate_node_ok; then
  echo "no node >= 20.15 with npm: installing Debian's nodejs and npm packages" >&2
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends nodejs npm >/dev/null
  _seatgate_node_ok || echo "node >= 20.15 is still missing: clients/node's tests need it" >&2
fi
unset -f _seatgate_node_ok
