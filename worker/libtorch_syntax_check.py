"""Syntax-checks fitrun-worker's sources against another LibTorch's headers (a 2.x CUDA build).

The Bazel build compiles the worker against Debian's LibTorch 1.13; the GPU machines run a 2.x CUDA
LibTorch that cannot be installed here. This check compiles every given non-test source with
`g++ -fsyntax-only` against that LibTorch's headers (a tarball of its include/), with CUDA and NCCL
on and Gloo off (the pip wheel ships no Gloo headers), so that an API LibTorch changed fails here
instead of on a GPU machine. worker/torch_compat.h is where such differences go.

    libtorch_syntax_check.py --looked_for FILE --proto_root DIR FILE...

--looked_for names a file holding the path the tarball was looked for at; the tarball itself, when
it was found, sits beside that file under the same name (third_party/libtorch/libtorch_headers.bzl).

FILE are the worker's .cc and .h files, relative to the runfiles root; the .h files are only made
available, and *_test.cc / *_fuzz.cc are skipped unless --include_tests. The include path, in order:
  1. the runfiles root (worker/..., proto/contract/...) and --proto_root (fitrun/v1/*.pb.h);
  2. Debian's absl, gRPC and protobuf: the LibTorch's include/ carries protobuf 3.13's headers,
     which must not shadow the 3.21 ones the worker's protos and gRPC are built with;
  3. the LibTorch's include/ and include/torch/csrc/api/include;
  4. CUDA's include/ (cuda_runtime_api.h, nccl.h);
  5. the compiler's own directories, with /usr/include replaced by its entries less Debian's
     LibTorch and Gloo, so that a header the other LibTorch lacks is not found in 1.13's.

A missing tarball, CUDA include directory or compiler is a skipped test case in $XML_OUTPUT_FILE,
never a pass. Under $FITRUN_SYNTAX_CHECK_CACHE (default /tmp/fitrun-libtorch-headers), per tarball
SHA-256, the check keeps the unpacked headers and, for each source that compiled, the files it
included with their contents' digests: a re-run compiles only the sources where one changed.
"""
import argparse
import concurrent.futures
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from xml.sax.saxutils import quoteattr

# Top-level /usr/include entries of Debian's LibTorch 1.13 (libtorch-dev) and Gloo (libgloo-dev).
DEBIAN_TORCH_ENTRIES = {"ATen", "c10", "caffe2", "torch", "gloo"}
# Debian's headers that come before the LibTorch's include/ (see the module comment).
DEBIAN_FIRST_ENTRIES = ["absl", "google", "grpc", "grpc++", "grpcpp"]
# What third_party/libtorch/libtorch.bzl defines for a CUDA LibTorch without Gloo's headers.
DEFINES = ["-DFITRUN_WITH_CUDA", "-DUSE_C10D_NCCL"]
COMPILE_FLAGS = ["-std=c++17", "-fsyntax-only", "-Wno-deprecated-declarations"]
ERROR_LINES_SHOWN = 12


def is_test_source(path):
    return path.endswith("_test.cc") or path.endswith("_fuzz.cc")


def write_skipped(message):
    """Records the check as skipped (not passed) in the JUnit report Bazel collects."""
    print(f"SKIPPED: {message}")
    path = os.environ.get("XML_OUTPUT_FILE")
    if not path:
        return
    with open(path, "w") as f:
        f.write('<?xml version="1.0" encoding="UTF-8"?>\n<testsuites>\n'
                '<testsuite name="libtorch_syntax_check" tests="1" failures="0" errors="0" skipped="1">\n'
                '<testcase classname="libtorch_syntax_check" name="syntax_check" status="notrun">'
                f'<skipped message={quoteattr(message)}/></testcase>\n</testsuite>\n</testsuites>\n')


def file_digest(path):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def unpacked_headers(cache_entry, tarball):
    """The tarball's include/, unpacked once per content: each run unpacks beside the cache entry
    and renames into place, so a concurrent run never sees a half-written tree."""
    include = os.path.join(cache_entry, "include")
    if os.path.isdir(include):
        return include
    os.makedirs(cache_entry, exist_ok=True)
    staging = tempfile.mkdtemp(dir=cache_entry, prefix=".unpacking-")
    try:
        with tarfile.open(tarball) as archive:
            # The data filter (where this Python has it) refuses links and paths leaving `staging`.
            if hasattr(tarfile, "data_filter"):
                archive.extractall(staging, filter="data")
            else:
                archive.extractall(staging)
        if not os.path.isdir(os.path.join(staging, "include")):
            raise SystemExit(f"{tarball} has no include/ at its top")
        try:
            os.rename(os.path.join(staging, "include"), include)
        except OSError:
            if not os.path.isdir(include):  # not another run's rename winning the race
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return include


