#!/usr/bin/env bash
# Writes ops/prometheus/alerts.yml to stdout with every runbook_url under
# RUNBOOK_BASE (where docs/monitoring.md is served, without the trailing
# "#anchor") instead of the placeholder base the committed file carries, and
# checks the result with promtool when it is installed.
#   RUNBOOK_BASE=https://git.example.com/ops/seatgate/blob/main/docs/monitoring.md \
#     bash ops/prometheus/render.sh > /etc/prometheus/seatgate-alerts.yml
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
placeholder="https://seatgate.example/docs/monitoring.md"
: "${RUNBOOK_BASE:?set RUNBOOK_BASE to where docs/monitoring.md is served, e.g. https://git.example.com/ops/seatgate/blob/main/docs/monitoring.md}"
case "$RUNBOOK_BASE" in
  http://* | https://*) ;;
  *) echo "render.sh: RUNBOOK_BASE must be an absolute http(s) URL: $RUNBOOK_BASE" >&2; exit 2 ;;
esac
case "$RUNBOOK_BASE" in
  *'#'* | *'"'* | *'|'* | *' '*) echo "render.sh: RUNBOOK_BASE must not hold '#', '\"', '|' or spaces" >&2; exit 2 ;;
esac
rules="$(mktemp)"
trap 'rm -f "$rules"' EXIT
sed "s|runbook_url: \"$placeholder#|runbook_url: \"${RUNBOOK_BASE%/}#|" "$here/alerts.yml" > "$rules"
alerts=$(grep -c -- '- alert:' "$rules")
linked=$(grep -c "runbook_url: \"${RUNBOOK_BASE%/}#" "$rules")
if [ "$alerts" -ne "$linked" ]; then
  echo "render.sh: $alerts alerts but $linked runbook_url under $RUNBOOK_BASE" >&2
  exit 1
fi
if command -v promtool >/dev/null 2>&1; then
  promtool check rules "$rules" >&2
fi
cat "$rules"
