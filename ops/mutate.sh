#!/usr/bin/env bash
# The mutation run (issue 22, "the checker is proven to catch bugs"): for
# each mutation below, applies it to a throwaway copy of HEAD (a git
# worktree in /tmp), builds that copy, runs a short history check on it and
# prints caught (the checker found anomalies) or missed. Exit 1 when any
# mutation is missed (or cannot be applied: the code it breaks has moved,
# so the mutation needs updating), 0 when every one is caught.
#
#   bash ops/mutate.sh [--secs 40] [--seed 1] [--only NAME]
#
# The mutants share one target dir, $MUTANT_TARGET_DIR (default
# /tmp/seatgate-mutants-target), seeded on first use with hard links to
# $CARGO_TARGET_DIR's (or ./target's) debug build, so only seatgate itself
# is compiled for each (~1-3 min on 2 cores).
set -euo pipefail
cd "$(dirname "$0")/.."
secs=40
seed=1
only=""
while [ $# -gt 0 ]; do
  case "$1" in
    --secs) secs="$2"; shift 2 ;;
    --seed) seed="$2"; shift 2 ;;
    --only) only="$2"; shift 2 ;;
    *) echo "usage: bash ops/mutate.sh [--secs N] [--seed N] [--only NAME]" >&2; exit 2 ;;
  esac
done
source ops/ensure-redis.sh

# name | file | the exact text replaced | its replacement; a name given on
# several lines is one mutation of several places. Each breaks one promise
# the history checker holds seatgate to.
mutations=(
  # The grant's seat check flipped: a freed seat goes to one waiter too many.
  "grant_seat_check|crates/seatgate-core/lua/includes/queue.lua|  while used < total and granted < max do|  while used <= total and granted < max do"
  # The seat check flipped in acquire too (acquire.lua alone is masked by
  # the grant's check: with nobody waiting, grant_waiters says "not clear"
  # when full): a full license hands out a seat.
  "acquire_seat_check|crates/seatgate-core/lua/includes/queue.lua|  while used < total and granted < max do|  while used <= total and granted < max do"
  "acquire_seat_check|crates/seatgate-core/lua/acquire.lua|  elseif used >= total then|  elseif used > total then"
  # A request sent again is decided again (the dedupe lookup never finds the first answer).
  "drop_dedupe|crates/seatgate-core/lua/includes/dedupe.lua|  if entry_id == '' then\n    return nil|  if true then\n    return nil"
  # The reaper evicts holders an eighth of their timeout after their last heartbeat.
  "reaper_evicts_fresh|crates/seatgate-core/lua/reap.lua|local timeout = license.heartbeat_timeout_ms or default_timeout|local timeout = (license.heartbeat_timeout_ms or default_timeout) / 8"
  # A release's event is lost: the scripts record no `released` event (the
  # seat is still freed; the license's seq stays gapless, the event is simply
  # never written).
  "lose_event|crates/seatgate-core/lua/includes/events.lua|  ACQUIRED = 'acquired', RELEASED = 'released', QUEUED|  ACQUIRED = 'acquired', QUEUED"
  # An acquire never looks for its session in holders: a lingering seat is
  # not taken back but counted twice over, a holder's new acquire is decided
  # as a stranger's.
  "forget_holder|crates/seatgate-core/lua/acquire.lua|  local score = seated ~= false and rcall('ZSCORE', K.holders, session)|  local score = false"
)

src_target="${CARGO_TARGET_DIR:-$PWD/target}"
target="${MUTANT_TARGET_DIR:-/tmp/seatgate-mutants-target}"
if [ ! -d "$target/debug" ] && [ -d "$src_target/debug" ]; then
  mkdir -p "$target"
  cp -al "$src_target/debug" "$target/debug"
fi
wt="$(mktemp -d /tmp/seatgate-mutant.XXXXXX)"
rmdir "$wt"
git worktree add --detach --quiet "$wt" HEAD
cleanup() { git worktree remove --force "$wt" >/dev/null 2>&1 || true; }
trap cleanup EXIT

results=()
missed=0
names=()
for m in "${mutations[@]}"; do
  name="${m%%|*}"
  [[ " ${names[*]} " == *" $name "* ]] || names+=("$name")
done
for name in "${names[@]}"; do
  [ -n "$only" ] && [ "$only" != "$name" ] && continue
  git -C "$wt" checkout --quiet -- .
  applied=1
  for m in "${mutations[@]}"; do
    IFS='|' read -r n file old new <<<"$m"
    [ "$n" = "$name" ] || continue
    if ! python3 - "$wt/$file" "$old" "$new" <<'PY'
import sys
path, old, new = sys.argv[1], sys.argv[2].replace('\\n', '\n'), sys.argv[3].replace('\\n', '\n')
text = open(path).read()
if text.count(old) != 1:
    sys.exit(f"{path}: the text to mutate appears {text.count(old)} times, not once")
open(path, 'w').write(text.replace(old, new))
PY
    then
      applied=0
    fi
  done
  if [ "$applied" = 0 ]; then
    results+=("$name|not applied (update the mutation)")
    missed=1
    continue
  fi
  echo "== $name: building" >&2
  if ! (cd "$wt" && CARGO_TARGET_DIR="$target" cargo build --quiet -p seatgate -p seatgate-history --features seatgate/fault-injection >&2); then
    results+=("$name|build failed")
    missed=1
    continue
  fi
  echo "== $name: history seed $seed, $secs s" >&2
  log="/tmp/seatgate-mutant-$name.log"
  set +e
  "$target/debug/seatgate-history" --binary "$target/debug/seatgate" --seed "$seed" --secs "$secs" >"$log" 2>&1
  code=$?
  set -e
  summary="$(grep -m1 '^anomalies:' "$log" || true)"
  first="$(grep -m1 '^  \[' "$log" | cut -c1-160 || true)"
  case "$code" in
    1) results+=("$name|caught ($summary; first: ${first# })") ;;
    0) results+=("$name|MISSED ($summary)"); missed=1 ;;
    *) results+=("$name|run failed, exit $code (see $log)"); missed=1 ;;
  esac
done

echo
printf '%-20s %s\n' mutation result
for r in "${results[@]}"; do
  printf '%-20s %s\n' "${r%%|*}" "${r#*|}"
done
exit "$missed"
