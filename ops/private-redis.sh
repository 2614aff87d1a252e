#!/usr/bin/env bash
# What the ops scripts that start a redis-server of their own share
# (callgrind.sh, luaprof.sh): a free loopback port, the wait for the
# server to answer, Debian packages installed when missing. Sourced.

# Installs Debian packages PKG... (apt-get, quietly; sudo when not root).
apt_install() {
  local sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "$@" >/dev/null
}

# Prints a free loopback port.
free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# Waits up to 30 s for the redis-server on port $1 to answer PING.
wait_for_redis() {
  for _ in $(seq 300); do
    redis-cli -p "$1" ping >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  echo "no redis-server answered on port $1" >&2
  return 1
}
