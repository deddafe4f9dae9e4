"""The reports tools/test.sh counts beside Bazel's: tools/gpu/figures.py junit turns the GPU check's
results.tsv into one case per figure, and tools/test_summary.py --junit counts each case of a
directory of reports, a failed or unreadable one as failed.

    run_python_test.sh tools/junit_reports_test.py FIGURES_PY TEST_SUMMARY_PY JUNIT_PY   (runfiles paths)
"""
import os
import subprocess
import sys
import tempfile
import unittest
import xml.etree.ElementTree as ET

import junit_main

RUNFILES = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIGURES, SUMMARY, JUNIT = (os.path.join(RUNFILES, path) for path in sys.argv[1:4])
PYTHON = "/usr/bin/python3"

RESULTS = """part\tstep\twhat\tfigure\tvalue\tgoal\tverdict
1\twhole_gpu\tmlp\tstate\tSUCCEEDED\tSUCCEEDED\tPASS
1\twhole_gpu\tmlp\tpredicted_over_nvml_measured\t-\t1.00-1.15\tSKIP (rehearsal: NVML needs a GPU)
2\tslices\tcnn-adamw-2GiB\tallocated_peak_over_cap\t0.695\t>= 0.8\tFAIL
2\tslices\t-\tstep_seconds\t74.1\t-\tFAIL (out of time)
"""


class JunitReportsTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))

    def path(self, name):
        return os.path.join(self.dir, name)

    def summary(self, reports):
        return subprocess.run([PYTHON, SUMMARY, os.devnull, f"--junit={reports}"], capture_output=True,
                              text=True, cwd=self.dir)

    def test_figures_become_one_case_each_with_skips_and_failures_kept(self):
        with open(self.path("results.tsv"), "w") as f:
            f.write(RESULTS)
        subprocess.run([PYTHON, FIGURES, "junit", self.path("results.tsv"), self.path("out.xml")], check=True)
        cases = list(ET.parse(self.path("out.xml")).getroot().iter("testcase"))
        self.assertEqual([(c.get("classname"), c.get("name")) for c in cases], [
            ("gpu_check.part1.whole_gpu", "mlp.state"),
            ("gpu_check.part1.whole_gpu", "mlp.predicted_over_nvml_measured"),
            ("gpu_check.part2.slices", "cnn-adamw-2GiB.allocated_peak_over_cap"),
            ("gpu_check.part2.slices", "step_seconds"),
        ])
        self.assertIsNone(cases[0].find("failure"))
        self.assertEqual(cases[1].find("skipped").get("message"), "rehearsal: NVML needs a GPU")
        self.assertIn("allocated_peak_over_cap = 0.695, goal >= 0.8", cases[2].find("failure").get("message"))
        self.assertIn("out of time", cases[3].find("failure").get("message"))

    def test_summary_counts_every_case_of_a_reports_directory(self):
        reports = self.path("reports")
        os.mkdir(reports)
        with open(self.path("results.tsv"), "w") as f:
            f.write(RESULTS)
        subprocess.run([PYTHON, FIGURES, "junit", self.path("results.tsv"), os.path.join(reports, "a.xml")],
                       check=True)
        subprocess.run([PYTHON, JUNIT, os.path.join(reports, "b.xml"), "gpu_path", "kit"], check=True)
        result = self.summary(reports)
        self.assertEqual(result.stdout.splitlines()[-1], "tests: 1 skipped, 2 passed, 2 failed")
        self.assertIn("cnn-adamw-2GiB.allocated_peak_over_cap", result.stdout)
        self.assertNotEqual(result.returncode, 0)

    def test_summary_passes_when_every_case_passed(self):
        reports = self.path("reports")
        os.mkdir(reports)
        subprocess.run([PYTHON, JUNIT, os.path.join(reports, "kit.xml"), "gpu_path", "kit"], check=True)
        result = self.summary(reports)
        self.assertEqual(result.stdout.splitlines()[-1], "tests: 1 passed, 0 failed")
        self.assertEqual(result.returncode, 0)

    def test_a_stage_that_failed_is_a_failed_case_with_its_log(self):
        reports = self.path("reports")
        os.mkdir(reports)
        with open(self.path("kit.log"), "w") as f:
            f.write("kit: over the 56 MiB a device call may carry\n")
        subprocess.run([PYTHON, JUNIT, os.path.join(reports, "kit.xml"), "gpu_path", "kit", "--failure", "exit 1",
                        "--log", self.path("kit.log")], check=True)
        result = self.summary(reports)
        self.assertEqual(result.stdout.splitlines()[-1], "tests: 0 passed, 1 failed")
        self.assertIn("FAILED", result.stdout)
        failure = ET.parse(os.path.join(reports, "kit.xml")).getroot().find(".//failure").get("message")
        self.assertIn("over the 56 MiB", failure)

    def test_an_unreadable_report_is_a_failure(self):
        reports = self.path("reports")
        os.mkdir(reports)
        with open(os.path.join(reports, "torn.xml"), "w") as f:
            f.write("<testsuites><testsuite><testcase name=")
        result = self.summary(reports)
        self.assertEqual(result.stdout.splitlines()[-1], "tests: 0 passed, 1 failed")
        self.assertIn("unreadable report", result.stdout)


if __name__ == "__main__":
    junit_main.main(argv=[sys.argv[0]])
