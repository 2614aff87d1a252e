#!/usr/bin/env bash
# Runs the whole test suite: every crate's tests, the ones plain
# `cargo test --workspace` leaves out too. Tests start their own
# redis-server processes on free loopback ports; the ones marked
# `#[ignore = "needs …"]` also start prometheus, promtool, an Alertmanager
# for its example configuration or a headless chromium, run the Python
# examples with redis-py, or install and purge the Debian package (as root:
# dpkg). Then the TypeScript client's suite (clients/node/test.sh: npm ci,
# tsc, node --test against redis-server and the seatgate binary cargo
# built). This script makes sure those are installed, checks the alert rules,
# builds the package first, and runs the ignored tests with the rest
# (`--include-ignored`).
set -euo pipefail
cd "$(dirname "$0")/.."
source ops/ensure-redis.sh
source ops/ensure-prometheus.sh
source ops/ensure-alertmanager.sh
source ops/ensure-chromium.sh
source ops/ensure-python.sh
source ops/ensure-node.sh
bash ops/check-prometheus.sh
# The Debian package (release build, cargo-deb) before the suite rather than
# inside it, where its minutes of compiling would slow the timing-sensitive
# tests; tests/it/package.rs then only repackages it and installs it.
bash ops/package-deb.sh >/dev/null
# Arguments before a `--` go to cargo (`-p seatgate --test it`), those after
# it to the test binaries (a name filter).
cargo_args=()
test_args=()
while [ $# -gt 0 ]; do
  if [ "$1" = "--" ]; then
    shift
    test_args=("$@")
    break
  fi
  cargo_args+=("$1")
  shift
done
cargo test --workspace --locked "${cargo_args[@]}" -- --include-ignored "${test_args[@]}"
# The TypeScript client (clients/node), against the binary the suite built.
SEATGATE_BIN="$PWD/target/debug/seatgate" bash clients/node/test.sh
