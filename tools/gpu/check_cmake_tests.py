"""Fails unless worker/CMakeLists.txt builds every gtest cc_test of worker/*/BUILD (but the ones it
leaves out by name, each with its reason) and no test the BUILD files do not have.

    check_cmake_tests.py WORKER_DIR

Why: the CMake build runs the worker's tests against LibTorch 2.x (tools/gpu/worker_tests.sh); a test
added to a BUILD file but not to the CMake list would never meet the LibTorch the GPU machines have.
The BUILD files are Starlark, which is Python enough to run here with every rule a stub that records
its name; the CMake side is the fitrun_worker_test(PACKAGE NAME ...) calls, loops over names included.
"""
import os
import re
import sys

# Tests the CMake build leaves out, and why (say the same in worker/CMakeLists.txt).
LEFT_OUT = {
    "worker_process_test": "the worker's processes against a fake coordinator: tests/ and check.sh run the real thing",
    "comm_hooks_pytorch_test": "its reference is Debian's python3-torch 1.13",
}


def bazel_tests(worker_dir):
    tests = set()
    for root, _, files in os.walk(worker_dir):
        if "BUILD" not in files:
            continue
        package = os.path.relpath(root, worker_dir)
        package = "" if package == "." else package

        def cc_test(name, **_):
            tests.add(f"{package}/{name}" if package else name)

        def anything(*_, **__):
            return []

        def glob(*_, **__):
            return []

        names = {"cc_test": cc_test, "glob": glob, "select": lambda d: [], "load": anything}
        with open(os.path.join(root, "BUILD")) as f:
            source = f.read()
        # Every other rule, macro or constant a BUILD file names is a stub.
        scope = dict(names)
        for name in set(re.findall(r"^\s*([A-Za-z_]\w*)\(", source, re.M)) - set(names):
            scope[name] = anything
        exec(compile(source, os.path.join(root, "BUILD"), "exec"), scope)
    return tests


def cmake_tests(cmake_file):
    text = open(cmake_file).read()
    tests = set()
    for package, name in re.findall(r"^\s*fitrun_worker_test\((\"\"|\w+)\s+(\w+)", text, re.M):
        tests.add(name if package == '""' else f"{package}/{name}")
    for names, package in re.findall(r"foreach\(name ([^)]*)\)\s*fitrun_worker_test\((\w+) \$\{name\}\)", text):
        for name in names.split():
            tests.add(f"{package}/{name}")
    return tests


def main():
    worker_dir = sys.argv[1]
    bazel = bazel_tests(worker_dir)
    cmake = cmake_tests(os.path.join(worker_dir, "CMakeLists.txt"))
    wanted = {t for t in bazel if t.split("/")[-1] not in LEFT_OUT}
    missing, extra = sorted(wanted - cmake), sorted(cmake - bazel)
    for test in missing:
        print(f"check_cmake_tests: {test} is a cc_test in worker/ but not built by worker/CMakeLists.txt: "
              "add a fitrun_worker_test line for it (or leave it out in check_cmake_tests.py, saying why)")
    for test in extra:
        print(f"check_cmake_tests: worker/CMakeLists.txt builds {test}, which no BUILD file has")
    if not bazel:
        print("check_cmake_tests: found no cc_test in the BUILD files")
        return 1
    if missing or extra:
        return 1
    print(f"check_cmake_tests: the {len(cmake)} cc_tests of worker/ that CMake builds, and {len(bazel) - len(wanted)} left out by name")
    return 0


if __name__ == "__main__":
    sys.exit(main())
