#!/usr/bin/env bash
# Checks the Prometheus alert rules: syntax (promtool check rules), the unit
# tests (promtool test rules: one file per rule group, and interval-*.yml per
# scrape interval), that every runbook_url points at a section of
# docs/monitoring.md and renders under another base (render.sh), that the
# "nothing else pages" tests check every page alert, that no dashboard panel
# is empty at a 1 m scrape (ops/grafana/check-dashboard.py), and the
# Alertmanager example (amtool check-config, and its routes). Run by ops/test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
source ops/ensure-prometheus.sh
source ops/ensure-alertmanager.sh
promtool check rules ops/prometheus/alerts.yml
promtool test rules ops/prometheus/tests/*.yml

# Every alert has a runbook_url whose anchor is a heading of docs/monitoring.md.
alerts=$(grep -c -- '- alert:' ops/prometheus/alerts.yml)
anchors=$(sed -n 's|.*runbook_url: "https://seatgate.example/docs/monitoring.md#\([a-z0-9-]*\)".*|\1|p' ops/prometheus/alerts.yml)
if [ "$(echo "$anchors" | wc -l)" -ne "$alerts" ]; then
  echo "every one of the $alerts alerts needs a runbook_url under the placeholder base" >&2
  exit 1
fi
for anchor in $anchors; do
  if ! grep -qi "^### $anchor\$" docs/monitoring.md; then
    echo "runbook_url #$anchor: no such section in docs/monitoring.md" >&2
    exit 1
  fi
done
echo "runbook_url: $alerts alerts, each with a section in docs/monitoring.md"
RUNBOOK_BASE=https://git.example.com/ops/seatgate/blob/main/docs/monitoring.md \
  bash ops/prometheus/render.sh 2>/dev/null \
  | grep -c 'runbook_url: "https://git.example.com/ops/seatgate/blob/main/docs/monitoring.md#' \
  | { read -r n; [ "$n" -eq "$alerts" ] || { echo "render.sh rewrote $n of $alerts runbook_url" >&2; exit 1; }; }
echo "render.sh: every runbook_url under RUNBOOK_BASE"

# The "nothing else pages" tests (interval-15s.yml, interval-1m.yml) check
# every alert of severity page: a new page alert must be added to them.
python3 - <<'PY'
import re, sys
rules = open("ops/prometheus/alerts.yml").read()
pages = {a for a, sev in re.findall(r"- alert: (\w+)\n(?:.*\n)*?\s+severity: (\w+)", rules) if sev == "page"}
for path in ["ops/prometheus/tests/interval-15s.yml", "ops/prometheus/tests/interval-1m.yml"]:
    tests = re.split(r"\n  - name: ", open(path).read())
    for t in (t for t in tests if "nothing else pages" in t.split("\n")[0]):
        missing = pages - set(re.findall(r"alertname: (\w+)", t))
        if missing:
            sys.exit(f"{path}: test {t.splitlines()[0]!r} does not check {sorted(missing)}")
print(f"nothing-else-pages tests: each checks all {len(pages)} page alerts")
PY

# Every range selector of the dashboard holds two samples at a 1 m scrape.
python3 ops/grafana/check-dashboard.py ops/grafana/seatgate.json

amtool check-config ops/prometheus/alertmanager.yml
route() { amtool config routes test --config.file=ops/prometheus/alertmanager.yml --verify.receivers="$1" "${@:2}" 2>/dev/null; }
route seatgate-pager severity=page alertname=SeatgateRedisDown
route seatgate-tickets severity=ticket alertname=SeatgateLicenseExpiringSoon
