#!/usr/bin/env bash
# The main job on one machine: Redis (installed and started if needed), a demo
# license with one seat, and a seatgate worker in the foreground (Ctrl-C stops it).
#   SEATGATE__REDIS__URL            Redis to use (default redis://127.0.0.1:6379)
#   SEATGATE__REDIS__USERNAME       ACL user, when not in the URL
#   SEATGATE__REDIS__PASSWORD       password, when not in the URL
#   SEATGATE__REDIS__PASSWORD_FILE  file holding the password (wins over the above)
#   SEATGATE_BIN                    a seatgate binary to use instead of building one
# Secrets travel in the environment only: no command line (which every user of
# the machine can read in ps) and no printed line carries a password.
set -euo pipefail
cd "$(dirname "$0")/.."
source ops/ensure-redis.sh

url="${SEATGATE__REDIS__URL:-redis://127.0.0.1:6379}"
scheme="${url%%://*}"; rest="${url#*://}"
authority="${rest%%/*}"; path=""; [ "$authority" != "$rest" ] && path="/${rest#*/}"
userinfo=""; hostport="$authority"
if [[ "$authority" == *@* ]]; then userinfo="${authority%@*}"; hostport="${authority##*@}"; fi
host="${hostport%%:*}"; port="${hostport##*:}"; [ "$port" = "$hostport" ] && port=6379
# URL userinfo is percent-encoded.
decode() { local s="${1//\\/\\\\}"; printf '%b' "${s//%/\\x}"; }
user="$(decode "${userinfo%%:*}")"; password=""
[[ "$userinfo" == *:* ]] && password="$(decode "${userinfo#*:}")"
user="${SEATGATE__REDIS__USERNAME:-$user}"
password="${SEATGATE__REDIS__PASSWORD:-$password}"
if [ -n "${SEATGATE__REDIS__PASSWORD_FILE:-}" ]; then
  password="$(head -n 1 "$SEATGATE__REDIS__PASSWORD_FILE")"
fi
# The URL as it may be shown: the password masked.
shown="$scheme://$hostport$path"
if [ -n "$user" ] || [ -n "$password" ]; then
  shown="$scheme://$user${password:+:***}@$hostport$path"
fi

# redis-cli reads the password from REDISCLI_AUTH; host and user go on its command line.
redis_cli() {
  local args=(-h "$host" -p "$port")
  [ -n "$user" ] && args+=(--user "$user")
  [ "$scheme" = "rediss" ] && args+=(--tls)
  if [ -n "$password" ]; then
    REDISCLI_AUTH="$password" redis-cli "${args[@]}" "$@"
  else
    redis-cli "${args[@]}" "$@"
  fi
}

if ! redis_cli ping 2>/dev/null | grep -q PONG; then
  case "$host" in
    127.0.0.1|localhost) ;;
    *) echo "seatgate: error: no Redis answers at $shown; start it or set SEATGATE__REDIS__URL" >&2; exit 3 ;;
  esac
  data="$PWD/target/redis-local"
  mkdir -p "$data"
  echo "starting a local redis-server on 127.0.0.1:$port (data in $data, log in $data/redis.log)"
  redis-server ops/redis.conf --port "$port" --bind 127.0.0.1 --dir "$data" \
    --daemonize yes --logfile "$data/redis.log" --pidfile "$data/redis.pid"
  for _ in $(seq 50); do redis_cli ping 2>/dev/null | grep -q PONG && break; sleep 0.1; done
fi

if [ -n "${SEATGATE_BIN:-}" ]; then
  bin="$SEATGATE_BIN"
else
  cargo build --release --locked --quiet -p seatgate
  bin="$PWD/target/release/seatgate"
fi
# seatgate reads these itself: the URL without its password, the password
# apart (or still from SEATGATE__REDIS__PASSWORD_FILE, which it reads too).
export SEATGATE__REDIS__URL="$scheme://$hostport$path"
export SEATGATE__REDIS__USERNAME="$user"
if [ -z "${SEATGATE__REDIS__PASSWORD_FILE:-}" ]; then
  export SEATGATE__REDIS__PASSWORD="$password"
fi
# --replace: the demo license exactly as the README describes it, whatever an
# earlier run left on it.
"$bin" license put demo --replace --seats 1 --heartbeat-timeout 15s

metrics="${SEATGATE__METRICS__LISTEN:-127.0.0.1:9464}"
cat <<MSG

seatgate is starting against $shown
  metrics:  http://$metrics/metrics   (health: /live, /ready)
  status:   http://$metrics/           (the status page; http.page_listen moves it)
  try, in another terminal (with the same SEATGATE__REDIS__* variables):
    $bin acquire --license demo --session alice --user alice --meta '{"user_email":"alice@example.com"}'
    $bin release --license demo --session alice --lease <the lease= acquire printed>

MSG
exec "$bin" run
