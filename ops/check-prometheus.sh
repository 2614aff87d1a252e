#!/usr/bin/env bash
# Checks the Prometheus alert rules: syntax (promtool check rules) and the
# unit tests, one file per rule group (promtool test rules). Run by ops/test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
source ops/ensure-prometheus.sh
promtool check rules ops/prometheus/alerts.yml
promtool test rules ops/prometheus/tests/*.yml
