#!/usr/bin/env bash
# Counts the instructions a private redis-server spends per seat-script call,
# under valgrind's callgrind: the same count for the same work (within about
# 1%) however busy the machine is, where Redis's CPU time on two shared cores
# moves by 10% and more. docs/performance.md ("Where the time goes") has the
# figures.
#
#   bash ops/callgrind.sh                  # direct and worker, 2,000 calls each
#   CALLS=4000 bash ops/callgrind.sh direct worker limits heartbeat reap e2e
#
# Modes (examples/script_calls.rs makes the calls, pipelined 100 deep, on one
# license, and checks every answer):
#   direct     acquire + release, no dedupe, no limits (the benchmark's direct path)
#   worker     the same as the worker calls them: the redelivery lookup and record
#   limits     worker, with both rate limits on (never reached)
#   heartbeat  heartbeats of holders (direct)
#   reap       reaper steps of a license with 10 holders and nothing to do
#   floor      the direct calls, sent to examples/floor.lua: the same
#              commands, arguments and reply size with no decision (what
#              the call and its commands cost alone)
#   floor-worker  the worker calls, sent there too
#   handover   the hot license's seat changing hands, as the worker calls
#              it: 10 seats held, 20 sessions waiting; the oldest holder
#              releases (granting the queue's head in the same call, its
#              GRANTED written by the script) and asks again with a wait
#              (queued at the tail); a hand-over is two calls
#   grouped    direct acquires and releases of group eng on a license of
#              group_max cad=1 whose cad seat is held, nobody waiting
#   grouped-blocked  the same with 1,000 cad waiters ahead, each blocked by
#              cad's limit: within 2x of grouped is the queue by group's promise
#   e2e        requests end to end, not script calls: 50 users of one
#              multiplexed client through a worker (CALLS a multiple of 100);
#              every command a request costs Redis, the XADDs, reads and acks
#              with the script, over the requests
# Each mode runs 200 calls first, outside the count (the first calls compile
# nothing, but they grow the hashes to their size), then CALLS counted ones.
# REDIS_ARGS='--hash-max-listpack-value 256' passes settings to redis-server
# (that one is ops/redis.conf's).
# LICENSES=N spreads direct, worker and limits over N licenses (a service
# with many licenses in use; run a mode twice to count it with warm caches).
# HOLDERS=N has N sessions hold seats of the license through every mode (a
# busy license: its per-session hashes and ZSETs at that size).
# KEEP=DIR keeps each mode's dump as DIR/MODE.callgrind, for callgrind_annotate
# (which Redis and Lua functions the instructions went to).
# The count includes Redis reading the commands and writing the replies: what a
# call costs Redis, not the Lua alone.
set -euo pipefail
cd "$(dirname "$0")/.."
source ops/ensure-redis.sh
source ops/private-redis.sh
command -v valgrind >/dev/null 2>&1 || apt_install valgrind
modes=("$@")
[ "${#modes[@]}" -eq 0 ] && modes=(direct worker)
calls=${CALLS:-2000}

cargo build --quiet -p seatgate-bench --example script_calls
bin=${CARGO_TARGET_DIR:-target}/debug/examples/script_calls

dir=$(mktemp -d)
port=$(free_port)
valgrind --tool=callgrind --callgrind-out-file="$dir/callgrind.out" \
  redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$dir" ${REDIS_ARGS:-} \
  >"$dir/valgrind.log" 2>&1 &
pid=$!
trap 'kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; rm -rf "$dir"' EXIT
wait_for_redis "$port"
url="redis://127.0.0.1:$port"
"$bin" "$url" setup

# The instructions counted since the last zeroing, from a fresh dump.
count() {
  local before
  before=$(ls "$dir" | grep -c '^callgrind.out\.' || true)
  callgrind_control -d "$pid" >/dev/null 2>&1
  for _ in $(seq 100); do
    [ "$(ls "$dir" | grep -c '^callgrind.out\.')" -gt "$before" ] && break
    sleep 0.1
  done
  sleep 0.5
  local dump
  dump=$(ls -t "$dir"/callgrind.out.* | head -1)
  [ -n "${KEEP:-}" ] && mkdir -p "$KEEP" && cp "$dump" "$KEEP/$1.callgrind"
  grep -h '^totals:' "$dump" | awk '{print $2}'
}

printf '%-10s %8s %16s %12s\n' mode calls instructions per-call
for mode in "${modes[@]}"; do
  "$bin" "$url" "$mode" 200
  callgrind_control -z "$pid" >/dev/null 2>&1
  "$bin" "$url" "$mode" "$calls"
  ir=$(count "$mode")
  printf '%-10s %8d %16d %12d\n' "$mode" "$calls" "$ir" "$((ir / calls))"
done
