"""The rank side of the fitrun module (fitrun.init() / Run) against pipes, as fitrun-worker gives them,
and the Python mirror of the launch contract against the C++ header it mirrors."""

import json
import os
import re
import sys
import tempfile
import unittest

from fitrun import contract
from fitrun.run import Run
import junit_main

HEADER = os.path.join(os.environ.get("TEST_SRCDIR", ""), os.environ.get("TEST_WORKSPACE", "fitrun"),
                      "proto/contract/launch_contract.h")


def camel_to_constant(name):
    """kGradAccumSteps -> GRAD_ACCUM_STEPS, kExitOutOfMemory -> EXIT_OUT_OF_MEMORY."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name[1:]).upper()


class Supervised:
    """A Run wired to a report pipe and a control pipe, with the plan in its environment."""

    def __init__(self, **plan):
        self.reports_r, reports_w = os.pipe()
        control_r, self.control_w = os.pipe()
        env = {contract.RANK: "1", contract.WORLD_SIZE: "2", contract.PER_DEVICE_BATCH: "48",
               contract.GRAD_ACCUM_STEPS: "3", contract.LEARNING_RATE: "0.002", contract.MAX_STEPS: "100",
               contract.REPORT_FD: str(reports_w), contract.CONTROL_FD: str(control_r)}
        env.update(plan)
        self.run = Run(env)
        self._pending = b""

    def reports(self):
        self.run.flush()
        os.set_blocking(self.reports_r, False)
        try:
            self._pending += os.read(self.reports_r, 1 << 16)
        except BlockingIOError:
            pass
        *lines, self._pending = self._pending.split(b"\n")
        return [json.loads(line) for line in lines if line]


class RunTest(unittest.TestCase):
    def test_the_plan_comes_from_the_environment(self):
        run = Supervised().run
        self.assertEqual((run.rank, run.world_size), (1, 2))
        self.assertEqual((run.per_device_batch, run.grad_accum_steps, run.lr, run.max_steps), (48, 3, 0.002, 100))
        self.assertTrue(run.supervised)
        self.assertFalse(run.probe)
        outside = Run({})
        self.assertFalse(outside.supervised)
        outside.report(1, loss=0.5)  # reports nowhere, fails nowhere

    def test_progress_is_a_worker_report_in_json_and_a_report_without_samples_keeps_the_rate(self):
        fake = Supervised()
        fake.run.report(1, loss=2.5, samples=48)
        fake.run.report(2, loss=2.0, samples=48, metrics={"accuracy": 0.25})
        fake.run.report(2, metrics={"val_loss": 1.5})  # a final evaluation: no new samples
        first, second, final = (r["progress"] for r in fake.reports())
        self.assertEqual((first["rank"], first["step"], first["loss"], first["totalSteps"]), (1, 1, 2.5, 100))
        self.assertEqual(first["samplesPerSecond"], 0.0)  # nothing to measure a rate against yet
        self.assertGreater(second["samplesPerSecond"], 0.0)
        self.assertEqual(second["metrics"], {"accuracy": 0.25})
        self.assertEqual(final["samplesPerSecond"], second["samplesPerSecond"])
        self.assertEqual(final["metrics"], {"val_loss": 1.5})

    def test_a_stop_line_on_the_control_pipe_is_should_stop(self):
        fake = Supervised()
        self.assertFalse(fake.run.should_stop())
        os.write(fake.control_w, b"stop cancelled by the user\n")
        self.assertTrue(fake.run.should_stop())

    def test_checkpoints_are_saved_whole_on_rank_zero_and_the_newest_loads(self):
        directory = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
        rank1 = Supervised(**{contract.CHECKPOINT_DIR: directory}).run
        self.assertIsNone(rank1.save_checkpoint({"w": 1}, 5))  # only rank 0 writes
        rank0 = Supervised(**{contract.RANK: "0", contract.CHECKPOINT_DIR: directory})
        for step in (5, 10):
            path = rank0.run.save_checkpoint({"step": step}, step)
            self.assertTrue(os.path.exists(path))
        self.assertEqual(sorted(os.listdir(directory)), ["step-00000005.pt", "step-00000010.pt"])
        saved = [r["checkpointSaved"] for r in rank0.reports() if "checkpointSaved" in r]
        self.assertEqual([s["step"] for s in saved], [5, 10])
        self.assertEqual(rank1.load_latest_checkpoint(), ({"step": 10}, 10))
        probe = Supervised(**{contract.RANK: "0", contract.CHECKPOINT_DIR: directory, contract.PROBE: "1"}).run
        self.assertIsNone(probe.save_checkpoint({"step": 99}, 99))  # a memory probe leaves no checkpoint


class ContractTest(unittest.TestCase):
    def test_the_python_names_mirror_the_header(self):
        with open(HEADER) as f:
            header = f.read()
        strings = dict(re.findall(r'inline constexpr char (k\w+)\[\] = "([^"]+)";', header))
        codes = {name: int(value) for name, value in re.findall(r"(kExit\w+) = (\d+)", header)}
        self.assertGreater(len(strings), 20)
        self.assertEqual(len(codes), 5)
        # The parity test's dump variable is the worker's own, not part of a script's contract.
        strings.pop("kDumpInitialState")
        for name, value in list(strings.items()) + list(codes.items()):
            python_name = camel_to_constant(name)
            self.assertEqual(getattr(contract, python_name, None), value, f"contract.{python_name} vs {name}")


if __name__ == "__main__":
    junit_main.main(argv=[sys.argv[0]])
