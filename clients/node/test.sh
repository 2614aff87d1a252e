#!/usr/bin/env bash
# The Node client's suite: a clean install from package-lock.json, the
# build, then the tests (against real redis-server and seatgate processes;
# SEATGATE_BIN names the binary, default ../../target/debug/seatgate).
set -euo pipefail
cd "$(dirname "$0")"
npm ci --no-audit --no-fund
npm run build
npm test
