#!/usr/bin/env bash
# check_private_symbols.sh against three builds of one small protobuf program: linked the way
# worker/CMakeLists.txt links the worker (static archive, --exclude-libs,ALL, hidden visibility: must
# pass), with the archive's symbols exported (-rdynamic: must fail, EXPORTS), and against the shared
# libprotobuf (must fail, NEEDS and IMPORTS). Debian's own libprotobuf.a and libprotobuf.so are used.
set -euo pipefail

checker=$(readlink -f "$1")
work=${TEST_TMPDIR:-$(mktemp -d)}
cd "$work"

cat >program.cc <<'EOF'
#include <google/protobuf/timestamp.pb.h>
#include <google/protobuf/util/time_util.h>
#include <cstdio>
int main() {
  google::protobuf::Timestamp t = google::protobuf::util::TimeUtil::SecondsToTimestamp(86400);
  std::string bytes;
  t.SerializeToString(&bytes);
  google::protobuf::Timestamp back;
  back.ParseFromString(bytes);
  std::printf("%s\n", google::protobuf::util::TimeUtil::ToString(back).c_str());
  return back.seconds() == 86400 ? 0 : 1;
}
EOF
archive=/usr/lib/x86_64-linux-gnu/libprotobuf.a
[[ -f "$archive" ]] || { echo "FAIL: $archive is missing (libprotobuf-dev)"; exit 1; }
g++ -std=c++17 -O0 -fvisibility=hidden -fvisibility-inlines-hidden -c program.cc -o program.o
g++ program.o -o private -Wl,--exclude-libs,ALL "$archive" -lz -pthread
g++ program.o -o exported -rdynamic "$archive" -lz -pthread
g++ program.o -o shared -lprotobuf -pthread

failures=0
expect() {
  local want=$1 binary=$2 needle=$3 output status=0
  output=$(bash "$checker" "$binary" 2>&1) || status=$?
  if [[ "$want" == pass && $status -eq 0 ]] || [[ "$want" == fail && $status -eq 1 && "$output" == *"$needle"* ]]; then
    echo "ok: $binary: ${output%%$'\n'*}"
  else
    echo "FAIL: expected $binary to $want (exit $status, looking for '$needle'):"
    echo "$output"
    failures=$((failures + 1))
  fi
}

./private >/dev/null || { echo "FAIL: the privately linked program does not run"; failures=$((failures + 1)); }
expect pass private ""
expect fail exported "EXPORTS"
expect fail shared "NEEDS"
expect fail shared "IMPORTS"
((failures == 0)) || exit 1
echo "check_private_symbols_test: all cases as expected"
