#!/usr/bin/env bash
# The Prometheus side of deploy/: prometheus.yml loads as a config with its rule file, also with its
# authorization block uncommented (as for a fitrund with --auth_tokens), alerts.yml's rules parse, and
# alerts_test.yml's unit tests (every alert firing, then resolving) pass. Debian's promtool, on copies
# in one folder, as prometheus.yml names alerts.yml beside it.
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

# The secured variant: the three commented lines uncommented, the token file where they say.
printf '%s' example-token > fitrun-token
sed -E -e 's/^( *)# (authorization:)$/\1\2/' -e 's/^( *)# (  type: Bearer)$/\1\2/' \
  -e "s|^( *)# (  credentials_file: ).*$|\1\2$work/fitrun-token|" prometheus.yml > secured.yml
if [[ $(grep -cE '^ *(authorization:|  type: Bearer|  credentials_file: )' secured.yml) -ne 3 ]] ||
   ! grep -q "credentials_file: $work/fitrun-token" secured.yml; then
  echo "prometheus.yml: expected three commented lines 'authorization:', 'type: Bearer', 'credentials_file: ...'" >&2
  exit 1
fi
"$promtool" check config secured.yml
