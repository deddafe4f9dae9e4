"""tools/bench/launch_phases.py in its short form (one run, 3 steps) against the real binaries: it must
print a figure for every milestone and every phase of every side it times, in the order a launch goes
through them, or the benchmark that docs/benchmarks.md quotes has rotted. Nothing here asserts a time.

    launch_phases_test.py BENCH.py
"""
import os
import subprocess
import sys
import unittest

import junit_main

RUNFILES = os.path.join(os.environ.get("TEST_SRCDIR", ""), os.environ.get("TEST_WORKSPACE", "fitrun"))
BENCH = ""


def table_after(output, heading):
    """The rows of the markdown table printed under the line starting with `heading`, as {side: cells}."""
    lines = output.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(heading))
    header = [c.strip() for c in lines[start + 1].strip("|").split("|")]
    rows = {}
    for line in lines[start + 3:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0]] = dict(zip(header[1:], cells[1:]))
    return rows


class LaunchPhasesTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        settings = "bare,secured,secured+warm" if os.geteuid() == 0 else "bare,bare+warm"
        done = subprocess.run([sys.executable, BENCH, "--short", f"--bin={RUNFILES}", f"--settings={settings}"],
                              capture_output=True, text=True, timeout=600)
        cls.output = done.stdout + done.stderr
        if done.returncode != 0:
            raise AssertionError(f"the benchmark exited {done.returncode}:\n{cls.output}")
        cls.settings = settings.split(",")
        cls.milestones = table_after(cls.output, "milestones")
        cls.phases = table_after(cls.output, "phases")

    def fitrun_sides(self):
        return [f"fitrun {s}, {n}" for s in self.settings for n in ("first", "second")]

    def test_every_side_is_timed(self):
        self.assertEqual(sorted(self.milestones), sorted(self.fitrun_sides() + ["PyTorch DDP, direct"]), self.output)
        self.assertEqual(sorted(self.phases), sorted(self.milestones), self.output)

    def test_each_fitrun_submit_reaches_every_milestone_in_launch_order(self):
        order = ["submitted", "launched", "ranks up", "first step", "end"]
        for side in self.fitrun_sides():
            times = [float(self.milestones[side][m]) for m in order]
            self.assertEqual(times, sorted(times), f"{side}: {self.milestones[side]}")
            for milestone in ("data loaded", "joined"):
                self.assertLessEqual(float(self.milestones[side][milestone]), float(self.milestones[side]["first step"]),
                                     side)
            self.assertRegex(self.milestones[side]["end vs PyTorch"], r"^[0-9.]+x$")

    def test_fitrund_and_the_ranks_report_each_phase(self):
        for side in self.fitrun_sides():
            row = self.phases[side]
            for phase in ("plan", "job directory", "spawn", "rank start", "data", "rendezvous"):
                self.assertGreaterEqual(float(row[phase]), 0.0, f"{side} {phase}: {row}")
            # Only an attempt confined to a cgroup has a cgroup phase.
            if side.startswith("fitrun secured"):
                self.assertGreaterEqual(float(row["cgroup"]), 0.0, f"{side}: {row}")
            else:
                self.assertEqual(row["cgroup"], "-", f"{side}: {row}")
            # A rank starts in well under a minute: a figure read in the wrong unit would not.
            self.assertLess(float(row["rank start"]), 60_000, f"{side}: {row}")

    def test_only_a_second_submit_with_warm_ranks_runs_on_them(self):
        for side in self.fitrun_sides():
            expected = "2" if side.endswith("+warm, second") else "0"
            self.assertEqual(self.phases[side]["warm ranks"], expected, f"{side}: {self.phases[side]}")

    def test_pytorch_reports_the_phases_it_has(self):
        row = self.phases["PyTorch DDP, direct"]
        for phase in ("rank start", "data", "rendezvous"):
            self.assertGreater(float(row[phase]), 0.0, row)
        for phase in ("warm ranks", "queue", "plan", "job directory", "cgroup", "spawn"):
            self.assertEqual(row[phase], "-", row)
        self.assertEqual(self.milestones["PyTorch DDP, direct"]["end vs PyTorch"], "1.00x")


if __name__ == "__main__":
    BENCH = os.path.join(RUNFILES, sys.argv.pop(1))
    junit_main.main()
