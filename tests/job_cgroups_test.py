"""Each attempt's processes in a cgroup of their own, with a real fitrund as root (--job_cgroups=on),
real fitrun-supervisor ranks and real /usr/bin/python3 scripts:

- a daemon a script leaves behind (setsid, its parent gone, out of every rank's process group) is
  killed when the job succeeds and when it is cancelled, and the attempt's cgroup goes with it;
- a script filling host memory past spec.resources.host_memory is stopped by the kernel's OOM killer
  and reported (a host_memory_oom event with the limit and the peak): the job fails naming
  spec.resources.host_memory when its batch is fixed, and is re-planned with a smaller batch when
  not;
- a fitrund SIGKILLed mid-run and restarted re-opens the attempt's cgroup, so a cancel still kills
  the daemon;
- a starting fitrund removes the empty cgroups that fitrunds no longer running left (one SIGKILLed, one
  that left an emptied attempt's cgroup), and leaves a running one's.

Every fitrund here makes its cgroups under a parent named for this run (--cgroup_parent), which the
test checks is empty and removes at the end. Skipped, and reported as skipped, when not root or when
this machine's cgroups cannot be written. Waits are on conditions, never on fixed times alone.
"""

import os
import random
import shutil
import signal
import tempfile
import unittest

from fitrun.client import Client, FINAL_STATES
from jobs import Fitrund, run_to_end, state_name, wait_for
import junit_main

RUNFILES = os.path.join(os.environ.get("TEST_SRCDIR", ""), os.environ.get("TEST_WORKSPACE", "fitrun"))
SCRIPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts")
PARENT = f"fitrun-e2e-{os.getpid()}-{random.randrange(10**6)}"


def cgroup_parents():
    """Where --cgroup_parent=PARENT lands in each cgroup hierarchy: under this process's own cgroup, as
    under fitrund's (its child)."""
    own = {}
    with open("/proc/self/cgroup") as f:
        for line in f:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            for controller in controllers.split(",") if controllers else [""]:
                own[controller] = path
    parents = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            dash = fields.index("-")
            fstype, options = fields[dash + 1], fields[dash + 3].split(",")
            if fstype == "cgroup2":
                path = own.get("", "/")
            elif fstype == "cgroup":
                named = [own[o] for o in options if o in own]
                if not named:
                    continue
                path = named[0]
            else:
                continue
            parents.append(os.path.join(fields[4], path.lstrip("/"), PARENT))
    return parents


def attempt_cgroups():
    """Every cgroup under PARENT (the coordinator's directory and the attempts' below it)."""
    found = []
    for parent in cgroup_parents():
        for directory, dirs, _ in os.walk(parent):
            found.extend(os.path.join(directory, d) for d in dirs)
    return found


def remove_cgroups():
    """What a failed test left: every process in it killed, every directory removed, deepest first."""
    for parent in cgroup_parents():
        if not os.path.isdir(parent):
            continue
        for directory, dirs, _ in os.walk(parent, topdown=False):
            try:
                with open(os.path.join(directory, "cgroup.procs")) as f:
                    for pid in f.read().split():
                        os.kill(int(pid), signal.SIGKILL)
            except OSError:
                pass
        for directory, dirs, _ in os.walk(parent, topdown=False):
            try:
                os.rmdir(directory)
            except OSError:
                pass


