"""The rank side of the fitrun module (fitrun.init() / Run) against pipes, as fitrun-worker gives them,
and the Python mirror of the launch contract against the C++ header it mirrors."""

import json
import os
import re
import struct
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
METER_HEADER = os.path.join(os.path.dirname(HEADER), "memory_meter.h")


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
    """The module on a GPU, with a fake torch.cuda in sys.modules, writing the supervisor's memory
    meter (a memfd page, as the supervisor makes it)."""

    def setUp(self):
        self.cuda = FakeCuda()
        patcher = mock.patch.dict(sys.modules, {"torch": fake_torch(self.cuda)})
        patcher.start()
        self.addCleanup(patcher.stop)
        self.meter_fd = os.memfd_create("meter")
        os.ftruncate(self.meter_fd, 4096)
        self.addCleanup(os.close, self.meter_fd)

    def rank(self, device_kind, **plan):
        plan.update({contract.DEVICE_KIND: device_kind, contract.MEMORY_METER_FD: str(self.meter_fd)})
        return Supervised(**plan)

    def meter(self):
        """(peak, live, refused, live at the refusal, writer, reserved peak, device peak)."""
        return struct.unpack_from("<7q", os.pread(self.meter_fd, 56, 0))

    def test_a_rank_on_a_gpu_writes_torch_cudas_figures_into_its_meter_at_each_report_and_at_exit(self):
        run = self.rank(contract.DEVICE_KIND_CUDA).run
        self.cuda.peak, self.cuda.live = 300 << 20, 40 << 20
        run.report(1, loss=1.0, samples=8)
        self.assertEqual(self.meter()[:5], (300 << 20, 40 << 20, 0, 0, contract.METER_WRITER_CUDA_MODULE))
        self.assertEqual(self.meter()[5:], (600 << 20, (80 << 30) - (1 << 30)))
        self.cuda.peak, self.cuda.live = 200 << 20, 50 << 20  # the script reset torch.cuda's peak itself
        run._meter.write()  # as at exit
        self.assertEqual(self.meter()[:2], (300 << 20, 50 << 20), "the peak stands")

    def test_an_out_of_memory_on_a_gpu_writes_the_refused_request_and_names_the_slices_cap(self):
        fake = self.rank(contract.DEVICE_KIND_CUDA, **{contract.MEMORY_CAP_BYTES: str(2 << 30)})
        self.cuda.peak, self.cuda.live = 700 << 20, 600 << 20
        fake.run.report_out_of_memory(self.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 256.00 MiB"))
        fake.run._meter.write(refused=256 << 20)
        self.assertEqual(self.meter()[:4], (700 << 20, 600 << 20, 256 << 20, 600 << 20))
        oom = [r["oom"] for r in fake.reports() if "oom" in r][0]
        # The slice's cap, not the whole GPU's 80 GiB: the job hears about its slice; and what the
        # driver saw of the whole device then.
        self.assertEqual(oom["capBytes"], 2 << 30)
        self.assertEqual(oom["requestedBytes"], 256 << 20)
        self.assertEqual((oom["deviceFreeBytes"], oom["deviceTotalBytes"]), (1 << 30, 80 << 30))

    def test_on_the_host_the_meter_is_the_preloaded_allocators(self):
        run = self.rank(contract.DEVICE_KIND_CPU).run
        self.cuda.peak = 300 << 20
        run.report(1)
        self.assertEqual(self.meter(), (0,) * 7, "the module leaves a CPU rank's meter alone")

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

    def test_the_memory_meters_layout_mirrors_its_header(self):
        with open(METER_HEADER) as f:
            header = f.read()
        self.assertEqual(contract.MEMORY_METER_FD,
                         re.search(r'kMemoryMeterFd\[\] = "([^"]+)"', header).group(1))
        writers = dict(re.findall(r"kWriter(\w+) = (\d+);", header))
        self.assertEqual(contract.METER_WRITER_CPU_ALLOCATOR, int(writers["CpuAllocator"]))
        self.assertEqual(contract.METER_WRITER_CUDA_MODULE, int(writers["CudaModule"]))
        # The fields in their order, each 8 bytes: the offsets contract.py names.
        fields = re.findall(r"std::atomic<int64_t> (\w+);", header)
        self.assertEqual(fields, ["peak_bytes", "live_bytes", "refused_bytes", "live_at_refusal", "writer",
                                  "reserved_peak_bytes", "device_peak_bytes"])
        offsets = [contract.METER_PEAK, contract.METER_LIVE, contract.METER_REFUSED, contract.METER_LIVE_AT_REFUSAL,
                   contract.METER_WRITER, contract.METER_RESERVED_PEAK, contract.METER_DEVICE_PEAK]
        self.assertEqual(offsets, [8 * i for i in range(len(fields))])


if __name__ == "__main__":
    junit_main.main(argv=[sys.argv[0]])
