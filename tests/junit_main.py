"""unittest.main for the suite's Python tests, with a JUnit report Bazel and tools/test_summary.py read.

Bazel gives a test that writes no report one of its own, with the whole target as a single case, so
a skipped case would count as passed and thirty cases as one. This writes every case, with its time
and outcome (passed, failed, error or skipped with the reason), to $XML_OUTPUT_FILE when Bazel sets it.

    junit_main.main(argv=[sys.argv[0]] + rest)   # instead of unittest.main(...)
"""
import os
import sys
import time
import unittest
import xml.etree.ElementTree as ET


class _Result(unittest.TextTestResult):
    """A TextTestResult that also keeps each case's outcome and duration."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.cases = []  # (class name, test name, seconds, outcome, message)
        self._started = {}

    def startTest(self, test):
        self._started[test.id()] = time.monotonic()
        super().startTest(test)

    def _record(self, test, outcome, message=""):
        seconds = time.monotonic() - self._started.get(test.id(), time.monotonic())
        class_name, _, name = test.id().rpartition(".")
        self.cases.append((class_name, name, seconds, outcome, message))

    def addSuccess(self, test):
        super().addSuccess(test)
        self._record(test, "passed")

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self._record(test, "failure", self.failures[-1][1])

    def addError(self, test, err):
        super().addError(test, err)
        self._record(test, "error", self.errors[-1][1])

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        self._record(test, "skipped", reason)

    def addExpectedFailure(self, test, err):
        super().addExpectedFailure(test, err)
        self._record(test, "passed")

    def addUnexpectedSuccess(self, test):
        super().addUnexpectedSuccess(test)
        self._record(test, "failure", "passed, but was expected to fail")


def _write_report(path, suite_name, cases):
    suites = ET.Element("testsuites")
    suite = ET.SubElement(suites, "testsuite", name=suite_name, tests=str(len(cases)),
                          failures=str(sum(c[3] == "failure" for c in cases)),
                          errors=str(sum(c[3] == "error" for c in cases)),
                          skipped=str(sum(c[3] == "skipped" for c in cases)))
    for class_name, name, seconds, outcome, message in cases:
        case = ET.SubElement(suite, "testcase", classname=class_name, name=name, time=f"{seconds:.3f}",
                             status="notrun" if outcome == "skipped" else "run")
        if outcome in ("failure", "error", "skipped"):
            ET.SubElement(case, outcome, message=message.splitlines()[-1][:500] if message else outcome).text = message
    ET.ElementTree(suites).write(path, encoding="utf-8", xml_declaration=True)


def main(argv=None, verbosity=2):
    """Runs the calling module's tests as unittest.main would, writes the report, exits 0 or 1."""
    program = unittest.main(argv=argv, verbosity=verbosity, exit=False,
                            testRunner=unittest.TextTestRunner(resultclass=_Result, verbosity=verbosity))
    result = program.result
    report = os.environ.get("XML_OUTPUT_FILE")
    if report:
        _write_report(report, os.environ.get("TEST_TARGET", os.path.basename(sys.argv[0])), result.cases)
    sys.exit(0 if result.wasSuccessful() and result.testsRun > 0 else 1)
