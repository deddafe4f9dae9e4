#!/usr/bin/env bash
# The Prometheus side of deploy/: prometheus.yml loads as a config with its rule file, also with its
# authorization and HTTPS blocks uncommented (as for a fitrund with --auth_tokens and --tls_cert),
# alerts.yml's rules parse, and
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

# The secured variant: the six commented lines uncommented, the token and CA files where they say.
printf '%s' example-token > fitrun-token
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout ca.key -out fitrun-ca.pem \
  -days 1 -subj /CN=example-ca 2>/dev/null
sed -E -e 's/^( *)# (authorization:)$/\1\2/' -e 's/^( *)# (  type: Bearer)$/\1\2/' \
  -e "s|^( *)# (  credentials_file: ).*$|\1\2$work/fitrun-token|" \
  -e 's/^( *)# (scheme: https)$/\1\2/' -e 's/^( *)# (tls_config:)$/\1\2/' \
  -e "s|^( *)# (  ca_file: ).*$|\1\2$work/fitrun-ca.pem|" prometheus.yml > secured.yml
if [[ $(grep -cE '^ *(authorization:|  type: Bearer|  credentials_file: |scheme: https|tls_config:|  ca_file: )' \
        secured.yml) -ne 6 ]] || ! grep -q "credentials_file: $work/fitrun-token" secured.yml ||
   ! grep -q "ca_file: $work/fitrun-ca.pem" secured.yml; then
  echo "prometheus.yml: expected six commented lines 'authorization:', 'type: Bearer', 'credentials_file: ...'," \
    "'scheme: https', 'tls_config:', 'ca_file: ...'" >&2
  exit 1
fi
"$promtool" check config secured.yml
