"""Counts test cases from Bazel's JUnit reports for every test target in the workspace.

Usage: test_summary.py BAZEL_TEST_OUTPUT [--config=NAME] [--junit=DIR] TARGET... (the targets `bazel
test` was given; their reports are read from the test logs of that configuration). --junit=DIR adds the
cases of every DIR/*.xml, reports of tests run outside Bazel (tools/gpu/rehearse.sh), each file
counted as one more target. Prints one line per failed case and a last line
`tests: N passed, N failed`. A target Bazel did not pass without a failed case in its report (a
crash, a timeout, no report at all) counts as one failure, so a crash is never counted as a pass.
A target run several times (--runs_per_test) has a report per run: each case counts once, and
fails when it failed in any run (a flaky case is a failed one). Exits non-zero when anything failed.
"""
import glob
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


def count_cases(target, reports, runs):
    """Prints each failed and skipped case of TARGET's REPORTS; returns (passed, failed, skipped).
    A case counts once however many runs' REPORTS hold it, and fails when it failed in any."""
    cases = {}  # name -> "passed" | "skipped" | [failed runs]
    skipped_why = {}
    for report in reports:
        try:
            root = ET.parse(report).getroot()
        except (OSError, ET.ParseError):
            continue
        for case in root.iter("testcase"):
            name = f"{case.get('classname')}.{case.get('name')}"
            if case.find("failure") is not None or case.find("error") is not None:
                failures = cases.get(name)
                cases[name] = (failures if isinstance(failures, list) else []) + [report]
            elif case.find("skipped") is not None or case.get("result") == "skipped":
                why = case.find("skipped")
                skipped_why[name] = why.get("message", "") if why is not None else ""
                cases.setdefault(name, "skipped")
            elif case.get("status", "run") != "notrun":
                cases.setdefault(name, "passed")
    cases_failed = cases_passed = cases_skipped = 0
    for name, outcome in cases.items():
        if isinstance(outcome, list):
            cases_failed += 1
            print(f"FAILED {target}: {name}" + (f" (in {len(outcome)} of {len(runs)} runs)" if runs else ""))
        elif outcome == "skipped":
            cases_skipped += 1
            print(f"SKIPPED {target}: {name}: {skipped_why.get(name, '')}")
        else:
            cases_passed += 1
    return cases_passed, cases_failed, cases_skipped


def main():
    statuses = target_statuses(sys.argv[1])
    config = [arg for arg in sys.argv[2:] if arg.startswith("--config=")]
    junit_dirs = [arg.split("=", 1)[1] for arg in sys.argv[2:] if arg.startswith("--junit=")]
    targets = [arg for arg in sys.argv[2:] if not arg.startswith("--")]
    testlogs = targets and subprocess.run(["bazel", "info", *config, "bazel-testlogs"], capture_output=True,
                                          text=True, check=True).stdout.strip()
    passed = failed = skipped = 0
    for target in targets:
        package, name = target.lstrip("/").split(":")
        directory = os.path.join(testlogs, package, name)
        # Reports of earlier invocations (one run, or another number of runs) may linger beside this
        # one's: the newest set is this invocation's.
        sets = {}
        for report in glob.glob(os.path.join(directory, "run_*_of_*", "test.xml")):
            sets.setdefault(report.split("_of_")[-1], []).append(report)
        single = os.path.join(directory, "test.xml")
        if os.path.exists(single):
            sets["single"] = [single]
        newest = max(sets.values(), key=lambda reports: max(map(os.path.getmtime, reports)), default=[single])
        runs = newest if newest != [single] else []
        reports = newest
        cases_passed, cases_failed, cases_skipped = count_cases(target, reports, runs)
        verdict = statuses.get(target, "NO STATUS")
        if verdict != "PASSED" and cases_failed == 0:
            log = os.path.join(directory, "test.log")
            print(f"FAILED {target}: {verdict} without a failed case in its report (see {log})")
            cases_failed = 1
            cases_passed = cases_skipped = 0
        passed += cases_passed
        failed += cases_failed
        skipped += cases_skipped
    for directory in junit_dirs:
        for report in sorted(glob.glob(os.path.join(directory, "*.xml"))):
            target = os.path.relpath(report)
            try:
                ET.parse(report)
            except (OSError, ET.ParseError) as error:
                print(f"FAILED {target}: unreadable report ({error})")
                failed += 1
                continue
            cases_passed, cases_failed, cases_skipped = count_cases(target, [report], [])
            passed += cases_passed
            failed += cases_failed
            skipped += cases_skipped
    print(f"tests: {f'{skipped} skipped, ' if skipped else ''}{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
