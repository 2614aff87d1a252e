#!/usr/bin/env bash
# The Python package's suite (clients/python), in about 3 minutes:
#
# 1. builds the sdist and the wheel (python -m build -> dist/) and checks
#    them (twine check);
# 2. installs the wheel into two venvs, .venv-old with the oldest supported
#    redis-py (4.3.6) and .venv-new with the newest 8.x, plus pytest (and
#    mypy in .venv-new), and runs `mypy --strict src` once;
# 3. runs the tests (tests/, against real redis-server and seatgate run
#    processes; SEATGATE_BIN names the binary, default
#    ../../target/debug/seatgate) in both venvs, against the installed wheel;
# 4. checks that `pip install ./clients/python` works offline: a wheelhouse
#    (build/wheelhouse, filled here with pip download) and a fresh venv
#    installing from it with --no-index.
#
# It prints one summary line per venv (redis-py version, passed/failed) and
# exits non-zero when anything failed. Python: $PYTHON, else python3 (with
# venv; on Debian that is the python3-venv package, see ops/ensure-python.sh).
set -uo pipefail
cd "$(dirname "$0")"
HERE=$PWD
PY=${PYTHON:-python3}
export SEATGATE_BIN=${SEATGATE_BIN:-$(cd ../.. && pwd)/target/debug/seatgate}
export PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1
OLDEST_REDIS=4.3.6
failed=0
summaries=()
total_p=0 total_f=0 total_k=0

step() { printf '\n== %s\n' "$*"; }
venv() { # venv <dir>: a venv there (made once, kept between runs)
  [ -x "$1/bin/python" ] || "$PY" -m venv "$1" || { echo "cannot make a venv with $PY: install python3-venv" >&2; exit 2; }
}

step "build: sdist and wheel into dist/"
venv .venv-tools
.venv-tools/bin/pip install -q build twine || exit 2
rm -rf dist
.venv-tools/bin/python -m build --outdir dist . >build.log 2>&1 || { cat build.log; exit 1; }
rm -f build.log
ls dist
WHEEL=$(ls dist/seatgate-0.1.0-*.whl)
step "twine check dist/*"
.venv-tools/bin/twine check dist/* || failed=1

step "venvs: .venv-old (redis==$OLDEST_REDIS), .venv-new (newest redis 8.x)"
venv .venv-old
venv .venv-new
.venv-old/bin/pip install -q --force-reinstall --no-deps "$WHEEL" && .venv-old/bin/pip install -q "$WHEEL" "redis==$OLDEST_REDIS" pytest || exit 2
.venv-new/bin/pip install -q --force-reinstall --no-deps "$WHEEL" && .venv-new/bin/pip install -q --upgrade "$WHEEL" "redis>=8,<9" pytest mypy || exit 2

step "mypy --strict src (redis $(.venv-new/bin/python -c 'import redis; print(redis.__version__)'))"
if .venv-new/bin/mypy --strict src; then mypy_result="mypy --strict: clean"; else mypy_result="mypy --strict: FAILED"; failed=1; fi

for v in .venv-old .venv-new; do
  redis_version=$($v/bin/python -c 'import redis; print(redis.__version__)')
  py_version=$($v/bin/python -c 'import platform; print(platform.python_version())')
  step "pytest in $v (redis-py $redis_version, Python $py_version, the installed wheel)"
  log=$(mktemp)
  # From tests/ only: the package comes from the venv's site-packages, not src/.
  (cd "$HERE" && $v/bin/python -m pytest -q -s -p no:cacheprovider -rs tests) 2>&1 | tee "$log"
  rc=${PIPESTATUS[0]}
  [ "$rc" -eq 0 ] || failed=1
  counts=$($v/bin/python - "$log" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
lines = [l for l in text.splitlines() if re.search(r"\d+ (passed|failed|skipped|errors?)\b", l)]
last = lines[-1] if lines else ""
n = lambda *words: sum(int(m) for w in words for m in re.findall(rf"(\d+) {w}\b", last))
print(n('passed'), n('failed', 'error', 'errors'), n('skipped'))
PY
)
  read -r p f k <<<"$counts"
  total_p=$((total_p + p)); total_f=$((total_f + f)); total_k=$((total_k + k))
  summaries+=("$v (redis-py $redis_version, Python $py_version): $p passed, $f failed, $k skipped")
  rm -f "$log"
done

step "offline install: pip install --no-index --find-links build/wheelhouse ./clients/python"
rm -rf build/wheelhouse .venv-offline
mkdir -p build/wheelhouse
offline="offline install: FAILED"
if .venv-tools/bin/pip download -q --dest build/wheelhouse "redis>=4.3,<9" hatchling \
  && "$PY" -m venv .venv-offline \
  && (cd ../.. && clients/python/.venv-offline/bin/pip install -q --no-index --find-links clients/python/build/wheelhouse ./clients/python) \
  && .venv-offline/bin/python -c 'import seatgate, redis; print(f"seatgate {seatgate.__version__} with redis-py {redis.__version__}")'; then
  offline="offline install: ok ($(ls build/wheelhouse | wc -l) files in the wheelhouse)"
else
  failed=1
fi
rm -rf build .venv-offline

step "summary"
echo "$mypy_result"
echo "$offline"
for s in "${summaries[@]}"; do echo "$s"; done
echo "python: $total_p passed, $total_f failed, $total_k skipped"
exit $failed
