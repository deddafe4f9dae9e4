"""Counts test cases from Bazel's JUnit reports for every test target in the workspace.

Usage: test_summary.py BAZEL_TEST_OUTPUT. Prints one line per failed case and a last line
`tests: N passed, N failed`. A target Bazel did not pass without a failed case in its report (a
crash, a timeout, no report at all) counts as one failure, so a crash is never counted as a pass.
Exits non-zero when anything failed.
"""
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET


def target_statuses(bazel_output_path):
    """Bazel's verdict per target, from the summary lines of `bazel test`."""
    statuses = {}
    pattern = re.compile(r"^(//\S+)\s+(?:\(cached\) )?(PASSED|FAILED|TIMEOUT|FLAKY|NO STATUS|INCOMPLETE|FAILED TO BUILD)")
    with open(bazel_output_path, errors="replace") as f:
        for line in f:
            match = pattern.match(line.strip())
            if match:
                statuses[match.group(1)] = match.group(2)
    return statuses


def main():
    statuses = target_statuses(sys.argv[1])
    targets = subprocess.run(["bazel", "query", "tests(//...)"], capture_output=True, text=True,
                             check=True).stdout.split()
    testlogs = subprocess.run(["bazel", "info", "bazel-testlogs"], capture_output=True, text=True,
                              check=True).stdout.strip()
    passed = failed = 0
    for target in targets:
        package, name = target.lstrip("/").split(":")
        directory = os.path.join(testlogs, package, name)
        report = os.path.join(directory, "test.xml")
        cases_failed = cases_passed = 0
        try:
            root = ET.parse(report).getroot()
            for case in root.iter("testcase"):
                if case.find("failure") is not None or case.find("error") is not None:
                    cases_failed += 1
                    print(f"FAILED {target}: {case.get('classname')}.{case.get('name')}")
                elif case.get("status", "run") != "notrun":
                    cases_passed += 1
        except (OSError, ET.ParseError):
            pass
        verdict = statuses.get(target, "NO STATUS")
        if verdict != "PASSED" and cases_failed == 0:
            log = os.path.join(directory, "test.log")
            print(f"FAILED {target}: {verdict} without a failed case in its report (see {log})")
            cases_failed = 1
            cases_passed = 0
        passed += cases_passed
        failed += cases_failed
    print(f"tests: {passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