def compiler_system_dirs(compiler):
    """The compiler's own #include <...> search list, in order."""
    out = subprocess.run([compiler, "-xc++", "-std=c++17", "-E", "-v", "-"], input="",
                         capture_output=True, text=True, check=True).stderr.splitlines()
    start = out.index("#include <...> search starts here:") + 1
    return [line.strip() for line in out[start:out.index("End of search list.")]]


def link_entries(source_dir, target_dir, names):
    os.makedirs(target_dir)
    for name in names:
        os.symlink(os.path.join(source_dir, name), os.path.join(target_dir, name))


def include_flags(work, torch_include, proto_root, cuda_include, compiler):
    debian_first = os.path.join(work, "debian_first")
    link_entries("/usr/include", debian_first,
                 [n for n in DEBIAN_FIRST_ENTRIES if os.path.exists(os.path.join("/usr/include", n))])
    usr_include = os.path.join(work, "usr_include")
    link_entries("/usr/include", usr_include, sorted(set(os.listdir("/usr/include")) - DEBIAN_TORCH_ENTRIES))
    flags = ["-nostdinc", "-I.", "-I" + proto_root, "-isystem", debian_first, "-isystem", torch_include,
             "-isystem", os.path.join(torch_include, "torch/csrc/api/include"), "-isystem", cuda_include]
    for directory in compiler_system_dirs(compiler):
        flags += ["-isystem", usr_include if os.path.realpath(directory) == "/usr/include" else directory]
    return flags


class ResultCache:
    """Which sources compiled, with what they included: a source is checked again when it, a file
    it included, the compiler, the flags or the tarball (the cache's directory) changes."""

    def __init__(self, directory, torch_include, compiler, flags, work):
        self.directory = directory
        self.torch_include = os.path.realpath(torch_include)
        self.digests = {}
        version = subprocess.run([compiler, "--version"], capture_output=True, text=True).stdout
        # The per-run directory in the flags is the same include path on every run.
        flags = " ".join(COMPILE_FLAGS + DEFINES + flags).replace(work, "<work>")
        self.salt = hashlib.sha256((version + flags).encode()).hexdigest()
        os.makedirs(directory, exist_ok=True)

    def _entry(self, source):
        return os.path.join(self.directory, hashlib.sha256((self.salt + source).encode()).hexdigest()[:32])

    def _fingerprint(self, files):
        digest = hashlib.sha256()
        for path in files:
            if path not in self.digests:
                self.digests[path] = file_digest(path) if os.path.isfile(path) else "missing"
            digest.update(f"{path} {self.digests[path]}\n".encode())
        return digest.hexdigest()

    def passed_before(self, source):
        try:
            with open(self._entry(source)) as f:
                entry = json.load(f)
        except (OSError, ValueError):
            return False
        return entry["fingerprint"] == self._fingerprint(entry["files"])

    def record_pass(self, source, depfile):
        """Keeps what `source` included (from gcc's depfile), less the tarball's own headers."""
        with open(depfile) as f:
            text = f.read().replace("\\\n", " ")
        files = []
        for path in text.split(":", 1)[1].split():
            # Absolute paths through the per-run symlink trees name the same file on every run.
            resolved = os.path.realpath(path) if os.path.isabs(path) else path
            if not resolved.startswith(self.torch_include + os.sep):
                files.append(resolved)
        files = sorted(set(files))
        staging = self._entry(source) + f".{os.getpid()}"
        with open(staging, "w") as f:
            json.dump({"source": source, "files": files, "fingerprint": self._fingerprint(files)}, f)
        os.replace(staging, self._entry(source))


def check(compiler, flags, source, cache, work):
    """(source, seconds, None) when it compiles (or did, unchanged), else the compiler's output."""
    start = time.monotonic()
    if cache.passed_before(source):
        return source, None, None
    depfile = os.path.join(work, source.replace("/", "_") + ".d")
    result = subprocess.run([compiler, *COMPILE_FLAGS, *DEFINES, *flags, "-MD", "-MF", depfile, source],
                            capture_output=True, text=True)
    if result.returncode == 0:
        cache.record_pass(source, depfile)
        return source, time.monotonic() - start, None
    return source, time.monotonic() - start, result.stdout + result.stderr


