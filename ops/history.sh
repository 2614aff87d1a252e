#!/usr/bin/env bash
# The long history run (issue 22): builds seatgate and the history checker
# (release, feature tools), runs real processes under a seeded fault
# schedule for --minutes, checks the whole history against the model, prints
# the summary. Exit 0: no anomaly; 1: anomalies (printed with evidence);
# 2: the run could not be made.
#
#   bash ops/history.sh --minutes 30 --seed 7 [--workers 3] [--clients 8] [--no-faults] [--cluster [--master-kill9]] [--debug]
#
# --cluster runs it on a private Redis Cluster (3 masters with a replica
# each, 6 shards) instead of one redis-server; its Redis faults are a
# coordinated master failover (CLUSTER FAILOVER), a short SIGSTOP and a
# CLIENT PAUSE WRITE of the master that holds a license. --master-kill9
# adds kill -9 of such a master (an unplanned failover, which may lose the
# last writes it acknowledged: anomalies are then printed as possibly that).
#
# --debug builds and runs the debug profile instead (no release build of the
# dependencies needed: quicker to start where only the tests were built).
#
# HISTORY_DUMP=FILE writes the whole recorded history there (to read an
# anomaly's context). Uses $CARGO_TARGET_DIR, else ./target.
set -euo pipefail
cd "$(dirname "$0")/.."
minutes=30
seed=1
extra=()
profile=release
while [ $# -gt 0 ]; do
  case "$1" in
    --minutes) minutes="$2"; shift 2 ;;
    --seed) seed="$2"; shift 2 ;;
    --workers|--clients) extra+=("$1" "$2"); shift 2 ;;
    --no-faults|--cluster|--master-kill9) extra+=("$1"); shift ;;
    --debug) profile=debug; shift ;;
    *) echo "usage: bash ops/history.sh [--minutes N] [--seed N] [--workers N] [--clients N] [--no-faults] [--cluster [--master-kill9]] [--debug]" >&2; exit 2 ;;
  esac
done
source ops/ensure-redis.sh
target="${CARGO_TARGET_DIR:-target}"
if [ "$profile" = release ]; then
  cargo build --release -p seatgate -p seatgate-history --features seatgate/fault-injection >&2
else
  cargo build -p seatgate -p seatgate-history --features seatgate/fault-injection >&2
fi
exec "$target/$profile/seatgate-history" --binary "$target/$profile/seatgate" \
  --seed "$seed" --secs "$((minutes * 60))" "${extra[@]}"
