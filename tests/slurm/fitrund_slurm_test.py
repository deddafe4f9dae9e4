"""fitrund --cluster=slurm against a real Slurm cluster (tests/slurm/cluster.py: Debian's munged, slurmctld
and three slurmd on this machine), with real fitrun-worker ranks started by sbatch, srun and the rank shim:

- a 2-node x 2-rank built-in job succeeds, all four ranks reporting, with the loss curve of the same
  job on one node of four devices;
- an unchanged torchrun script runs across two nodes;
- an out-of-memory error on the second node's rank is re-planned and resumed in a new allocation;
- cancelling a running 2-node job leaves no Slurm job and no rank process within the stop grace;
- while one job's sbatch hangs (a wrapper holds it), a second job is submitted and watched, and jobs
  and devices are read, all answered at once: fitrund launches with its lock released;
- a job Slurm keeps pending shows Slurm's reason (the API and `fitrun get`), then runs when it can;
- a SIGKILLed fitrund, restarted on its state directory and address, re-adopts its Slurm job;
- `scancel` from outside fails the attempt and the job resumes from its checkpoint in a new one;
- as root with users, a user's job is submitted as their Unix account (a throwaway one): Slurm runs
  it as that account, whose files in the shared directory are its own;
- start-up errors: a bad --slurm_virtual_devices, an unreachable slurmctld, and a multi-node spec
  without --shared_dir.

One cluster (three nodes of four CPUs) for the whole file; every test starts its own fitrund with a
shared directory of its own under /tmp (jobs' batch scripts, rank logs and checkpoints; the state
directory inside it), and ends with no Slurm job queued and no process of its jobs left. Each fitrund
offers four virtual 512 MiB devices per node (--slurm_virtual_devices=4x512MiB) and skips the memory
probe. Skipped only when the Slurm daemons are not installed. The daemons' and fitrunds' logs go to
the test's undeclared outputs.
"""

import os
import re
import shutil
import subprocess
import sys
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

from accounts import install_for_accounts, token_line, useradd, userdel  # noqa: E402
from cluster import SEARCH_PATH, SlurmCluster, free_port, pid_alive, short_directory, skip_unless_installed  # noqa: E402
from fitrun.client import Client, ClientError, FINAL_STATES  # noqa: E402
from jobs import Fitrund, state_name, wait_for  # noqa: E402
import junit_main  # noqa: E402

RUNFILES = os.path.join(os.environ.get("TEST_SRCDIR", ""), os.environ.get("TEST_WORKSPACE", "fitrun"))
CLI = os.path.join(RUNFILES, "client/fitrun")
# The test scripts' own folder (runfiles link to it): fitrund checks a script's real path.
SCRIPTS = os.path.dirname(os.path.realpath(os.path.join(os.path.dirname(HERE), "scripts", "plain_torchrun.py")))
FASHION_MNIST = "/usr/share/datasets/fashion-mnist"
STOP_GRACE_SECONDS = 3
# Every fitrund here: Slurm's nodes, four virtual devices on each, no memory probe.
SLURM_FLAGS = ["--cluster=slurm", "--slurm_virtual_devices=4x512MiB", "--memory_probe=false"]


def keep(path, name):
    """Copies a file or directory into the test's undeclared outputs (when Bazel runs it)."""
    outputs = os.environ.get("TEST_UNDECLARED_OUTPUTS_DIR")
    if not outputs or not os.path.exists(path):
        return
    if os.path.isdir(path):
        shutil.copytree(path, os.path.join(outputs, name), dirs_exist_ok=True)
    else:
        shutil.copy(path, os.path.join(outputs, name))


def mlp_spec(name, devices, max_steps=20, **resources):
    return {
        "name": name,
        "model": {"builtin": "mlp"},
        "data": {"kind": "fashion_mnist", "path": FASHION_MNIST},
        "optimizer": {"kind": "sgd", "lr": 0.05, "momentum": 0.9},
        "global_batch_size": 256,
        "max_steps": max_steps,
        "seed": 1,
        "resources": {"min_devices": devices, "max_devices": devices, **resources},
        "fault_tolerance": {"max_restarts": 1, "stop_grace_seconds": STOP_GRACE_SECONDS},
    }


def events_of(events, kind):
    return [getattr(e, kind) for e in events if e.WhichOneof("event") == kind]


def logs_of(events):
    return [e.log.text for e in events if e.WhichOneof("event") == "log"]


