#!/usr/bin/env bash
# The Prometheus side of deploy/: prometheus.yml loads as a config with its rule file, alerts.yml's
# rules parse, and alerts_test.yml's unit tests (every alert firing, then resolving) pass. Debian's
# promtool, on copies in one folder, as prometheus.yml names alerts.yml beside it.
set -euo pipefail
promtool=${PROMTOOL:-/usr/bin/promtool}
runfiles="${TEST_SRCDIR:-$PWD/..}/${TEST_WORKSPACE:-fitrun}"
work="${TEST_TMPDIR:-$(mktemp -d)}/prometheus"
rm -rf "$work" && mkdir -p "$work"
cp "$runfiles"/deploy/prometheus/{prometheus.yml,alerts.yml,alerts_test.yml} "$work/"
cd "$work"
"$promtool" --version 2>&1 | head -n 1
"$promtool" check config prometheus.yml
"$promtool" check rules alerts.yml
"$promtool" test rules alerts_test.yml
