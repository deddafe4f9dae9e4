"""Tensors jobs end to end: a user's TorchScript model on a user's torch.save'd tensors, trained by
real fitrun-worker ranks (C++, DDP over Gloo) under the real fitrund that with_fitrund.sh started,
with its memory probe, on two capped virtual devices; and the gpt recommender on a ratings file.

The models and tensors are the examples tools/make_tensor_examples.py writes (a masked-residue
protein model on real globins, an mse regression), written into this test's directory.
"""

import argparse
import math
import os
import subprocess
import sys
import tempfile
import unittest

from fitrun.client import Client, ClientError
from jobs import run_to_end, state_name, wait_for
import junit_main

ADDRESS = None
RUNFILES = os.path.join(os.environ.get("TEST_SRCDIR", ""), os.environ.get("TEST_WORKSPACE", "fitrun"))
EXAMPLES = None  # where the examples are written, once
RATINGS = None
def protein_spec(name, **extra):
    spec = {
        "name": name,
        "model": {"torchscript": f"{EXAMPLES}/protein/model.pt"},
        "data": {"kind": "tensors", "path": f"{EXAMPLES}/protein/train.pt",
                 "test_path": f"{EXAMPLES}/protein/test.pt", "inputs": ["tokens"], "target": "target"},
        "loss": {"kind": "cross_entropy", "ignore_index": -100},
        "optimizer": {"kind": "adamw", "lr": 0.001, "weight_decay": 0.01},
        "global_batch_size": 32,
        "max_steps": 30,
        "resources": {"min_devices": 2, "max_devices": 2},
        "seed": 1,
    }
    spec.update(extra)
    return spec


def regression_spec(name, **extra):
    spec = {
        "name": name,
        "model": {"torchscript": f"{EXAMPLES}/regression/model.pt"},
        "data": {"kind": "tensors", "path": f"{EXAMPLES}/regression/data.pt"},
        "loss": "mse",
        "optimizer": {"kind": "adam", "lr": 0.003},
        "global_batch_size": 128,
        "max_steps": 80,
        "checkpoint": {"every_steps": 10},
        "resources": {"min_devices": 2, "max_devices": 2},
        "fault_tolerance": {"max_restarts": 1},
        "seed": 1,
    }
    spec.update(extra)
    return spec


class TensorsJobTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.client = Client(ADDRESS, timeout=30)

    def run_to_end(self, spec):
        return run_to_end(self.client, spec)

    def test_the_protein_model_trains_on_its_tensors_and_reports_masked_residue_accuracy(self):
        job, events = self.run_to_end(protein_spec("protein"))
        self.assertEqual(state_name(job), "SUCCEEDED", job.failure_reason)
        losses = [e.progress.loss for e in events if e.WhichOneof("event") == "progress" and e.progress.rank == 0]
        self.assertGreater(len(losses), 2)
        self.assertLess(losses[-1], losses[0] - 0.3, "the loss falls")
        self.assertTrue(job.result.has_test_accuracy)  # masked-residue accuracy on the test file
        self.assertGreater(job.result.test_accuracy, 0.1)
        self.assertIn("test_loss", job.result.metrics)
        self.assertTrue(any("calibrated" in r for r in job.plan.reasons), list(job.plan.reasons))

    def test_the_probes_prediction_is_within_ten_percent_of_a_capped_runs_peak(self):
        # The workload calibrated for ranks of up to 32 samples (planning asks for it; a submit would too).
        wide = protein_spec("protein-wide", global_batch_size=64)
        wait_for(lambda: any("calibrated" in r for r in self.client.plan(wide).plan.reasons), 120, "the calibration")
        # A per-device batch the doubling sweep does not measure: the plan's peak comes from the curve.
        spec = protein_spec("protein-at-7", global_batch_size=14, max_steps=4,
                            resources={"min_devices": 2, "max_devices": 2, "per_device_batch": 7})
        job, _ = self.run_to_end(spec)
        self.assertEqual(state_name(job), "SUCCEEDED", job.failure_reason)
        self.assertTrue(any("its peak is between the measured micro-batches" in r for r in job.plan.reasons),
                        list(job.plan.reasons))
        attempt = job.attempt_history[-1]
        self.assertGreater(attempt.measured_peak_bytes, 0)
        error = attempt.predicted_peak_bytes / attempt.measured_peak_bytes - 1
        print(f"protein at per-device batch 7: predicted {attempt.predicted_peak_bytes} bytes, "
              f"measured {attempt.measured_peak_bytes} ({100 * error:+.1f}%)")
        self.assertLessEqual(abs(error), 0.10)

    def test_an_oom_is_replanned_and_resumed_and_a_crash_replays_the_run_bit_for_bit(self):
        undisturbed, _ = self.run_to_end(regression_spec("regression"))
        self.assertEqual(state_name(undisturbed), "SUCCEEDED", undisturbed.failure_reason)
        self.assertIn("test_mse", undisturbed.result.metrics)

        crashed, _ = self.run_to_end(regression_spec(
            "regression-crash", fault_injection={"kind": "exit", "rank": 1, "at_step": 25, "exit_code": 7}))
        self.assertEqual(state_name(crashed), "SUCCEEDED", crashed.failure_reason)
        self.assertEqual(crashed.restarts, 1)
        # The same plan from the checkpoint of step 20: the undisturbed run, bit for bit.
        self.assertEqual(crashed.result.final_loss, undisturbed.result.final_loss)

        oom, events = self.run_to_end(regression_spec(
            "regression-oom", fault_injection={"kind": "oom", "rank": 1, "at_step": 25}))
        self.assertEqual(state_name(oom), "SUCCEEDED", oom.failure_reason)
        self.assertEqual(oom.oom_replans, 1)
        first, last = oom.attempt_history[0], oom.attempt_history[-1]
        self.assertLess(last.per_device_batch, first.per_device_batch)
        self.assertGreater(last.grad_accum_steps, first.grad_accum_steps)
        self.assertEqual(2 * last.per_device_batch * last.grad_accum_steps, 128)
        self.assertTrue(any(e.WhichOneof("event") == "oom" for e in events))
        # Resumed from step 20 with half batches accumulated: the same samples, rounded differently.
        self.assertEqual(oom.result.steps, 80)
        self.assertTrue(math.isclose(oom.result.final_loss, undisturbed.result.final_loss, rel_tol=0.05),
                        (oom.result.final_loss, undisturbed.result.final_loss))

    def test_the_gpt_recommender_reports_hr_and_ndcg_at_10(self):
        job, _ = self.run_to_end({
            "name": "gpt-recommender",
            "model": {"builtin": "gpt", "gpt": {"layers": 1, "heads": 2, "hidden": 32, "context": 20}},
            "data": {"kind": "movielens", "path": RATINGS},
            "optimizer": {"kind": "adam", "lr": 0.003},
            "global_batch_size": 64,
            "max_steps": 20,
            "resources": {"min_devices": 2, "max_devices": 2},
        })
        self.assertEqual(state_name(job), "SUCCEEDED", job.failure_reason)
        self.assertIn("hr@10", job.result.metrics)
        self.assertIn("ndcg@10", job.result.metrics)
        self.assertEqual(job.result.metrics["hr@10"], job.result.test_accuracy)

    def test_malformed_tensors_specs_are_refused_at_submit_and_nothing_is_stored(self):
        before = len(self.client.list())
        cases = [
            ("spec.data.target", protein_spec("bad", data={"kind": "tensors", "path": f"{EXAMPLES}/protein/train.pt",
                                                            "target": "labels"})),
            ("spec.loss", regression_spec("bad", loss="cross_entropy")),
            ("spec.data.path", regression_spec("bad", data={"kind": "tensors", "path": f"{EXAMPLES}/protein/model.pt"})),
        ]
        for field, spec in cases:
            with self.assertRaises(ClientError) as raised:
                self.client.submit(spec)
            self.assertEqual(raised.exception.code, "INVALID_ARGUMENT")
            self.assertIn(field, str(raised.exception))
        self.assertEqual(len(self.client.list()), before)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--address", required=True)
    args, rest = parser.parse_known_args()
    ADDRESS = args.address
    work = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
    EXAMPLES = os.path.join(work, "examples")
    RATINGS = os.path.join(work, "ratings.dat")
    subprocess.run(["/usr/bin/python3", os.path.join(RUNFILES, "tools/make_tensor_examples.py"), EXAMPLES], check=True)
    subprocess.run(["/usr/bin/python3", os.path.join(RUNFILES, "tools/make_movielens_sample.py"), RATINGS],
                   check=True, stdout=subprocess.DEVNULL)
    junit_main.main(argv=[sys.argv[0]] + rest)
