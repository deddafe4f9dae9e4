"""The rank side of a script job: the plan fitrun chose, and reports back to it.

fitrun-supervisor (or fitrun-worker, where no supervisor is installed) supervises each rank of a
script job. It hands the script the plan in the environment
(contract.py) and two pipes: JSON lines written to the report descriptor reach the coordinator as the
rank's progress, logs and checkpoints (each line is a fitrun.v1.WorkerReport in protobuf's JSON
mapping); "stop <reason>" lines on the control descriptor are the coordinator's StopCommand. Outside
fitrun (plain torchrun, or python train.py) the same calls work and report nowhere.

Reporting never blocks training: lines queue and a background thread writes them, several at once.
"""

import atexit
import ctypes
import json
import os
import queue
import re
import select
import struct
import sys
import threading
import time

from fitrun import contract

_run = None


def init():
    """The plan for this rank (once per process; later calls return the same Run)."""
    global _run
    if _run is None:
        _run = Run(os.environ)
    return _run


def _int(env, name, default=None):
    value = env.get(name, "")
    return int(value) if value.strip() else default


def _float(env, name, default=None):
    value = env.get(name, "")
    return float(value) if value.strip() else default


class _Memory:
    """The device's live and peak bytes: the preloaded capped allocator on a virtual CPU device,
    torch.cuda's counters on a GPU, nothing otherwise."""

    def __init__(self):
        self._lib = None
        try:
            lib = ctypes.CDLL(None)
            for name in ("fitrun_memory_live", "fitrun_memory_peak", "fitrun_memory_cap",
                         "fitrun_memory_last_failed_request", "fitrun_memory_live_at_last_failure"):
                getattr(lib, name).restype = ctypes.c_int64
            self._lib = lib
        except (OSError, AttributeError):
            self._lib = None

    def reset_peak(self):
        if self._lib is not None:
            self._lib.fitrun_memory_reset_peak()

    def gpu_peaks(self):
        """On a GPU: (reserved peak, the device's memory in use) in bytes, the latter the driver's
        whole figure (this process and any other); (0, 0) elsewhere."""
        torch = sys.modules.get("torch")
        if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
            return (0, 0)
        device = torch.cuda.current_device()
        free, total = torch.cuda.mem_get_info(device)
        return (torch.cuda.memory_stats(device).get("reserved_bytes.all.peak", 0), total - free)

    def cuda_allocated(self):
        """(peak, live) bytes torch.cuda's caching allocator handed out over every GPU this process
        sees; None where torch.cuda is not in use."""
        torch = sys.modules.get("torch")
        if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
            return None
        devices = range(torch.cuda.device_count())
        return (sum(torch.cuda.max_memory_allocated(d) for d in devices),
                sum(torch.cuda.memory_allocated(d) for d in devices))

    def cuda_device_figures(self):
        """On a GPU, for an out-of-memory report: what the caching allocator had reserved, and the
        device's free and total memory as the driver sees them (every process's); {} elsewhere."""
        torch = sys.modules.get("torch")
        if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
            return {}
        device = torch.cuda.current_device()
        free, total = torch.cuda.mem_get_info(device)
        reserved = torch.cuda.memory_stats(device).get("reserved_bytes.all.current", 0)
        return {"reservedBytes": int(reserved), "deviceFreeBytes": int(free), "deviceTotalBytes": int(total)}

    def figures(self):
        """(live, peak, cap, refused request, live at the refusal) in bytes; zeros where unknown."""
        if self._lib is not None:
            return (self._lib.fitrun_memory_live(), self._lib.fitrun_memory_peak(), self._lib.fitrun_memory_cap(),
                    self._lib.fitrun_memory_last_failed_request(), self._lib.fitrun_memory_live_at_last_failure())
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
            device = torch.cuda.current_device()
            stats = torch.cuda.memory_stats(device)
            total = torch.cuda.get_device_properties(device).total_memory
            return (stats.get("allocated_bytes.all.current", 0), stats.get("allocated_bytes.all.peak", 0), total, 0, 0)
        return (0, 0, 0, 0, 0)


def _requested_bytes(message):
    """The size an out-of-memory message says was asked for ("Tried to allocate 256.00 MiB", or the
    capped allocator's "tried to allocate 268435456 bytes"); 0 when it names none."""
    match = re.search(r"[Tt]ried to allocate (\d+(?:\.\d+)?) ?(GiB|MiB|KiB|bytes|B)", message)
    if not match:
        return 0
    scale = {"GiB": 1 << 30, "MiB": 1 << 20, "KiB": 1 << 10}.get(match.group(2), 1)
    return int(float(match.group(1)) * scale)


