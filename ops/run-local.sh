#!/usr/bin/env bash
# The main job on one machine: Redis (installed and started if needed), a demo
# license with one seat, and a seatgate worker in the foreground (Ctrl-C stops it).
#   SEATGATE__REDIS__URL  Redis to use (default redis://127.0.0.1:6379)
set -euo pipefail
cd "$(dirname "$0")/.."
source ops/ensure-redis.sh

url="${SEATGATE__REDIS__URL:-redis://127.0.0.1:6379}"
hostport="${url#redis://}"; hostport="${hostport##*@}"; hostport="${hostport%%/*}"
host="${hostport%%:*}"; port="${hostport##*:}"; [ "$port" = "$hostport" ] && port=6379

if ! redis-cli -u "$url" ping >/dev/null 2>&1; then
  case "$host" in
    127.0.0.1|localhost) ;;
    *) echo "seatgate: error: no Redis answers at $url; start it or set SEATGATE__REDIS__URL" >&2; exit 3 ;;
  esac
  data="$PWD/target/redis-local"
  mkdir -p "$data"
  echo "starting a local redis-server on 127.0.0.1:$port (data in $data, log in $data/redis.log)"
  redis-server ops/redis.conf --port "$port" --bind 127.0.0.1 --dir "$data" \
    --daemonize yes --logfile "$data/redis.log" --pidfile "$data/redis.pid"
  for _ in $(seq 50); do redis-cli -u "$url" ping >/dev/null 2>&1 && break; sleep 0.1; done
fi

cargo build --release --locked --quiet --features tools
bin="$PWD/target/release/seatgate"
export SEATGATE__REDIS__URL="$url"
"$bin" license put demo --seats 1 --heartbeat-timeout 15s

metrics="${SEATGATE__METRICS__LISTEN:-127.0.0.1:9464}"
cat <<MSG

seatgate is starting against $url
  metrics:  http://$metrics/metrics   (health: /live, /ready)
  try, in another terminal:
    $bin acquire --license demo --session alice --meta '{"user_email":"alice@example.com"}'
    $bin release --license demo --session alice

MSG
exec "$bin" run
