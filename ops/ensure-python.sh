#!/usr/bin/env bash
# Installs Debian's python3-redis (redis-py; Debian 12 ships 4.3, which has
# redis.asyncio) when no python3 the tests look at can import redis.asyncio.
# Sourced by ops/test.sh: tests/it/examples.rs runs examples/python_client.py
# and examples/python_async_client.py, and fails (it does not skip) when it
# finds no interpreter for them.
#
# The tests take $SEATGATE_TEST_PYTHON when set, else the first of `python3`
# on PATH and /usr/bin/python3 that imports redis.asyncio. A python3 on PATH
# may not be Debian's (pyenv's shim, a virtualenv): the package lands in
# /usr/bin/python3's path, which the tests then use.
_seatgate_python_ok() {
  "$1" -c 'import redis.asyncio' >/dev/null 2>&1
}
if [ -n "${SEATGATE_TEST_PYTHON:-}" ]; then
  if ! _seatgate_python_ok "$SEATGATE_TEST_PYTHON"; then
    echo "SEATGATE_TEST_PYTHON=$SEATGATE_TEST_PYTHON cannot import redis.asyncio (pip install redis, or unset it)" >&2
  fi
elif ! _seatgate_python_ok python3 && ! _seatgate_python_ok /usr/bin/python3; then
  echo "no python3 with redis.asyncio: installing Debian's python3-redis package" >&2
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends python3-redis >/dev/null
fi
unset -f _seatgate_python_ok