def _is_out_of_memory(error):
    if isinstance(error, MemoryError):
        return True
    torch = sys.modules.get("torch")
    oom_type = getattr(getattr(torch, "cuda", None), "OutOfMemoryError", None) if torch else None
    if oom_type is not None and isinstance(error, oom_type):
        return True
    return isinstance(error, RuntimeError) and "out of memory" in str(error).lower()


class _CudaMeter:
    """Writes torch.cuda's figures into the supervisor's memory meter (proto/contract/memory_meter.h,
    the METER_* offsets of contract.py): the allocated peak (sampled at each write too, since a script
    may reset torch.cuda's peak statistics itself), live bytes, a refused request, the reserved peak
    and the device's memory in use at its highest."""

    def __init__(self, fd, memory):
        self._fd = fd
        self._memory = memory
        self._peak = 0
        self._device_peak = 0
        self._refused = (0, 0)

    def write(self, refused=0):
        if self._fd is None:
            return
        allocated = self._memory.cuda_allocated()
        if allocated is None:
            return
        self._peak = max(self._peak, allocated[0])
        reserved, device = self._memory.gpu_peaks()
        self._device_peak = max(self._device_peak, device)
        if refused:
            self._refused = (refused, allocated[1])
        figures = {contract.METER_PEAK: self._peak, contract.METER_LIVE: allocated[1],
                   contract.METER_REFUSED: self._refused[0], contract.METER_LIVE_AT_REFUSAL: self._refused[1],
                   contract.METER_WRITER: contract.METER_WRITER_CUDA_MODULE,
                   contract.METER_RESERVED_PEAK: reserved, contract.METER_DEVICE_PEAK: self._device_peak}
        try:
            for offset, value in figures.items():
                os.pwrite(self._fd, struct.pack("<q", int(value)), offset)
        except OSError as error:
            print(f"fitrun: cannot write the memory meter: {error}", file=sys.stderr)
            self._fd = None


