#!/usr/bin/env bash
# Runs the whole test suite: every crate's tests, the ones plain
# `cargo test --workspace` leaves out too. Tests start their own
# redis-server processes on free loopback ports; the ones marked
# `#[ignore = "needs …"]` also start prometheus, promtool, an Alertmanager
# for its example configuration or a headless chromium, run the Python
# examples with redis-py, or install and purge the Debian package (as root:
# dpkg). Then the TypeScript client's suite (clients/node/test.sh: npm ci,
# tsc, node --test against redis-server and the seatgate binary cargo
# built), the Python client's (clients/python/test.sh: wheel, twine check,
# mypy --strict, pytest under the oldest and newest redis-py) and the client
# conformance suite against the Rust, TypeScript and Python clients. This script makes sure those are installed, checks the alert rules,
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
# The two real-Prometheus alert tests wait minutes for the shipped rules'
# `for:` clocks, mostly asleep: in a whole run they go in the background
# beside the clients' suites (below) instead of holding a test thread.
slow_tests=(
  prometheus::an_idle_license_expiring_in_12_hours_among_300_pages_at_15s_and_1m_and_nothing_else_does
  prometheus::redis_at_96_percent_pages_and_every_worker_down_raises_the_backlog_alerts_at_15s_and_1m
)
slow_skips=()
if [ ${#cargo_args[@]} -eq 0 ] && [ ${#test_args[@]} -eq 0 ]; then
  for t in "${slow_tests[@]}"; do slow_skips+=(--skip "$t"); done
fi
# The conformance runs of the TypeScript and Python clients wait for those
# clients to be built and installed (below).
cargo test --workspace --locked "${cargo_args[@]}" -- --include-ignored \
  --skip the_typescript_client_conforms --skip the_python_client_conforms "${slow_skips[@]}" "${test_args[@]}"
# The TypeScript client (clients/node) and the Python client (clients/python:
# its wheel, two venvs with the oldest and newest redis-py, mypy), against
# the binary the suite built.
# (where cargo put it: $CARGO_TARGET_DIR when set, else target/).
target_dir=${CARGO_TARGET_DIR:-$PWD/target}
export SEATGATE_BIN="$target_dir/debug/seatgate"
slow_pid=
if [ ${#slow_skips[@]} -gt 0 ]; then
  # The integration test binary the run above built (same features: no rebuild),
  # run as cargo runs it, from its crate's directory.
  it_bin=$(cargo test --workspace --locked --no-run --message-format=json 2>/dev/null |
    python3 -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "it":
        print(m["executable"])')
  slow_log="$target_dir/prometheus-alerts.log"
  (cd crates/seatgate && "$it_bin" --include-ignored --exact --nocapture "${slow_tests[@]}") >"$slow_log" 2>&1 &
  slow_pid=$!
fi
bash clients/node/test.sh
bash clients/python/test.sh
# The client conformance suite against all three clients (the Rust run
# again, for its summary beside the others).
conformance_log="$target_dir/conformance.log"
if ! cargo test -p seatgate-conformance --locked -- --include-ignored --nocapture --test-threads 1 >"$conformance_log" 2>&1; then
  cat "$conformance_log"
  exit 1
fi
# Each scenario's line (the first of a test follows its name on one line).
grep -oE '(Rust|Node|Python): .*|^test result: .* [1-9][0-9]* passed.*' "$conformance_log"
if [ -n "$slow_pid" ]; then
  if ! wait "$slow_pid"; then
    cat "$slow_log"
    exit 1
  fi
  grep -E '^test |scrape: ' "$slow_log" || true
fi
