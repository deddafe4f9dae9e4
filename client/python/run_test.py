"""The rank side of the fitrun module (fitrun.init() / Run) against pipes, as fitrun-worker gives them,
and the Python mirror of the launch contract against the C++ header it mirrors."""

import json
import os
import re
import sys
import tempfile
import types
import unittest
from unittest import mock

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


class FakeCuda:
    """torch.cuda as the module reads it: GPUs whose allocator figures a test sets."""

    OutOfMemoryError = type("OutOfMemoryError", (RuntimeError,), {})

    def __init__(self, devices=1):
        self.devices = devices
        self.peak = 0
        self.live = 0
        self.fraction = None

    def is_available(self):
        return True

    def is_initialized(self):
        return True

    def device_count(self):
        return self.devices

    def current_device(self):
        return 0

    def max_memory_allocated(self, device=None):
        return self.peak

    def memory_allocated(self, device=None):
        return self.live

    def memory_stats(self, device=None):
        return {"allocated_bytes.all.current": self.live, "allocated_bytes.all.peak": self.peak,
                "reserved_bytes.all.peak": 2 * self.peak}

    def mem_get_info(self, device=None):
        return (1 << 30, 80 << 30)

    def get_device_properties(self, device):
        return types.SimpleNamespace(total_memory=80 << 30)

    def set_per_process_memory_fraction(self, fraction, device):
        self.fraction = (fraction, device)


def fake_torch(cuda):
    return types.SimpleNamespace(cuda=cuda, __file__="fake torch")


class GpuTest(unittest.TestCase):
    """The module on a GPU, with a fake torch.cuda in sys.modules."""

    def setUp(self):
        self.cuda = FakeCuda()
        patcher = mock.patch.dict(sys.modules, {"torch": fake_torch(self.cuda)})
        patcher.start()
        self.addCleanup(patcher.stop)
        self.peak_file = os.path.join(tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR")), "peak")

    def probe(self, device_kind):
        return Supervised(**{contract.RANK: "0", contract.WORLD_SIZE: "1", contract.PROBE: "1",
                             contract.DEVICE_KIND: device_kind, contract.MEMORY_PEAK_FILE: self.peak_file}).run

    def read_peak_file(self):
        with open(self.peak_file) as f:
            return [int(x) for x in f.read().split()]

    def test_a_probe_on_a_gpu_writes_torch_cudas_allocated_peak(self):
        run = self.probe(contract.DEVICE_KIND_CUDA)
        self.cuda.peak, self.cuda.live = 300 << 20, 40 << 20
        run.report(1, loss=1.0, samples=8)
        self.cuda.peak, self.cuda.live = 200 << 20, 50 << 20  # the script reset torch.cuda's peak itself
        run.write_probe_peak()
        self.assertEqual(self.read_peak_file(), [300 << 20, 50 << 20])
        self.cuda.peak = 900 << 20
        run.write_probe_peak()  # at exit again: the figure stands
        self.assertEqual(self.read_peak_file(), [300 << 20, 50 << 20])

    def test_an_out_of_memory_in_a_gpu_probe_writes_the_refused_request(self):
        run = self.probe(contract.DEVICE_KIND_CUDA)
        self.cuda.peak, self.cuda.live = 700 << 20, 600 << 20
        run.write_probe_peak(requested=256 << 20)
        self.assertEqual(self.read_peak_file(), [700 << 20, 600 << 20, 256 << 20, 600 << 20])

    def test_a_probe_on_the_host_leaves_the_peak_file_to_the_preloaded_allocator(self):
        run = self.probe(contract.DEVICE_KIND_CPU)
        self.cuda.peak = 300 << 20
        run.report(1)
        run.write_probe_peak()
        self.assertFalse(os.path.exists(self.peak_file))
        training = Supervised(**{contract.DEVICE_KIND: contract.DEVICE_KIND_CUDA,
                                 contract.MEMORY_PEAK_FILE: self.peak_file}).run
        training.write_probe_peak()  # not a probe: the job's own run reports its progress instead
        self.assertFalse(os.path.exists(self.peak_file))

    def test_a_slices_cap_binds_the_ranks_own_gpu_among_those_it_sees(self):
        self.cuda.devices = 2  # fitrun-worker leaves the job's GPUs visible, in local-rank order
        Supervised(**{contract.LOCAL_RANK: "1", contract.MEMORY_CAP_BYTES: str(20 << 30)})
        self.assertEqual(self.cuda.fraction, (0.25, 1))
        self.cuda.devices = 1  # ranks sharing a GPU see only their own
        Supervised(**{contract.LOCAL_RANK: "1", contract.MEMORY_CAP_BYTES: str(20 << 30)})
        self.assertEqual(self.cuda.fraction, (0.25, 0))


class ContractTest(unittest.TestCase):
    def test_the_python_names_mirror_the_header(self):
        with open(HEADER) as f:
            header = f.read()
        strings = dict(re.findall(r'inline constexpr char (k\w+)\[\] = "([^"]+)";', header))
        codes = {name: int(value) for name, value in re.findall(r"(kExit\w+) = (\d+)", header)}
        self.assertGreater(len(strings), 20)
        self.assertEqual(len(codes), 5)
        # The parity test's dump variable and the all-reduce switch are the worker's own, not part of
        # a script's contract.
        for name in ("kDumpInitialState", "kAllReduce", "kAllReduceOverGloo"):
            strings.pop(name)
        for name, value in list(strings.items()) + list(codes.items()):
            python_name = camel_to_constant(name)
            self.assertEqual(getattr(contract, python_name, None), value, f"contract.{python_name} vs {name}")


if __name__ == "__main__":
    junit_main.main(argv=[sys.argv[0]])
