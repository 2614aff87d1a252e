#!/usr/bin/env bash
# Runs the whole test suite. Tests start their own redis-server processes on
# free loopback ports; this script only makes sure redis-server is installed.
set -euo pipefail
cd "$(dirname "$0")/.."
source ops/ensure-redis.sh
cargo test --locked --features tools "$@"