def gone(pid):
    """Whether a process is gone (or a zombie its new parent has yet to reap, which runs nothing)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def read_pid(path):
    try:
        with open(path) as f:
            text = f.read().strip()
        return int(text) if text else None
    except OSError:
        return None


class JobCgroupsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        if os.geteuid() != 0:
            raise unittest.SkipTest("needs root: fitrund makes cgroups only as root")
        cls.work = tempfile.mkdtemp(prefix="fitrun-cgroups-", dir=os.environ.get("TEST_TMPDIR", "/tmp"))
        # The script as it lies in the sources (runfiles link to it), where fitrund resolves it.
        cls.scripts_dir = os.path.dirname(os.path.realpath(os.path.join(SCRIPTS, "toy_train.py")))
        cls.daemon = cls.start(os.path.join(cls.work, "state"))
        if cls.daemon.address is None:
            log = cls.daemon.log()
            cls.daemon.stop()
            if "cannot confine jobs" in log:
                raise unittest.SkipTest(f"this machine's cgroups cannot be written: {log.strip()}")
            raise AssertionError(f"fitrund did not start:\n{log}")
        cls.client = Client(cls.daemon.address, timeout=30)

    @classmethod
    def tearDownClass(cls):
        if hasattr(cls, "daemon"):
            cls.daemon.stop()
        left = attempt_cgroups()
        remove_cgroups()
        if hasattr(cls, "work"):
            shutil.rmtree(cls.work, ignore_errors=True)
        if left:
            raise AssertionError(f"cgroups left behind: {left}")

    @classmethod
    def start(cls, state_dir):
        return Fitrund(state_dir, ["--devices=cpu:2x512MiB", "--job_cgroups=on", f"--cgroup_parent={PARENT}",
                                   "--memory_probe=true"],
                       data_roots=f"{cls.work},{cls.scripts_dir},{RUNFILES},/usr/share/datasets")

    def script_spec(self, name, args, **extra):
        spec = {
            "name": name,
            "script": {"command": ["/usr/bin/python3", "toy_train.py"] + args, "working_dir": self.scripts_dir,
                       "env": {"OMP_NUM_THREADS": "1"}},
            "global_batch_size": 16,
            "optimizer": {"lr": 0.001},
            # A fixed batch: no memory probe first, unless a test says otherwise.
            "resources": {"min_devices": 2, "max_devices": 2, "per_device_batch": 8},
            "fault_tolerance": {"max_restarts": 0, "stop_grace_seconds": 3},
        }
        for key, value in extra.items():
            if isinstance(value, dict) and isinstance(spec.get(key), dict):
                spec[key] = {**spec[key], **value}
            else:
                spec[key] = value
        return spec

    def daemon_file(self, name):
        path = os.path.join(self.work, f"{name}.pid")
        if os.path.exists(path):
            os.remove(path)
        return path

    def attempt_cgroup_gone(self, job_id):
        return not any(os.path.basename(path).startswith(f"{job_id}-a") for path in attempt_cgroups())

    def assert_nothing_left(self, job_id, daemon):
        wait_for(lambda: gone(daemon), 15, f"the daemon {daemon} of {job_id} to be killed")
        wait_for(lambda: self.attempt_cgroup_gone(job_id), 15, f"the cgroups of {job_id} to be removed")

    def wait_running_with_daemon(self, client, job_id, pid_file):
        def started():
            job = client.get(job_id)
            self.assertNotIn(job.state, FINAL_STATES, job.failure_reason)
            return job.last_progress.step >= 2 and read_pid(pid_file)

        return wait_for(started, 240, f"{job_id} to train with its daemon started")

    def test_a_daemon_the_script_leaves_is_killed_when_the_job_succeeds(self):
        pid_file = self.daemon_file("succeeds")
        job, _ = run_to_end(self.client, self.script_spec("daemon-succeeds", ["--steps", "3", "--leave_daemon", pid_file]))
        self.assertEqual(state_name(job), "SUCCEEDED", job.failure_reason)
        daemon = read_pid(pid_file)
        self.assertIsNotNone(daemon, "the script started its daemon")
        self.assert_nothing_left(job.id, daemon)

    def test_a_daemon_the_script_leaves_is_killed_when_the_job_is_cancelled(self):
        pid_file = self.daemon_file("cancelled")
        job_id = self.client.submit(self.script_spec(
            "daemon-cancelled", ["--steps", "100000", "--step_seconds", "0.2", "--leave_daemon", pid_file]))
        daemon = self.wait_running_with_daemon(self.client, job_id, pid_file)
        self.assertFalse(gone(daemon))
        self.client.cancel(job_id, "test")
        wait_for(lambda: state_name(self.client.get(job_id)) == "CANCELLED", 30, "CANCELLED")
        self.assert_nothing_left(job_id, daemon)

    def test_host_memory_past_the_spec_is_stopped_and_reported_and_a_fixed_batch_fails_naming_it(self):
        spec = self.script_spec("host-oom-fixed", ["--steps", "6", "--host_hog_mib", "3072"],
                                resources={"host_memory": "1GiB"})
        job, events = run_to_end(self.client, spec)
        self.assertEqual(state_name(job), "FAILED", job.failure_reason)
        ooms = [e.host_memory_oom for e in events if e.WhichOneof("event") == "host_memory_oom"]
        self.assertEqual(len(ooms), 1, [e.WhichOneof("event") for e in events])
        self.assertEqual(ooms[0].limit_bytes, 2 << 30, "two ranks of 1 GiB each")
        self.assertGreater(ooms[0].peak_bytes, (2 << 30) * 9 // 10)
        self.assertEqual(ooms[0].per_device_batch, 8)
        self.assertIn("host memory limit of 2.00 GiB", job.failure_reason)
        self.assertIn("spec.resources.per_device_batch fixes the batch at 8", job.failure_reason)
        self.assertIn("raise spec.resources.host_memory (each rank may use 1.00 GiB now)", job.failure_reason)
        self.assertTrue(any(o.host_limit_bytes == 2 << 30 for o in job.oom_history), job.oom_history)
        wait_for(lambda: self.attempt_cgroup_gone(job.id), 15, f"the cgroups of {job.id} to be removed")

    def test_host_memory_past_the_spec_with_a_free_batch_is_replanned_smaller(self):
        spec = self.script_spec("host-oom-replan", ["--steps", "4", "--host_hog_mib", "3072"],
                                resources={"host_memory": "1GiB", "per_device_batch": 0})
        job, events = run_to_end(self.client, spec)
        self.assertEqual(state_name(job), "SUCCEEDED", job.failure_reason)
        self.assertEqual(job.oom_replans, 1)
        self.assertTrue(any(e.WhichOneof("event") == "host_memory_oom" for e in events))
        first, last = job.attempt_history[0], job.attempt_history[-1]
        self.assertIn("host memory limit of 2.00 GiB", first.outcome)
        self.assertLess(last.per_device_batch, first.per_device_batch)
        wait_for(lambda: self.attempt_cgroup_gone(job.id), 15, f"the cgroups of {job.id} to be removed")

    def test_job_cgroups_on_refuses_to_start_without_them_and_says_why(self):
        for flags, said in [
            (["--job_cgroups=on", "--cgroup_parent=../elsewhere"],
             "--job_cgroups=on: this machine cannot confine jobs: --cgroup_parent: '../elsewhere' is not a cgroup path"),
            (["--job_cgroups=maybe"], "--job_cgroups: expected auto, on or off (got 'maybe')"),
        ]:
            refused = Fitrund(os.path.join(self.work, "refused"), ["--devices=cpu:1x256MiB", *flags])
            try:
                self.assertIsNone(refused.address, "fitrund started")
                self.assertNotEqual(refused.process.wait(timeout=30), 0)
                self.assertIn(said, refused.log())
            finally:
                refused.stop()
        # What a running fitrund says it uses.
        self.assertIn(f"job cgroups: cgroup v", self.daemon.log())
        self.assertIn(f"/{PARENT}/fitrund-", self.daemon.log())

    def test_a_starting_fitrund_removes_the_empty_cgroups_of_fitrunds_that_are_gone(self):
        killed = self.start(os.path.join(self.work, "killed"))
        self.assertIsNotNone(killed.address, killed.log())
        killed.kill()  # SIGKILL: nothing removes its directory
        killed_dirs = [d.strip() for d in killed.log().split("cgroups under ", 1)[1].splitlines()[0].split(", ")]
        running_dirs = [d.strip() for d in self.daemon.log().split("cgroups under ", 1)[1].splitlines()[0].split(", ")]
        # An older one's, with the cgroup of an attempt it had emptied, in each hierarchy fitrund uses.
        dead = [os.path.join(os.path.dirname(d), "fitrund-00000000deadbeef") for d in running_dirs]
        for directory in dead:
            os.makedirs(os.path.join(directory, "j-999999-a1"))
        for directory in killed_dirs + running_dirs:
            self.assertTrue(os.path.isdir(directory), directory)
        starting = self.start(os.path.join(self.work, "starting"))
        try:
            self.assertIsNotNone(starting.address, starting.log())
            for directory in killed_dirs + dead:
                self.assertFalse(os.path.exists(directory), f"{directory} left behind")
            for directory in running_dirs:
                self.assertTrue(os.path.isdir(directory), f"a running fitrund's {directory} was removed")
            self.assertIn("removed", starting.log())
            self.assertIn("empty cgroup(s) of coordinators no longer running", starting.log())
        finally:
            starting.stop()

    def test_after_fitrund_is_killed_and_restarted_a_cancel_still_kills_the_daemon(self):
        state = os.path.join(self.work, "restarted")
        first = self.start(state)
        self.assertIsNotNone(first.address, first.log())
        try:
            client = Client(first.address, timeout=30)
            pid_file = self.daemon_file("restarted")
            job_id = client.submit(self.script_spec(
                "daemon-restart", ["--steps", "100000", "--step_seconds", "0.2", "--leave_daemon", pid_file]))
            daemon = self.wait_running_with_daemon(client, job_id, pid_file)
            first.kill()  # SIGKILL: the ranks, their daemon and their cgroup stay
            self.assertFalse(gone(daemon))
            self.assertFalse(self.attempt_cgroup_gone(job_id))
            second = self.start(state)
            self.assertIsNotNone(second.address, second.log())
            try:
                client = Client(second.address, timeout=30)
                wait_for(lambda: state_name(client.get(job_id)) == "RUNNING", 30, "the job re-adopted")
                client.cancel(job_id, "test")
                wait_for(lambda: state_name(client.get(job_id)) == "CANCELLED", 30, "CANCELLED")
                self.assert_nothing_left(job_id, daemon)
                said = [e.log.text for e in client.watch(job_id) if e.WhichOneof("event") == "log"]
                self.assertTrue(any("re-adopted all 2 ranks" in text for text in said), said)
            finally:
                second.stop()
        finally:
            first.stop()


if __name__ == "__main__":
    junit_main.main()