def slurm_id(attempt):
    """The Slurm job id of an AttemptRecord ("slurm:42" -> "42")."""
    handle = attempt.launch_handle
    if not re.fullmatch(r"slurm:\d+", handle):
        raise AssertionError(f"attempt {attempt.attempt}: launch handle {handle!r} is not slurm:<id>")
    return handle.split(":", 1)[1]


class FitrundOnSlurmTest(unittest.TestCase):
    """One 3-node cluster for the class; each test has its own fitrund and shared directory."""

    @classmethod
    def setUpClass(cls):
        skip_unless_installed()
        cls.workdir = short_directory("slurm-")
        started = time.monotonic()
        # Four CPUs per node: one node can hold the four ranks the 2-node job is compared against.
        cls.cluster = SlurmCluster(cls.workdir, nodes=3, cpus_per_node=4, real_memory_mib=4096)
        try:
            cls.cluster.start()
        except BaseException:
            keep(cls.cluster.log_dir, "cluster-logs")
            shutil.rmtree(cls.workdir, ignore_errors=True)
            raise
        print(f"cluster of 3 nodes idle in {time.monotonic() - started:.2f} s", file=sys.stderr)

    @classmethod
    def tearDownClass(cls):
        cls.cluster.stop()
        keep(cls.cluster.log_dir, "cluster-logs")
        shutil.rmtree(cls.workdir, ignore_errors=True)

    def setUp(self):
        self.started = time.monotonic()
        self.shared = short_directory("fitrun-")
        self.daemons = []
        self.accounts = []  # throwaway accounts whose Slurm jobs tearDown cancels too

    def tearDown(self):
        for daemon in self.daemons:
            daemon.stop()
            keep(daemon.log_path, f"{self.id().rsplit('.', 1)[-1]}-fitrund.log")
        # Whatever a failed test left: no later test may find it.
        for user in [str(os.getuid()), *self.accounts]:
            self.cluster.run(["scancel", "--user", user], check=False)
        wait_for(lambda: not self.queue(), 30, "the Slurm queue to empty")
        self.cluster.wait_idle()
        shutil.rmtree(self.shared, ignore_errors=True)
        print(f"{self.id().rsplit('.', 1)[-1]}: {time.monotonic() - self.started:.1f} s", file=sys.stderr)

    # --- Helpers --------------------------------------------------------------------------------

    def start_fitrund(self, flags=(), shared=True, listen="127.0.0.1:0", env=None, state_dir=None, worker=None):
        """A fitrund on this cluster with the test's shared directory (or none); None address when it
        exited instead of serving."""
        state_dir = state_dir or os.path.join(self.shared, "state")
        daemon = Fitrund(state_dir, [*SLURM_FLAGS, *([f"--shared_dir={self.shared}"] if shared else []), *flags],
                         listen=listen, env=env or self.cluster.env, jobs_dir=os.path.join(self.shared, "jobs"),
                         data_roots=f"{FASHION_MNIST},{SCRIPTS}", worker=worker)
        self.daemons.append(daemon)
        return daemon

    def serving_fitrund(self, flags=()):
        daemon = self.start_fitrund(flags)
        self.assertIsNotNone(daemon.address, daemon.log())
        return daemon, Client(daemon.address, timeout=30)

    def queue(self):
        """Slurm job ids queued, running or completing (squeue's default states)."""
        return self.cluster.run(["squeue", "--noheader", "--format=%i"]).stdout.split()

    def slurm_jobs_of(self, job_id):
        """Every Slurm job this test's fitrund submitted for `job_id` that slurmctld still knows, in
        any state: named fitrun-<job id>, working in an attempt directory under the shared directory."""
        out = self.cluster.run(["squeue", "--noheader", "--states=all", f"--name=fitrun-{job_id}",
                                "--format=%i|%T|%Z"]).stdout
        fields = [line.split("|") for line in out.splitlines() if line.strip()]
        return [(i, state) for i, state, workdir in fields if workdir.startswith(self.shared + "/")]

    def job_processes(self, job_id):
        """Live pids of fitrun job `job_id` of this test (batch script, srun, shims, ranks): their
        environment carries its FITRUN_JOB_ID and an assignment under the test's shared directory."""
        job = f"FITRUN_JOB_ID={job_id}".encode()
        assignment = f"FITRUN_ASSIGNMENT={self.shared}/".encode()
        found = []
        for pid in map(int, filter(str.isdigit, os.listdir("/proc"))):
            try:
                with open(f"/proc/{pid}/environ", "rb") as f:
                    environ = f.read().split(b"\0")
            except OSError:
                continue
            if job in environ and any(v.startswith(assignment) for v in environ) and pid_alive(pid):
                found.append(pid)
        return found

    def assert_nothing_left(self, job_id, slurm_jobs=(), timeout=30):
        """Within `timeout` s: no Slurm job queued, no process of `job_id`, and none of Slurm's step
        daemons of `slurm_jobs` (its Slurm job ids)."""
        def left():
            return {"queued": self.queue(), "processes": self.job_processes(job_id),
                    "slurmstepd": [p for i in slurm_jobs for p in self.cluster.job_processes(i)]}
        try:
            wait_for(lambda: not any(left().values()), timeout, f"nothing of {job_id} left")
        except AssertionError:
            self.fail(f"{job_id}: left after {timeout} s: {left()}")

    def wait_end(self, client, job_id, timeout=180):
        return wait_for(lambda: (lambda j: j if j.state in FINAL_STATES else None)(client.get(job_id)), timeout,
                        f"{job_id} to end")

    def run_job(self, client, spec, timeout=180):
        """Submits `spec` and follows it to its end: (the ended Job, its events)."""
        job_id = client.submit(spec)
        events = list(client.watch(job_id))
        return self.wait_end(client, job_id, timeout), events

    def explain(self, daemon, job):
        return f"{state_name(job)}: {job.failure_reason}\n--- fitrund.log (tail)\n{daemon.log()[-4000:]}"

    def wait_progress(self, client, job_id, step, timeout=120):
        def reached():
            job = client.get(job_id)
            self.assertNotIn(job.state, FINAL_STATES, job.failure_reason)
            return job if job.last_progress.step >= step else None
        return wait_for(reached, timeout, f"{job_id} to reach step {step}")

    # --- Tests ----------------------------------------------------------------------------------

    def test_two_nodes_of_two_ranks_succeed_with_the_loss_curve_of_one_node_of_four(self):
        daemon, client = self.serving_fitrund()
        # Submitted together: they fit side by side (2 of n1's and n2's devices, then n3's four).
        across = client.submit(mlp_spec("two-nodes", 4, min_nodes=2))
        single = client.submit(mlp_spec("one-node", 4, max_nodes=1))
        runs = {}
        for job_id in (across, single):
            events = list(client.watch(job_id))
            job = self.wait_end(client, job_id)
            self.assertEqual(state_name(job), "SUCCEEDED", self.explain(daemon, job))
            runs[job_id] = (job, events)

        (job_a, events_a), (job_b, events_b) = runs[across], runs[single]
        self.assertEqual(len(job_a.plan.nodes), 2, job_a.plan)
        self.assertEqual(len(set(job_a.plan.nodes)), 2, job_a.plan)
        self.assertEqual(job_a.plan.devices_per_node, 2)
        self.assertEqual(len(job_b.plan.nodes), 1, job_b.plan)
        self.assertEqual(job_b.plan.devices_per_node, 4)
        for job in (job_a, job_b):
            self.assertEqual(len(job.plan.device_ids), 4)
            self.assertEqual(job.plan.per_device_batch * job.plan.grad_accum_steps * 4, 256)
            self.assertEqual(job.attempts, 1)
            slurm_id(job.attempt_history[0])
        self.assertEqual({p.rank for p in events_of(events_a, "progress")}, {0, 1, 2, 3},
                         "progress from every rank of both nodes")

        def rank0_losses(events):
            return {p.step: p.loss for p in events_of(events, "progress") if p.rank == 0}
        losses_a, losses_b = rank0_losses(events_a), rank0_losses(events_b)
        common = sorted(set(losses_a) & set(losses_b))
        # Steps 1 and the last are always reported; in between, whatever the throttle let through.
        self.assertTrue({1, 20} <= set(common), (sorted(losses_a), sorted(losses_b)))
        for step in common:
            self.assertAlmostEqual(losses_a[step], losses_b[step], delta=1e-4, msg=f"step {step}")
        self.assertAlmostEqual(job_a.result.final_loss, job_b.result.final_loss, delta=1e-4)
        print(f"rank 0's loss at steps {common}: 2x2 {[round(losses_a[s], 5) for s in common]}, "
              f"1x4 {[round(losses_b[s], 5) for s in common]}", file=sys.stderr)
        self.assert_nothing_left(across)
        self.assert_nothing_left(single)

    def test_an_unchanged_torchrun_script_runs_across_two_nodes(self):
        daemon, client = self.serving_fitrund()
        spec = {
            "name": "plain-torchrun",
            "script": {"command": ["/usr/bin/python3", "plain_torchrun.py", "--steps", "3"],
                       "working_dir": SCRIPTS, "env": {"OMP_NUM_THREADS": "1"},
                       "batch_flag": "--batch_size"},
            "global_batch_size": 16,
            "max_steps": 3,
            "optimizer": {"lr": 0.001},
            "resources": {"min_devices": 2, "max_devices": 2, "min_nodes": 2},
            "fault_tolerance": {"max_restarts": 0, "stop_grace_seconds": STOP_GRACE_SECONDS},
        }
        job, events = self.run_job(client, spec)
        self.assertEqual(state_name(job), "SUCCEEDED", self.explain(daemon, job))
        self.assertEqual(len(set(job.plan.nodes)), 2, job.plan)
        slurm_id(job.attempt_history[0])
        exits = events_of(events, "rank_exited")
        self.assertEqual(sorted(x.rank for x in exits if x.exit_code == 0), [0, 1], exits)
        for rank in (0, 1):
            self.assertIn(f"rank {rank} step 3 loss", "".join(client.logs(job.id, rank=rank)))
        self.assert_nothing_left(job.id)

    def test_an_out_of_memory_error_on_one_node_is_replanned_in_a_new_allocation(self):
        daemon, client = self.serving_fitrund()
        spec = mlp_spec("oom", 4, max_steps=12, min_nodes=2)
        # Rank 0 writes step 4's checkpoint before step 5's all-reduce, so it is whole when rank 2 runs
        # out of memory at step 6. (A checkpoint due just before the fault may be cut short: every rank
        # is stopped at once.)
        spec["checkpoint"] = {"every_steps": 4}
        spec["fault_injection"] = {"kind": "oom", "rank": 2, "at_step": 6}
        job, events = self.run_job(client, spec)
        self.assertEqual(state_name(job), "SUCCEEDED", self.explain(daemon, job))
        self.assertEqual(job.oom_replans, 1)
        self.assertEqual(len(job.attempt_history), 2, job.attempt_history)
        first, second = job.attempt_history
        self.assertNotEqual(slurm_id(first), slurm_id(second), "the new plan has an allocation of its own")
        self.assertEqual([(o.rank, o.step) for o in events_of(events, "oom")], [(2, 6)])
        # Rank 2 is the second node's first rank.
        nodes = [d.split("/")[0] for d in first.device_ids]
        self.assertEqual(len(set(nodes)), 2, first.device_ids)
        self.assertNotEqual(nodes[2], nodes[0], first.device_ids)
        self.assertLess(second.per_device_batch, first.per_device_batch)
        self.assertEqual(second.per_device_batch * second.grad_accum_steps,
                         first.per_device_batch * first.grad_accum_steps)
        self.assertEqual(len({d.split("/")[0] for d in second.device_ids}), 2, second.device_ids)
        logs = logs_of(events)
        self.assertTrue(any("resumed from the checkpoint of step 4" in t for t in logs), logs[-40:])
        self.assert_nothing_left(job.id)

    def test_cancel_leaves_no_slurm_job_and_no_rank_within_the_stop_grace(self):
        daemon, client = self.serving_fitrund()
        job_id = client.submit(mlp_spec("cancelled", 2, max_steps=100000, min_nodes=2))
        self.wait_progress(client, job_id, 2)
        job = client.get(job_id)
        self.assertEqual(len(set(job.plan.nodes)), 2, job.plan)
        self.assertGreaterEqual(len(self.job_processes(job_id)), 2, "the job's ranks, before the cancel")
        slurm_job = slurm_id(job.attempt_history[-1])
        self.assertEqual(self.queue(), [slurm_job])

        cancelled_at = time.monotonic()
        client.cancel(job_id, "test")
        wait_for(lambda: state_name(client.get(job_id)) == "CANCELLED", STOP_GRACE_SECONDS + 10, "CANCELLED")
        self.assert_nothing_left(job_id, [slurm_job], timeout=STOP_GRACE_SECONDS + 5)
        took = time.monotonic() - cancelled_at
        self.assertLess(took, STOP_GRACE_SECONDS + 5, "within the stop grace and a margin")
        print(f"cancelled: no Slurm job and no rank {took:.1f} s after the cancel", file=sys.stderr)

    def test_a_stalled_sbatch_holds_up_no_other_call(self):
        """fitrund starts an attempt's ranks with its lock released: while one job's sbatch hangs, a
        second job is submitted and watched, and jobs and devices are read, all answered at once."""
        gate = os.path.join(self.shared, "sbatch-gate")
        os.makedirs(gate)
        # The first sbatch waits for the test's word (15 s at most, under fitrund's 20 s timeout for
        # it), then runs the real one; any later sbatch runs at once.
        with open(os.path.join(gate, "sbatch"), "w") as wrapper:
            wrapper.write(f"""#!/bin/sh
if mkdir "{gate}/entered" 2>/dev/null; then
  i=0
  while [ ! -e "{gate}/release" ] && [ $i -lt 150 ]; do sleep 0.1; i=$((i + 1)); done
fi
exec {shutil.which("sbatch", path=SEARCH_PATH)} "$@"
""")
        os.chmod(os.path.join(gate, "sbatch"), 0o755)
        env = dict(self.cluster.env)
        env["PATH"] = f"{gate}:{env.get('PATH', '')}"
        daemon = self.start_fitrund(env=env)
        self.assertIsNotNone(daemon.address, daemon.log())
        client = Client(daemon.address, timeout=30)
        held = client.submit(mlp_spec("held", 2))
        wait_for(lambda: os.path.isdir(os.path.join(gate, "entered")), 60, "the held job's sbatch to start")

        asked = time.monotonic()
        second = client.submit(mlp_spec("second", 2))
        watch = client.watch(second)
        first_event = next(watch)
        watch.close()
        listed = {job.id: state_name(job) for job in client.list()}
        held_job = client.get(held)
        devices = client.devices()
        answered = time.monotonic() - asked

        # All of it while the sbatch still hangs: the held job is still being launched.
        self.assertFalse(os.path.exists(os.path.join(gate, "release")))
        self.assertEqual(state_name(held_job), "PLANNING", self.explain(daemon, held_job))
        self.assertEqual(held_job.attempts, 1, "its attempt is on record from the reservation")
        self.assertEqual(state_name(client.get(held)), "PLANNING", "still launching after the calls")
        self.assertTrue(first_event.HasField("state_changed"), first_event)
        self.assertEqual(state_name(client.get(second)), "QUEUED", "queued behind the launch in progress")
        self.assertEqual(set(listed), {held, second})
        self.assertEqual(len([d for d in devices if d.job_id == held]), 2, "its devices are held while it launches")
        self.assertLess(answered, 10, "the calls were answered while the sbatch hung, not after it")
        print(f"while an sbatch hung: submit, watch, list, get and devices answered in {answered:.2f} s",
              file=sys.stderr)

        open(os.path.join(gate, "release"), "w").close()
        for job_id in (held, second):
            job = self.wait_end(client, job_id)
            self.assertEqual(state_name(job), "SUCCEEDED", self.explain(daemon, job))
            self.assertEqual(job.attempts, 1)
        self.assert_nothing_left(held)
        self.assert_nothing_left(second)

    def test_a_pending_allocation_shows_slurms_reason_until_it_runs(self):
        daemon, client = self.serving_fitrund()
        outside = self.cluster.run(["sbatch", "--parsable", "--exclusive", "--nodes=3", "--output=/dev/null",
                                    "--wrap=sleep 300"]).stdout.strip().split(";")[0]
        wait_for(lambda: self.cluster.job(outside)["JobState"] == "RUNNING", 30, "the outside job to run")

        job_id = client.submit(mlp_spec("pending", 2, max_steps=10, min_nodes=2))

        def pending_with_slurms_reason():
            job = client.get(job_id)
            self.assertNotIn(job.state, FINAL_STATES, job.failure_reason)
            shown = re.fullmatch(r"PENDING \((.+)\)", job.allocation_status)
            if not shown or not job.attempt_history:
                return None
            theirs = self.cluster.run(["squeue", "--noheader", "--format=%r", "-j",
                                       slurm_id(job.attempt_history[-1])]).stdout.strip()
            return (job, shown.group(1)) if shown.group(1) == theirs and theirs != "None" else None
        job, reason = wait_for(pending_with_slurms_reason, 30, "the allocation to be PENDING with Slurm's reason")
        shown = subprocess.run([CLI, f"--coordinator={daemon.address}", "get", job_id], capture_output=True,
                               text=True, timeout=30)
        self.assertEqual(shown.returncode, 0, shown.stderr)
        self.assertIn(f"allocation: PENDING ({reason})", shown.stdout)
        print(f"pending behind an exclusive job: {state_name(job)}, allocation {job.allocation_status}",
              file=sys.stderr)

        self.cluster.run(["scancel", outside])
        job = self.wait_end(client, job_id)
        self.assertEqual(state_name(job), "SUCCEEDED", self.explain(daemon, job))
        self.assertEqual(job.attempts, 1)
        self.assertNotIn("PENDING", job.allocation_status)
        self.assert_nothing_left(job_id)

    def test_a_sigkilled_fitrund_restarted_on_its_state_re_adopts_its_slurm_job(self):
        daemon, client = self.serving_fitrund()
        job_id = client.submit(mlp_spec("re-adopted", 2, max_steps=300, min_nodes=2))
        self.wait_progress(client, job_id, 3)
        address = daemon.address
        daemon.kill()  # SIGKILL: no --stop_workers_on_exit, the ranks keep training
        self.assertTrue(self.job_processes(job_id), "the job's processes survive fitrund's SIGKILL")

        restarted = self.start_fitrund(listen=address)  # the same port: the ranks dial it back
        self.assertEqual(restarted.address, address, restarted.log())
        client = Client(address, timeout=30)
        job = self.wait_end(client, job_id)
        self.assertEqual(state_name(job), "SUCCEEDED", self.explain(restarted, job))
        self.assertEqual(job.attempts, 1)
        self.assertEqual(len(job.attempt_history), 1, job.attempt_history)
        self.assertEqual(job.result.steps, 300)
        events = list(client.watch(job_id))
        self.assertIn("the coordinator restarted and re-adopted all 2 ranks of attempt 1", logs_of(events))
        self.assert_nothing_left(job_id)
        # One allocation from start to end (slurmctld keeps ended jobs for MinJobAge=30 s).
        self.assertEqual(self.slurm_jobs_of(job_id), [(slurm_id(job.attempt_history[0]), "COMPLETED")])

    def test_scancel_from_outside_restarts_the_job_from_its_checkpoint(self):
        daemon, client = self.serving_fitrund()
        spec = mlp_spec("scancelled", 2, max_steps=300, min_nodes=2)
        spec["checkpoint"] = {"every_steps": 5}
        job_id = client.submit(spec)
        saved = None
        for event in client.watch(job_id):
            if event.WhichOneof("event") == "checkpoint_saved":
                saved = event.checkpoint_saved
                break
        self.assertIsNotNone(saved, "a checkpoint before the job ended")
        first = slurm_id(client.get(job_id).attempt_history[0])
        self.cluster.run(["scancel", first])

        job = self.wait_end(client, job_id)
        self.assertEqual(state_name(job), "SUCCEEDED", self.explain(daemon, job))
        self.assertEqual(job.attempts, 2)
        self.assertEqual(job.restarts, 1)
        self.assertNotEqual(slurm_id(job.attempt_history[1]), first)
        logs = logs_of(list(client.watch(job_id)))
        resumed = [int(m.group(1)) for t in logs for m in [re.search(r"resumed from the checkpoint of step (\d+)", t)]
                   if m]
        self.assertTrue(resumed, logs[-30:])
        self.assertGreaterEqual(resumed[0], saved.step, "from the checkpoint seen before the scancel, or a later one")
        self.assertGreater(resumed[0], 0)
        self.assertTrue(any(t.startswith("training resumed at step") and "of attempt 2" in t for t in logs), logs[-30:])
        print(f"scancel of Slurm job {first} at checkpoint step {saved.step}: "
              f"{job.attempt_history[0].outcome}; resumed from step {resumed[0]}", file=sys.stderr)
        self.assert_nothing_left(job_id)

    def test_a_users_job_is_submitted_as_their_unix_account_and_its_files_are_theirs(self):
        if os.geteuid() != 0:
            self.skipTest("needs root: fitrund submits jobs as their owners' accounts only as root")
        account = f"frs{os.getpid()}"
        uid = useradd(account)
        self.addCleanup(userdel, account)  # after tearDown, which cancels its Slurm jobs
        self.accounts.append(account)
        os.chmod(self.shared, 0o755)
        worker = install_for_accounts(os.path.join(self.shared, "install"))
        tokens = os.path.join(self.shared, "tokens")
        with open(tokens, "w") as f:
            f.write(token_line("alice", "alice-token", account))
        daemon = self.start_fitrund([f"--auth_tokens={tokens}"], worker=worker)
        self.assertIsNotNone(daemon.address, daemon.log())
        client = Client(daemon.address, timeout=30, token="alice-token")
        job, _ = self.run_job(client, mlp_spec("as-its-owner", 4, max_steps=10))
        self.assertEqual(state_name(job), "SUCCEEDED", self.explain(daemon, job))
        self.assertEqual(job.owner, "alice")
        slurm_jobs = self.slurm_jobs_of(job.id)
        self.assertEqual(len(slurm_jobs), 1, slurm_jobs)
        shown = self.cluster.run(["scontrol", "show", "job", slurm_jobs[0][0]]).stdout
        self.assertIn(f"UserId={account}({uid})", shown)
        # What the ranks wrote is the account's: the rank logs, the batch log, the checkpoints.
        job_dir = os.path.join(self.shared, "jobs", job.id)
        self.assertEqual((os.stat(job_dir).st_uid, os.stat(job_dir).st_mode & 0o777), (uid, 0o700))
        attempt = os.path.join(job_dir, "attempt-1")
        written = [os.path.join(attempt, name) for name in os.listdir(attempt)
                   if name.startswith("rank-") and name.endswith(".log")] + [os.path.join(attempt, "slurm-batch.log")]
        self.assertEqual(len(written), 5, os.listdir(attempt))
        self.assertEqual({path: os.stat(path).st_uid for path in written}, {path: uid for path in written})
        checkpoints = os.path.join(job_dir, "checkpoints")
        self.assertEqual({os.stat(os.path.join(checkpoints, n)).st_uid for n in os.listdir(checkpoints)}, {uid})
        self.assert_nothing_left(job.id, [i for i, _ in slurm_jobs])

    def test_a_bad_virtual_devices_flag_stops_fitrund_at_start(self):
        daemon = self.start_fitrund(["--slurm_virtual_devices=2xlots"])
        self.assertIsNone(daemon.address, daemon.log())
        self.assertNotEqual(daemon.process.wait(timeout=10), 0)
        self.assertIn("--slurm_virtual_devices: 'lots' is not a size", daemon.log())

    def test_an_unreachable_slurmctld_stops_fitrund_at_start(self):
        with open(self.cluster.conf_path) as f:
            conf = f.read()
        closed = os.path.join(self.shared, "closed-port.conf")
        with open(closed, "w") as f:
            f.write(re.sub(r"(?m)^SlurmctldPort=\d+$", f"SlurmctldPort={free_port()}", conf))
        started = time.monotonic()
        daemon = self.start_fitrund(env=dict(self.cluster.env, SLURM_CONF=closed))
        self.assertIsNone(daemon.address, daemon.log())
        self.assertNotEqual(daemon.process.wait(timeout=30), 0)
        took = time.monotonic() - started
        self.assertIn("cannot reach slurmctld", daemon.log())
        # Slurm's clients give up on an unreachable slurmctld after about 9 s; fitrund waits no longer.
        self.assertLess(took, 25, daemon.log())
        print(f"unreachable slurmctld: fitrund exited after {took:.1f} s", file=sys.stderr)

    def test_a_multi_node_spec_without_shared_dir_is_refused_naming_the_flag(self):
        daemon = self.start_fitrund(shared=False)
        self.assertIsNotNone(daemon.address, daemon.log())
        client = Client(daemon.address, timeout=30)
        with self.assertRaises(ClientError) as refused:
            client.submit(mlp_spec("needs-shared", 2, min_nodes=2))
        self.assertEqual(refused.exception.code, "INVALID_ARGUMENT")
        self.assertIn("spec.resources.min_nodes", str(refused.exception))
        self.assertIn("--shared_dir", str(refused.exception))
        self.assertEqual(list(client.list()), [])
        self.assertEqual(self.queue(), [])


if __name__ == "__main__":
    junit_main.main()  # names of tests to run, if any, from the command line
