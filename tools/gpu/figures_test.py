"""tools/gpu/figures.py's verdicts on job records, the GPU check's figures that a CPU rehearsal cannot
reach both ways: what a re-plan after an out-of-memory error must do, and what a first-seen script's
first run must leave on record.

    run_python_test.sh tools/gpu/figures_test.py FIGURES_PY   (a runfiles path)
"""
import json
import os
import subprocess
import sys
import tempfile
import unittest

import junit_main

RUNFILES = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIGURES = os.path.join(RUNFILES, sys.argv[1])
PYTHON = "/usr/bin/python3"


def attempt(batch, predicted=0, measured=0):
    return {"perDeviceBatch": str(batch), "predictedPeakBytes": str(predicted), "measuredPeakBytes": str(measured)}


class FiguresTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))

    def figures(self, command, job, events, *flags):
        """Runs figures.py COMMAND on a job record and its events (after its first progress); its rows as
        {figure: verdict's first word} and its exit status."""
        job_path, events_path = os.path.join(self.dir, "job.json"), os.path.join(self.dir, "events.jsonl")
        with open(job_path, "w") as f:
            json.dump({"state": "JOB_STATE_SUCCEEDED", "createdAt": "2026-11-29T04:00:00.000000001Z", **job}, f)
        events = [{"time": "2026-11-29T04:00:03Z", "progress": {"rank": 0, "step": 1}}] + events
        with open(events_path, "w") as f:
            f.writelines(json.dumps(e) + "\n" for e in events)
        done = subprocess.run([PYTHON, FIGURES, command, "4\tstep\tjob", job_path, events_path, *flags],
                              capture_output=True, text=True)
        rows = {fields[3]: fields[-1].split()[0] for fields in (line.split("\t") for line in done.stdout.splitlines())}
        return rows, done.returncode

    def replanned(self, attempts, recomputing):
        oom = [{"oom": {"capBytes": str(1 << 30)}},
               {"stateChanged": {"reason": "rank 0 ran out of memory (needed at least 1.00 GiB, the device has 1.00 GiB)"}}]
        return self.figures("oom_slice", {"attemptHistory": attempts,
                                          "plan": {"activationCheckpointing": recomputing}}, oom,
                            "--cap", str(1 << 30), "--rehearsal")

    def test_a_replan_after_an_oom_takes_a_smaller_batch_predicted_within_the_cap(self):
        rows, status = self.replanned([attempt(64, 5000), attempt(32, 26000)], recomputing=False)
        self.assertEqual(rows["per_device_batch_by_attempt"], "PASS")
        self.assertEqual(rows["replan_predicted_bytes"], "PASS")
        self.assertEqual(status, 0)

    def test_a_replan_may_keep_the_batch_only_by_recomputing_activations(self):
        rows, status = self.replanned([attempt(64, 5000), attempt(64, 2600)], recomputing=True)
        self.assertEqual((rows["per_device_batch_by_attempt"], status), ("PASS", 0))
        rows, status = self.replanned([attempt(64, 5000), attempt(64, 2600)], recomputing=False)
        self.assertEqual((rows["per_device_batch_by_attempt"], status), ("FAIL", 1))

    def test_a_replan_that_takes_a_larger_batch_or_predicts_past_the_cap_fails(self):
        rows, status = self.replanned([attempt(32, 5000), attempt(64, 2600)], recomputing=True)
        self.assertEqual((rows["per_device_batch_by_attempt"], status), ("FAIL", 1))
        rows, status = self.replanned([attempt(64, 5000), attempt(32, (1 << 30) + 1)], recomputing=False)
        self.assertEqual((rows["replan_predicted_bytes"], status), ("FAIL", 1))
        rows, status = self.replanned([attempt(64, 5000)], recomputing=False)
        self.assertEqual((rows["replan_predicted_bytes"], status), ("FAIL", 1))

    FIRST_STEPS = {"log": {"rank": -1, "text": "memory: attempt 1's first steps peaked at 3.6 MiB at per-device "
                                               "batch 64 (1.80 GiB usable); recorded for the plans after it; the "
                                               "plan keeps its batch"}}

    def test_a_first_seen_script_predicts_nothing_and_leaves_its_first_steps_peak(self):
        rows, status = self.figures("job", {"attemptHistory": [attempt(64, 0, 3745672)]}, [self.FIRST_STEPS],
                                    "--first-seen", "--rehearsal")
        self.assertEqual(rows["first_attempt_predicted_bytes"], "PASS")
        self.assertEqual(rows["first_steps_peak_bytes"], "PASS")
        self.assertNotIn("predicted_over_reported_peak", rows)
        self.assertEqual(status, 0)

    def test_a_first_run_with_a_prediction_or_without_its_peak_fails(self):
        rows, status = self.figures("job", {"attemptHistory": [attempt(64, 4000000, 3745672)]}, [self.FIRST_STEPS],
                                    "--first-seen", "--rehearsal")
        self.assertEqual((rows["first_attempt_predicted_bytes"], status), ("FAIL", 1))
        rows, status = self.figures("job", {"attemptHistory": [attempt(64, 0, 3745672)]}, [], "--first-seen",
                                    "--rehearsal")
        self.assertEqual((rows["first_steps_peak_bytes"], status), ("FAIL", 1))

    def test_a_second_submit_is_held_against_its_reported_peak(self):
        rows, status = self.figures("job", {"attemptHistory": [attempt(64, 3900000, 3745672)]}, [], "--rehearsal")
        self.assertEqual((rows["predicted_over_reported_peak"], status), ("PASS", 0))
        rows, status = self.figures("job", {"attemptHistory": [attempt(64, 0, 3745672)]}, [], "--rehearsal")
        self.assertEqual((rows["predicted_over_reported_peak"], status), ("FAIL", 1))


if __name__ == "__main__":
    junit_main.main(argv=[sys.argv[0]])
