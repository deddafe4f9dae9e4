#!/usr/bin/env bash
# The relocatable bundle (tools/bundle.sh) from this build's fitrund and fitrun: packed, unpacked into
# another folder, every library that is not glibc's or the compiler runtime's resolves inside its lib/
# (ldd, LD_LIBRARY_PATH unset), and the unpacked fitrund serves on OS-chosen ports over TLS (a
# self-signed certificate made here) with `fitrun devices` answering the unpacked CLI and /metrics
# answering over HTTPS (civetweb with the bundle's OpenSSL, through the bundled shim); the daemon is
# stopped and no process from the bundle is left.
#   bundle_test.sh BUNDLE_SH FITRUND FITRUN
set -euo pipefail

bundle_sh=$(readlink -f "$1")
fitrund=$(readlink -f "$2")
fitrun=$(readlink -f "$3")
work=${TEST_TMPDIR:-$(mktemp -d)}/bundle
rm -rf "$work" && mkdir -p "$work"
unset LD_LIBRARY_PATH

fail() { echo "FAIL: $*"; exit 1; }

# glibc's own libraries and the compiler runtime: the machine's, by design (see tools/bundle.sh).
is_system_library() {
  case "$1" in
    linux-vdso.so.*|ld-linux*.so.*|libc.so.*|libm.so.*|libmvec.so.*|libpthread.so.*|libdl.so.*|librt.so.*| \
    libresolv.so.*|libutil.so.*|libanl.so.*|libnss_*|libBrokenLocale.so.*|libthread_db.so.*| \
    libstdc++.so.*|libgcc_s.so.*) return 0 ;;
  esac
  return 1
}

# 1. Pack, from the Bazel outputs this test depends on.
bash "$bundle_sh" --fitrund "$fitrund" --fitrun "$fitrun" "$work/out/fitrun-bundle.tar.gz"

# 2. Unpack elsewhere: nothing may point back at the build tree or the packing folder.
mkdir -p "$work/elsewhere"
tar -C "$work/elsewhere" -xzf "$work/out/fitrun-bundle.tar.gz"
rm -rf "$work/out"
root=$(readlink -f "$work/elsewhere/fitrun")
[[ -x "$root/bin/fitrund" && -x "$root/bin/fitrun" ]] || fail "bin/fitrund or bin/fitrun missing from the bundle"
libs=$(ls "$root/lib" | wc -l)
((libs > 20)) || fail "only $libs files in lib/: expected gRPC, protobuf, Abseil and the rest"

# 3. Every non-system library of the binaries and of the libraries themselves resolves inside lib/.
checked=0
for object in "$root/bin/fitrund" "$root/bin/fitrun" "$root/bin/libfitrun-civetweb-ssl.so" "$root"/lib/*; do
  while read -r name arrow path _; do
    [[ "$arrow" == "=>" ]] || continue
    is_system_library "$name" && continue
    # The loader's path is bin/../lib/...: compared once resolved.
    [[ "$path" != not && "$(readlink -f "$path")" == "$root/lib/"* ]] || fail "$(basename "$object"): $name resolves to $path, not inside the bundle's lib/"
    checked=$((checked + 1))
  done < <(ldd "$object")
done
echo "ldd: $checked non-system dependencies of $((libs + 2)) files, all inside the bundle's lib/"
for name in libgrpc++.so.1.51 libprotobuf.so.32 libcivetweb.so.1 libsqlite3.so.0 libyaml-cpp.so.0.7; do
  [[ -e "$root/lib/$name" ]] || fail "$name is not in the bundle's lib/"
done

# 4. fitrund from the unpacked bundle, on ports the OS picks, with the unpacked CLI against it.
state=$work/state
mkdir -p "$state"
daemon=""
bundle_processes() {
  local exe
  for exe in /proc/[0-9]*/exe; do
    if [[ "$(readlink "$exe" 2>/dev/null)" == "$root/"* ]]; then
      exe=${exe#/proc/}
      echo "${exe%/exe}"
    fi
  done
}
cleanup() {
  if [[ -n "$daemon" ]] && kill -0 "$daemon" 2>/dev/null; then
    kill -KILL "$daemon" 2>/dev/null || true
    wait "$daemon" 2>/dev/null || true
  fi
}
trap cleanup EXIT

openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout "$work/tls.key" \
  -out "$work/tls.pem" -days 1 -subj /CN=localhost -addext subjectAltName=IP:127.0.0.1 2>/dev/null
# --devices=cpu:... keeps the test the same on a machine with a GPU; the worker is never started.
"$root/bin/fitrund" --listen=127.0.0.1:0 --metrics_listen=127.0.0.1:0 --state_dir="$state" \
  --tls_cert="$work/tls.pem" --tls_key="$work/tls.key" \
  --devices=cpu:2x1GiB --worker_binary=/bin/false --memory_probe=false >"$work/fitrund.log" 2>&1 &
daemon=$!
for _ in $(seq 1 300); do
  [[ -s "$state/fitrund.metrics_address" ]] && break
  kill -0 "$daemon" 2>/dev/null || { cat "$work/fitrund.log"; fail "fitrund from the bundle exited before serving"; }
  sleep 0.1
done
address=$(cat "$state/fitrund.address" 2>/dev/null || true)
[[ -n "$address" ]] || { cat "$work/fitrund.log"; fail "fitrund did not write its address in 30 s"; }
echo "fitrund from the bundle serves on $address"

devices=$("$root/bin/fitrun" --coordinator="$address" --ca="$work/tls.pem" devices) || fail "fitrun devices failed: $devices"
echo "$devices"
[[ "$devices" == *"cpu:0"* && "$devices" == *"cpu:1"* ]] || fail "fitrun devices does not list cpu:0 and cpu:1"
metrics=$(/usr/bin/python3 - "$(cat "$state/fitrund.metrics_address")" "$work/tls.pem" <<'PY'
import ssl, sys, urllib.request
context = ssl.create_default_context(cafile=sys.argv[2])
print(urllib.request.urlopen(f"https://{sys.argv[1]}/metrics", timeout=10, context=context).read().decode())
PY
) || { cat "$work/fitrund.log"; fail "https /metrics from the bundle's fitrund failed"; }
[[ "$metrics" == *fitrun_build_info* ]] || fail "https /metrics has no fitrun_build_info"
kill -0 "$daemon" 2>/dev/null || { cat "$work/fitrund.log"; fail "fitrund from the bundle exited after an HTTPS request"; }
echo "https /metrics from the bundle: $(grep -c '^fitrun_' <<<"$metrics") series"

# 5. Stop it and leave nothing behind.
kill -TERM "$daemon"
for _ in $(seq 1 150); do kill -0 "$daemon" 2>/dev/null || break; sleep 0.1; done
kill -0 "$daemon" 2>/dev/null && fail "fitrund did not exit within 15 s of SIGTERM"
wait "$daemon" || true
daemon=""
left=$(bundle_processes)
[[ -z "$left" ]] || { kill -KILL $left 2>/dev/null || true; fail "processes from the bundle left running: $left"; }
echo "bundle_test: packed, relocated, served and stopped"
