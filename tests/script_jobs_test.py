"""Script jobs end to end: the real fitrund (with its memory probe) that script_jobs_test.sh started,
real fitrun-worker supervisors, real /usr/bin/python3 ranks on Gloo, through the Python client.

Each test submits its own job to the daemon's two virtual CPU devices and waits on the job's state,
never on fixed times.
"""

import argparse
import os
import sys
import time
import unittest

from fitrun.client import Client, ClientError, FINAL_STATES
from jobs import run_to_end, state_name, wait_for
import junit_main

ADDRESS = None
STATE_DIR = None
SCRIPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts")


def script_spec(name, args, **extra):
    spec = {
        "name": name,
        "script": {"command": ["/usr/bin/python3", "toy_train.py"] + args, "working_dir": SCRIPTS,
                   "env": {"OMP_NUM_THREADS": "1"}},
        "global_batch_size": 16,
        "optimizer": {"lr": 0.001},
        "resources": {"min_devices": 2, "max_devices": 2},
        "fault_tolerance": {"max_restarts": 1, "stop_grace_seconds": 3},
    }
    spec.update(extra)
    return spec


def command_of(pid):
    """A process's executable (its argv[0])."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().split(b"\0")[0].decode(errors="replace")
    except OSError:
        return ""


def processes_of(job_id):
    """Pids of every process (supervisor or script) of a job: they carry its FITRUN_JOB_ID."""
    found = []
    needle = f"FITRUN_JOB_ID={job_id}".encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    found.append(int(entry))
        except OSError:
            pass
    return found


class ScriptJobTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.client = Client(ADDRESS, timeout=30)

    def run_to_end(self, spec):
        return run_to_end(self.client, spec)

    def test_two_ranks_report_progress_and_succeed(self):
        job, events = self.run_to_end(script_spec("two-ranks", ["--steps", "4"]))
        self.assertEqual(state_name(job), "SUCCEEDED", job.failure_reason)
        ranks = {e.progress.rank for e in events if e.WhichOneof("event") == "progress"}
        self.assertEqual(ranks, {0, 1}, "progress from both ranks")
        steps = [e.progress for e in events if e.WhichOneof("event") == "progress" and e.progress.step == 4]
        self.assertTrue(steps and all(p.loss > 0 and p.peak_bytes > 0 for p in steps), steps)
        self.assertTrue(any("batch" in p.metrics for p in steps), "the script's own metrics arrive")
        self.assertEqual(job.plan.per_device_batch * job.plan.grad_accum_steps * 2, 16)
        # Nothing measured it before: its first run is its measurement, at the largest batch.
        self.assertTrue(any("its first run is its measurement" in r for r in job.plan.reasons), list(job.plan.reasons))
        self.assertEqual(job.plan.per_device_batch, 8)
        self.assertGreater(job.attempt_history[-1].measured_peak_bytes, 0)
        logs = [e.log.text for e in events if e.WhichOneof("event") == "log"]
        self.assertTrue(any("first steps peaked at" in t for t in logs), logs[-20:])
        # The next submit of the same script is planned on what that run measured.
        plan = self.client.plan(script_spec("two-ranks", ["--steps", "4"])).plan
        self.assertTrue(any("measured by its runs" in r for r in plan.reasons), list(plan.reasons))
        self.assertGreater(plan.predicted.total_bytes, job.attempt_history[-1].measured_peak_bytes)

    def test_an_unchanged_torchrun_script_succeeds(self):
        spec = script_spec("plain-torchrun", [], max_steps=3)
        spec["script"]["command"] = ["/usr/bin/python3", "plain_torchrun.py", "--steps", "3"]
        spec["script"]["batch_flag"] = "--batch_size"
        job, events = self.run_to_end(spec)
        self.assertEqual(state_name(job), "SUCCEEDED", job.failure_reason)
        exits = [e.rank_exited for e in events if e.WhichOneof("event") == "rank_exited"]
        self.assertEqual(sorted(x.rank for x in exits if x.exit_code == 0), [0, 1])
        logs = "".join(self.client.logs(job.id, rank=0))
        self.assertIn(f"rank 0 step 3 loss", logs)
        # What the script prints reaches its watchers too, as torchrun shows it, from each rank.
        shown = {(e.log.rank, e.log.text) for e in events if e.WhichOneof("event") == "log"}
        for rank in (0, 1):
            self.assertTrue(any(r == rank and t.startswith(f"rank {rank} step 3 loss") for r, t in shown), shown)
        # It reported no progress, so the job's peak is the one its supervisors read at the end.
        self.assertGreater(job.attempt_history[-1].measured_peak_bytes, 0)
        self.assertEqual(job.result.steps, 0)

    def test_an_out_of_memory_error_is_replanned_and_the_script_resumes_from_its_checkpoint(self):
        job, events = self.run_to_end(script_spec("oom-replan", ["--steps", "6", "--oom_at_step", "4"]))
        self.assertEqual(state_name(job), "SUCCEEDED", job.failure_reason)
        self.assertGreaterEqual(job.oom_replans, 1)
        first, last = job.attempt_history[0], job.attempt_history[-1]
        self.assertLess(last.per_device_batch, first.per_device_batch)
        self.assertGreater(last.grad_accum_steps, first.grad_accum_steps)
        self.assertEqual(last.per_device_batch * last.grad_accum_steps, first.per_device_batch * first.grad_accum_steps)
        ooms = [e.oom for e in events if e.WhichOneof("event") == "oom"]
        self.assertTrue(ooms)
        # As the script saw it: in step 4 (after it reported step 3), asking for more than was left.
        self.assertEqual(ooms[0].step, 4, ooms[0])
        self.assertGreater(ooms[0].requested_bytes, ooms[0].cap_bytes - ooms[0].live_bytes, ooms[0])
        self.assertIn("ran out of memory at step 4", first.outcome)
        logs = [e.log.text for e in events if e.WhichOneof("event") == "log"]
        self.assertTrue(any("resumed from the checkpoint of step 3" in t for t in logs), logs[-20:])

    def test_a_script_saving_to_its_own_checkpoint_directory_succeeds(self):
        # No probe runs first (its first run measures it); where one runs, after out-of-memory errors,
        # it gets every variable of the launch contract, a scratch FITRUN_CHECKPOINT_DIR among them
        # (the tower below is probed so, and saves checkpoints).
        job, events = self.run_to_end(script_spec("own-checkpoints", ["--steps", "3", "--own_checkpoints"]))
        self.assertEqual(state_name(job), "SUCCEEDED", job.failure_reason)
        self.assertFalse(any("measuring memory" in e.state_changed.reason for e in events
                             if e.WhichOneof("event") == "state_changed"), "no probe before its first run")

    def test_a_script_that_applies_the_strategy_recomputes_where_only_that_fits_and_resumes_after_an_oom(self):
        # A tower whose kept activations need more than a 512 MiB device at batch 1: its first run
        # (batch 2, keeping them) runs out of memory at once, so the probe measures it both ways, the
        # plan recomputes at batch 2 (the error said nothing of recomputing), the pinned ZeRO stage
        # shards the states over both ranks, and an OOM at step 3 of that attempt re-plans a smaller
        # batch, still recomputing, from its last checkpoint.
        def tower(name, **script):
            spec = script_spec(name, [], global_batch_size=4)
            spec["script"].update(command=["/usr/bin/python3", "tower_train.py", "--steps", "4", "--depth", "44",
                                           "--oom_at_step", "3", "--oom_on_attempt", "2"],
                                  applies_strategy=True, **script)
            spec["ddp"] = {"zero_stage": 1}
            # Its 4-8 MiB tensors would come from glibc's heap once its mmap threshold rises, and a
            # freed heap stays resident: host memory several times the live bytes, past the rank's
            # cgroup (its device + 2 GiB). A fixed threshold returns each tensor's pages when freed.
            spec["script"]["env"]["MALLOC_MMAP_THRESHOLD_"] = "131072"
            return spec

        forbidden, _ = self.run_to_end(tower("tower-kept", activation_checkpointing=False))
        self.assertEqual(state_name(forbidden), "FAILED")
        self.assertIn("even a per-device batch of 1 does not fit", forbidden.failure_reason)

        job, events = self.run_to_end(tower("tower"))
        self.assertEqual(state_name(job), "SUCCEEDED", job.failure_reason)
        self.assertTrue(job.plan.activation_checkpointing)
        self.assertEqual(job.plan.zero_stage, 1)
        reasons = "\n".join(job.plan.reasons)
        self.assertIn("because without it even per-device batch 1 needs", reasons)
        self.assertIn("the script recomputes them (FITRUN_ACTIVATION_CHECKPOINTING=1)", reasons)
        self.assertIn("the script shards them (FITRUN_ZERO_STAGE=1)", reasons)
        self.assertEqual(job.oom_replans, 2)
        first, recomputing, last = job.attempt_history[0], job.attempt_history[1], job.attempt_history[-1]
        self.assertEqual((first.per_device_batch, recomputing.per_device_batch, last.per_device_batch), (2, 2, 1))
        self.assertEqual(last.per_device_batch * last.grad_accum_steps, first.per_device_batch * first.grad_accum_steps)
        logs = "".join(self.client.logs(job.id, rank=1))
        self.assertIn("activation checkpointing True, optimizer ZeroRedundancyOptimizer", logs)
        # From the newest checkpoint rank 0 finished writing before the ranks were stopped (step 2, or 1).
        shown = [e.log.text for e in events if e.WhichOneof("event") == "log"]
        self.assertTrue(any("resumed from the checkpoint of step" in t for t in shown), shown[-20:])
        self.assertEqual(job.result.steps, 4)

    def test_fifos_at_guessable_tmp_names_cannot_hold_a_script_job(self):
        # Any account may create files in /tmp. Supervisors and probes once passed a script's memory
        # figures through /tmp/fitrun-script-peak-<pid> and /tmp/fitrun-probe-peak-<pid>-<batch>
        # (written through "<name>.tmp"): FIFOs squatting those names for the pids the next processes
        # get blocked the script at its exit and the job held its devices. The figures now travel
        # through a descriptor (the memory meter), so the same squat changes nothing.
        with open("/proc/sys/kernel/ns_last_pid") as f:
            next_pid = int(f.read()) + 1
        squatted = []
        try:
            for pid in range(next_pid, next_pid + 3000):
                names = [f"/tmp/fitrun-script-peak-{pid}"] + [f"/tmp/fitrun-probe-peak-{pid}-{b}" for b in (1, 8, 3)]
                for name in names:
                    for path in (name, name + ".tmp"):
                        try:
                            os.mkfifo(path)
                            squatted.append(path)
                        except FileExistsError:
                            pass
            job_id = self.client.submit(script_spec("squatted", ["--steps", "2"]))
            job = wait_for(lambda: (lambda j: j if j.state in FINAL_STATES else None)(self.client.get(job_id)),
                           180, "the job to end beside the squatted names")
            self.assertEqual(state_name(job), "SUCCEEDED", job.failure_reason)
            self.assertGreater(job.attempt_history[-1].measured_peak_bytes, 0, "the figures came through")
        finally:
            for path in squatted:
                os.unlink(path)

    def test_a_script_that_keeps_failing_fails_after_max_restarts_with_its_log_tail(self):
        job, _ = self.run_to_end(script_spec("keeps-failing", ["--fail"]))
        self.assertEqual(state_name(job), "FAILED")
        self.assertEqual(job.restarts, 1)
        self.assertIn("failing on purpose", job.failure_reason)

    def test_bad_commands_are_refused_naming_the_field_and_nothing_is_stored(self):
        before = len(self.client.list())
        cases = [
            ("spec.script.command[0]", {"command": ["no-such-program-xyz", "toy_train.py"]}),
            ("spec.script.command[1]", {"command": ["/usr/bin/python3", "missing.py"]}),
            ("spec.script.working_dir", {"working_dir": "/no/such/dir"}),
        ]
        for field, change in cases:
            spec = script_spec("refused", [])
            spec["script"].update(change)
            with self.assertRaises(ClientError) as raised:
                self.client.submit(spec)
            self.assertEqual(raised.exception.code, "INVALID_ARGUMENT")
            self.assertIn(field, str(raised.exception))
        self.assertEqual(len(self.client.list()), before)

    def test_a_script_that_ignores_the_batch_runs(self):
        # Its run is its measurement: a script that takes its batch from its own flags trains as it
        # does under torchrun (only the probe, after out-of-memory errors, finds that its memory does
        # not follow the plan's batch: memory_calibration_test).
        args = ["--steps", "2", "--ignore_fitrun_batch", "--batch_size", "8"]
        job, _ = self.run_to_end(script_spec("ignores-batch", args))
        self.assertEqual(state_name(job), "SUCCEEDED", job.failure_reason)
        fixed = script_spec("ignores-batch-fixed", args)
        fixed["resources"]["per_device_batch"] = 8
        job, _ = self.run_to_end(fixed)
        self.assertEqual(state_name(job), "SUCCEEDED", job.failure_reason)
        self.assertEqual(job.plan.per_device_batch, 8)

    def test_cancel_stops_every_rank_within_the_grace(self):
        job_id = self.client.submit(script_spec("cancelled", ["--steps", "100000", "--step_seconds", "0.2"]))
        def running():
            job = self.client.get(job_id)
            self.assertNotIn(job.state, FINAL_STATES, job.failure_reason)
            return job.last_progress.step >= 2

        wait_for(running, 240, "progress")
        self.assertGreaterEqual(len(processes_of(job_id)), 4, "two supervisors and two scripts")
        # The ranks are fitrun-supervisor, which loads no LibTorch beside the script's own torch.
        supervisors = [pid for pid in processes_of(job_id) if command_of(pid).endswith("fitrun-supervisor")]
        self.assertEqual(len(supervisors), 2, [command_of(pid) for pid in processes_of(job_id)])
        cancelled_at = time.monotonic()
        self.client.cancel(job_id, "test")
        wait_for(lambda: state_name(self.client.get(job_id)) == "CANCELLED", 30, "CANCELLED")
        wait_for(lambda: not processes_of(job_id), 10, "every process of the job to exit")
        # Every rank ended as stopped (exit 143) or by fitrund's SIGTERM, none by crashing on the way
        # (a supervisor that deadlocked on the stop command died of SIGABRT).
        # fitrund records each rank's exit once it has reaped it, a moment after the process is gone.
        def exits():
            return [e.rank_exited for e in self.client.watch(job_id) if e.WhichOneof("event") == "rank_exited"]

        wait_for(lambda: len(exits()) == 2, 10, "a rank_exited event per rank")
        exited = exits()
        self.assertEqual(sorted(x.rank for x in exited), [0, 1], "one rank_exited event per rank")
        for x in exited:
            self.assertTrue(x.exit_code == 143 or x.signal == 15, x)
        for rank in (0, 1):
            self.assertNotIn("deadlock", "".join(self.client.logs(job_id, rank=rank)))
        self.assertLess(time.monotonic() - cancelled_at, 3 + 2, "within the stop grace (3 s) and a margin")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--address", required=True)
    args, rest = parser.parse_known_args()
    ADDRESS = args.address
    junit_main.main(argv=[sys.argv[0]] + rest)