def first_errors(output):
    """The first error lines, each with the line after it (gcc's source excerpt)."""
    lines = output.splitlines()
    shown = []
    for i, line in enumerate(lines):
        if "error:" in line:
            shown.append(line)
            if i + 1 < len(lines) and "error:" not in lines[i + 1]:
                shown.append(lines[i + 1])
        if len(shown) >= ERROR_LINES_SHOWN:
            break
    return shown or lines[:ERROR_LINES_SHOWN]


def missing_from(files):
    """The worker's .cc files in the source tree that were not given (a package without a `sources`
    filegroup in //worker:libtorch_2_11_syntax_test), found through this script's runfile link."""
    worker_dir = os.path.dirname(os.path.realpath(__file__))
    if os.path.basename(worker_dir) != "worker":
        return []
    given = set(files)
    missing = []
    for directory, _, names in os.walk(worker_dir):
        for name in names:
            if name.endswith(".cc"):
                path = os.path.relpath(os.path.join(directory, name), os.path.dirname(worker_dir))
                if path not in given:
                    missing.append(path)
    return sorted(missing)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--looked_for", required=True, help="a file naming where the tarball was looked for")
    parser.add_argument("--proto_root", required=True, help="the directory fitrun/v1/*.pb.h are under")
    parser.add_argument("--cuda_include", default="/usr/local/cuda/include")
    parser.add_argument("--compiler", default="g++")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--include_tests", action="store_true", help="also *_test.cc and *_fuzz.cc")
    parser.add_argument("files", nargs="+")
    args = parser.parse_args()

    # Bazel's runner starts tests in a temporary directory; every path given is runfiles-relative.
    if "TEST_SRCDIR" in os.environ:
        os.chdir(os.path.join(os.environ["TEST_SRCDIR"], os.environ.get("TEST_WORKSPACE", "fitrun")))
    with open(args.looked_for) as f:
        where = f.read().strip()
    tarball = os.path.join(os.path.dirname(args.looked_for), os.path.basename(where))
    if not os.path.isfile(tarball):
        write_skipped(f"LibTorch headers not found: no {where} "
                      "(a clone needs shared/libtorch-headers/ beside it; then `bazel sync --configure`)")
        return 0
    for header in ("cuda_runtime_api.h", "nccl.h"):
        if not os.path.isfile(os.path.join(args.cuda_include, header)):
            write_skipped(f"CUDA headers not found: no {os.path.join(args.cuda_include, header)}")
            return 0
    if shutil.which(args.compiler) is None:
        write_skipped(f"no {args.compiler} on PATH")
        return 0
    missing = missing_from(args.files)
    if missing:
        print("not given to the check (add the package's `sources` filegroup to WORKER_SOURCES in "
              "worker/BUILD):\n  " + "\n  ".join(missing))
        return 1

    start = time.monotonic()
    tarball = os.path.realpath(tarball)
    cache_entry = os.path.join(os.environ.get("FITRUN_SYNTAX_CHECK_CACHE", "/tmp/fitrun-libtorch-headers"),
                               file_digest(tarball)[:16])
    torch_include = unpacked_headers(cache_entry, tarball)
    work = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
    flags = include_flags(work, torch_include, args.proto_root, args.cuda_include, args.compiler)
    cache = ResultCache(os.path.join(cache_entry, "passed"), torch_include, args.compiler, flags, work)
    sources = sorted(f for f in args.files
                     if f.endswith(".cc") and (args.include_tests or not is_test_source(f)))
    print(f"checking {len(sources)} sources against {torch_include} with {args.jobs} jobs")
    failures = []
    compiled = 0
    with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
        results = pool.map(lambda s: check(args.compiler, flags, s, cache, work), sources)
        for source, seconds, output in results:
            if seconds is None:
                continue  # unchanged since it last compiled
            compiled += 1
            print(f"{'ok  ' if output is None else 'FAIL'} {source} ({seconds:.1f} s)", flush=True)
            if output is not None:
                failures.append((source, output))
    print(f"{len(sources) - len(failures)} of {len(sources)} sources compile against {where} "
          f"({compiled} compiled, {len(sources) - compiled} unchanged since they last did; "
          f"{time.monotonic() - start:.0f} s)")
    for source, output in failures:
        print(f"\n{source}:")
        for line in first_errors(output):
            print("  " + line)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