class Run:
    """One rank's view of its job: the plan (attributes) and the calls that report to fitrun."""

    def __init__(self, env):
        self.rank = _int(env, contract.RANK, 0)
        self.local_rank = _int(env, contract.LOCAL_RANK, self.rank)
        self.world_size = _int(env, contract.WORLD_SIZE, 1)
        self.per_device_batch = _int(env, contract.PER_DEVICE_BATCH)
        self.grad_accum_steps = _int(env, contract.GRAD_ACCUM_STEPS, 1)
        self.lr = _float(env, contract.LEARNING_RATE)
        self.global_batch_size = _int(env, contract.GLOBAL_BATCH_SIZE)
        self.max_steps = _int(env, contract.MAX_STEPS)
        self.checkpoint_dir = env.get(contract.CHECKPOINT_DIR) or None
        self.probe = env.get(contract.PROBE) == "1"
        # The plan's strategy (a script whose spec sets applies_strategy is asked to take it).
        self.activation_checkpointing = env.get(contract.ACTIVATION_CHECKPOINTING) == "1"
        self.zero_stage = _int(env, contract.ZERO_STAGE, 0)
        self.precision = env.get(contract.PRECISION) or "fp32"
        self.device_kind = env.get(contract.DEVICE_KIND) or None
        self.job_id = env.get(contract.JOB_ID) or None
        self.attempt = _int(env, contract.ATTEMPT, 0)
        self._memory = _Memory()
        self._memory_cap = _int(env, contract.MEMORY_CAP_BYTES, 0)
        # On a GPU nothing is preloaded to count the script's tensors (they are CUDA tensors the CPU
        # allocator never sees), so this module writes torch.cuda's figures into the supervisor's
        # memory meter: at each report, after an out-of-memory error, and at exit.
        self._meter = None
        if self.device_kind == contract.DEVICE_KIND_CUDA:
            self._meter = _CudaMeter(_int(env, contract.MEMORY_METER_FD), self._memory)
            atexit.register(self._meter.write)
        self._stop_reason = None
        self._step = 0
        self._last_report = None
        self._rate = 0.0
        self._reports = None
        self._control = None
        report_fd = _int(env, contract.REPORT_FD)
        control_fd = _int(env, contract.CONTROL_FD)
        if report_fd is not None:
            self._reports = queue.Queue(maxsize=1024)
            self._report_file = os.fdopen(report_fd, "w", buffering=1)
            self._writer = threading.Thread(target=self._write_reports, name="fitrun-reports", daemon=True)
            self._writer.start()
            atexit.register(self.flush)
        self._apply_memory_cap()
        if control_fd is not None:
            os.set_blocking(control_fd, False)
            self._control = control_fd
        self._install_oom_hook()

    @property
    def supervised(self):
        """True when fitrun's supervisor supervises this process (reports reach the coordinator)."""
        return self._reports is not None

    def memory(self):
        """This rank's device memory in bytes, as counted (zeros where it is not): live, peak, cap."""
        live, peak, cap = self._memory.figures()[:3]
        return {"live": live, "peak": peak, "cap": self._memory_cap or cap}

    # The plan's strategy.

    def apply_strategy(self, model, optimizer, blocks=None):
        """Trains `model` and `optimizer` as the plan says (call once, after building both, before the
        first step; build an lr scheduler on the optimizer this returns): recomputes `blocks` (by
        default the model's largest ModuleList or Sequential of one module type) in backward when
        FITRUN_ACTIVATION_CHECKPOINTING is 1, shards the optimizer states with torch's
        ZeroRedundancyOptimizer when FITRUN_ZERO_STAGE is 1, autocasts the forward to FITRUN_PRECISION
        bf16 or fp16 (fp16's loss scaling is the script's own). Returns (model, optimizer); with
        nothing asked, the same two. Save the optimizer with run.optimizer_state_dict(optimizer)."""
        from fitrun import strategy

        return strategy.apply(model, optimizer, activation_checkpointing=self.activation_checkpointing,
                              zero_stage=self.zero_stage, precision=self.precision, blocks=blocks)

    def optimizer_state_dict(self, optimizer):
        """The optimizer's whole state for a checkpoint: on rank 0 its state_dict(), gathered from
        every rank when sharded (every rank must call this then); None on the other ranks."""
        from fitrun import strategy

        return strategy.optimizer_state_dict(optimizer)

    # Reports.

    def report(self, step, loss=None, samples=None, total_steps=None, epoch=None, metrics=None):
        """Progress after an optimizer step. `samples`: samples this rank processed since its previous
        report (samples/s is computed here); `metrics`: the script's own figures by name."""
        now = time.monotonic()
        if samples:
            if self._last_report is not None and now > self._last_report:
                self._rate = samples / (now - self._last_report)
            self._last_report = now
        # A report of no new samples (a final evaluation's metrics) keeps the rate of the last one.
        rate = self._rate
        self._step = step
        if self._meter is not None:
            self._meter.write()
        live, peak = self._memory.figures()[:2]
        progress = {"rank": self.rank, "step": int(step), "liveBytes": live, "peakBytes": peak,
                    "samplesPerSecond": rate}
        reserved, device = self._memory.gpu_peaks()
        if reserved:
            self._device_peak = max(getattr(self, "_device_peak", 0), device)
            progress.update(reservedPeakBytes=reserved, devicePeakBytes=self._device_peak)
        if loss is not None:
            progress["loss"] = float(loss)
        total = total_steps if total_steps is not None else self.max_steps
        if total:
            progress["totalSteps"] = int(total)
        if epoch is not None:
            progress["epoch"] = int(epoch)
        if metrics:
            progress["metrics"] = {str(k): float(v) for k, v in metrics.items()}
        self._send({"progress": progress})

    def log(self, text):
        self._send({"log": {"rank": self.rank, "text": str(text)}})

    def checkpoint_saved(self, step, path):
        """Tells fitrun (and anyone watching) that a checkpoint of `step` is complete at `path`."""
        size = os.path.getsize(path) if os.path.exists(path) else 0
        self._send({"checkpointSaved": {"rank": self.rank, "step": int(step), "path": str(path), "bytes": size}})

    # Checkpoints in FITRUN_CHECKPOINT_DIR, which outlives the job's attempts.

    def save_checkpoint(self, obj, step):
        """Rank 0 writes `obj` with torch.save as the checkpoint of `step` (a temporary file renamed
        into place, so a reader never sees half of one) and reports it; other ranks, probes and runs
        without a checkpoint directory do nothing. Returns the path or None."""
        if self.rank != 0 or self.probe or not self.checkpoint_dir:
            return None
        import torch

        os.makedirs(self.checkpoint_dir, exist_ok=True)
        path = os.path.join(self.checkpoint_dir, f"step-{int(step):08d}.pt")
        partial = path + ".partial"
        with open(partial, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(partial, path)
        self.checkpoint_saved(step, path)
        for older in self._checkpoints()[2:]:
            os.remove(older[1])
        return path

    def latest_checkpoint(self):
        """The newest complete checkpoint's path, or None."""
        found = self._checkpoints()
        return found[0][1] if found else None

    def load_latest_checkpoint(self, map_location="cpu"):
        """(obj, step) of the newest checkpoint that loads, or (None, 0)."""
        import torch

        for step, path in self._checkpoints():
            try:
                return torch.load(path, map_location=map_location), step
            except Exception as error:  # a damaged file: fall back to the one before
                self.log(f"skipping checkpoint {path}: {error}")
        return None, 0

    def _checkpoints(self):
        if not self.checkpoint_dir or not os.path.isdir(self.checkpoint_dir):
            return []
        found = []
        for name in os.listdir(self.checkpoint_dir):
            if name.startswith("step-") and name.endswith(".pt"):
                try:
                    found.append((int(name[5:-3]), os.path.join(self.checkpoint_dir, name)))
                except ValueError:
                    pass
        return sorted(found, reverse=True)

    # Stopping.

    def should_stop(self):
        """True once the coordinator asked this job to stop (cancel, a peer's failure): save what is
        worth saving and exit. Cheap enough to call every step."""
        if self._stop_reason is None and self._control is not None:
            try:
                ready, _, _ = select.select([self._control], [], [], 0)
                if ready:
                    data = os.read(self._control, 4096).decode(errors="replace")
                    for line in data.splitlines():
                        if line.startswith("stop"):
                            self._stop_reason = line[4:].strip() or "stopped"
            except OSError:
                pass
        return self._stop_reason is not None

    # The device's cap.

    def _apply_memory_cap(self):
        """On a GPU slice, the cap binds torch.cuda's caching allocator (its per-process limit); on a
        virtual CPU device the preloaded allocator enforces it, and a torch it cannot see is said so."""
        if not self._memory_cap:
            return
        torch = sys.modules.get("torch")
        if torch is None:
            try:
                import torch  # noqa: F811  the script's own, whichever it is
            except ImportError:
                return
        if torch.cuda.is_available():
            # The rank's own GPU: index LOCAL_RANK among the job's GPUs that fitrun-worker leaves
            # visible, or the one GPU it sees when it sees only its own.
            count = torch.cuda.device_count()
            device = self.local_rank if 0 <= self.local_rank < count else torch.cuda.current_device()
            total = torch.cuda.get_device_properties(device).total_memory
            torch.cuda.set_per_process_memory_fraction(min(1.0, self._memory_cap / total), device)
            return
        before = self._memory.figures()[0]
        probe = torch.empty(1 << 16, dtype=torch.uint8)
        counted = self._memory.figures()[0] - before >= 1 << 16
        del probe
        self._memory.reset_peak()  # the check's tensor is not the script's
        if not counted:
            self.log(f"fitrun: this process's torch ({getattr(torch, '__file__', '?')}) is not the LibTorch "
                     f"libfitrun_memory.so was built for, so the device's {self._memory_cap}-byte cap is not "
                     "enforced here; run the script with the python3 whose torch is Debian's python3-torch")

    # Out of memory, wherever it happens.

    def _install_oom_hook(self):
        previous = sys.excepthook

        def hook(kind, error, traceback):
            previous(kind, error, traceback)
            if _is_out_of_memory(error):
                self.report_out_of_memory(error)
                if self._meter is not None:
                    self._meter.write(refused=_requested_bytes(str(error)))
                self.flush()
                sys.stderr.flush()
                os._exit(contract.EXIT_OUT_OF_MEMORY)

        sys.excepthook = hook

    def report_out_of_memory(self, error=None):
        """What the coordinator re-plans from, as the script saw it: the step it was in (the one after
        the last it reported; 0 before any), the batch, the request that failed and the device's figures."""
        live, peak, cap, requested, live_at_failure = self._memory.figures()
        # A GPU slice's cap, not the whole GPU's memory: what the rank was allowed.
        cap = self._memory_cap or cap
        if not requested and error is not None:
            requested = _requested_bytes(str(error))
        step = self._step + 1 if self._step else 0
        oom = {"rank": self.rank, "step": step, "perDeviceBatch": self.per_device_batch or 0,
               "requestedBytes": requested, "liveBytes": live_at_failure or live, "peakBytes": peak, "capBytes": cap}
        oom.update(self._memory.cuda_device_figures())
        self._send({"oom": oom})
        if error is not None:
            self.log(f"out of memory: {error}")

    # The writer.

    def _send(self, report):
        if self._reports is None:
            return
        try:
            self._reports.put_nowait(json.dumps(report))
        except queue.Full:
            pass  # progress is dropped rather than slowing training

    def _write_reports(self):
        while True:
            lines = [self._reports.get()]
            while True:
                try:
                    lines.append(self._reports.get_nowait())
                except queue.Empty:
                    break
            try:
                self._report_file.write("".join(line + "\n" for line in lines))
                self._report_file.flush()
            except (OSError, ValueError):
                return
            finally:
                for _ in lines:
                    self._reports.task_done()

    def flush(self, timeout=2.0):
        """Waits (at most `timeout` seconds) until everything reported was written."""
        if self._reports is None:
            return
        deadline = time.monotonic() + timeout
        while self._reports.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.01)
