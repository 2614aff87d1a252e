#!/usr/bin/env bash
# Where the Lua side of a seat-script call goes, line by line: the
# instructions ops/callgrind.sh counts inside Redis's Lua have no names
# (Redis ships its Lua without symbols), so this runs the same function
# library under stock Lua 5.1 (Debian's lua5.1, lua-socket, lua-cjson,
# installed when missing) with a hook on every VM instruction, redis.call
# forwarded to a private redis-server, and prints per call: the Lua VM
# instructions by source line, the calls of builtins and Lua functions by
# the line that makes them, and the Redis commands by line.
# docs/performance.md ("Where a direct call's instructions go") reads it beside
# the callgrind dump.
#
#   bash ops/luaprof.sh             # direct: acquire + release, as ops/callgrind.sh's direct
#   bash ops/luaprof.sh worker 200  # the worker's calls (the redelivery record), 200 rounds
#   bash ops/luaprof.sh handover 5  # the hot license's hand-overs, 5 rounds of 30
#
# The calls are the first acquire and release examples/script_calls.rs
# makes in MODE (captured with MONITOR), each round with a fresh session
# (and entry id). `handover` captures 30 hand-overs in a row (60 calls:
# release, queued acquire, ...) on its license of 10 holders and 20
# waiters, which leave its holders and queue as they found them (each of
# the 30 sessions moves one place round), and replays them as they were,
# each round with fresh entry ids and no request deadline. Line numbers
# are the library's (printed beside each).
set -euo pipefail
cd "$(dirname "$0")/.."
source ops/ensure-redis.sh
source ops/private-redis.sh
mode=${1:-direct}
rounds=${2:-100}
# Each round replays a captured acquire and release on a fresh session, so
# only the modes made of those calls can be profiled: heartbeat and reap
# would capture their setup's acquires instead.
case "$mode" in
  direct | worker | limits) capture=2 ;;
  handover) capture=60 ;;
  *) echo "luaprof: MODE must be direct, worker, limits (acquire + release calls) or handover, not $mode" >&2; exit 2 ;;
esac
if ! command -v lua5.1 >/dev/null 2>&1 || ! lua5.1 -e 'require "socket"; require "cjson"' >/dev/null 2>&1; then
  apt_install lua5.1 lua-socket lua-cjson
fi
cargo build --quiet -p seatgate-bench --example script_calls
bin=${CARGO_TARGET_DIR:-target}/debug/examples/script_calls

dir=$(mktemp -d)
port=$(free_port)
redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no --dir "$dir" >"$dir/redis.log" 2>&1 &
pid=$!
monitor=""
trap 'kill $monitor "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; rm -rf "$dir"' EXIT
wait_for_redis "$port"
url="redis://127.0.0.1:$port"
"$bin" "$url" setup
# handover sets its license up on its first run: not captured.
[ "$mode" = handover ] && "$bin" "$url" handover 2
redis-cli -p "$port" MONITOR >"$dir/monitor" &
monitor=$!
sleep 0.3
"$bin" "$url" "$mode" "$capture"
sleep 0.3
kill "$monitor"
monitor=""
python3 - "$dir" "$port" "$mode" "$capture" <<'PY'
import shlex, subprocess, sys
dir, port, mode, capture = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
calls = []
for line in open(f"{dir}/monitor"):
    if '"FCALL"' not in line:
        continue
    parts = shlex.split(line.split("] ", 1)[1])
    fn, rest = parts[1], parts[2:]
    nkeys = int(rest[0])
    keys, args = rest[1:1 + nkeys], rest[1 + nkeys:]
    if len(args) < 4:
        continue
    if mode == "handover":
        args[5] = "0"  # ARGV[6]: no deadline, so that later rounds still run
    else:
        args[3] = args[3] + "-%I"  # ARGV[4]: the session
    if args[0]:
        args[0] = args[0] + "-%I"  # ARGV[1]: the request's dedupe key
    calls.append("\t".join([fn, str(nkeys)] + keys + args))
    if len(calls) == capture:
        break
if len(calls) < capture:
    sys.exit("luaprof: %d of %d seat calls captured" % (len(calls), capture))
library = calls[0].split("\t")[0].rsplit("_", 1)[0]
open(f"{dir}/calls", "w").write("\n".join(calls) + "\n")
code = subprocess.run(["redis-cli", "-p", port, "--raw", "FUNCTION", "LIST", "LIBRARYNAME", library, "WITHCODE"],
                      check=True, capture_output=True, text=True).stdout
start = code.index("#!lua name=" + library)
end = code.rindex("\nend)") + len("\nend)")
open(f"{dir}/library.lua", "w").write(code[start:end] + "\n")
PY
lua5.1 ops/luaprof.lua "$port" "$dir/library.lua" "$dir/calls" "$rounds"
