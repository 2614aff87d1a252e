#!/usr/bin/env bash
# Installs Debian's python3-redis (redis-py; Debian 12 ships 4.3, which has
# redis.asyncio) when no python3 the tests look at can import redis.asyncio,
# python3-venv for clients/python/test.sh, and the gateway tests' venv
# (below).
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

# clients/python/test.sh makes venvs (python3 -m venv): Debian splits
# ensurepip, which venv needs, into python3-venv.
if ! python3 -c 'import ensurepip' >/dev/null 2>&1; then
  echo "python3 cannot make venvs: installing Debian's python3-venv package" >&2
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends python3-venv >/dev/null
fi

# The gateway's generated-client test (tests/it/gateway.rs) runs
# openapi-python-client and PyJWT from a venv of their own,
# target/python-gateway, made here from PyPI (pinned) when it lacks them.
_seatgate_gateway_venv=target/python-gateway
if ! "$_seatgate_gateway_venv/bin/python" -c 'import jwt, openapi_python_client' >/dev/null 2>&1; then
  echo "making $_seatgate_gateway_venv (openapi-python-client, PyJWT) for the gateway tests" >&2
  if ! python3 -m venv "$_seatgate_gateway_venv" >/dev/null 2>&1; then
    SUDO=""
    [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends python3-venv >/dev/null
    rm -rf "$_seatgate_gateway_venv"
    python3 -m venv "$_seatgate_gateway_venv"
  fi
  "$_seatgate_gateway_venv/bin/pip" install -q --disable-pip-version-check \
    'openapi-python-client==0.29.1' 'pyjwt[crypto]==2.10.1'
fi
unset _seatgate_gateway_venv
