"""What the Python end-to-end tests share: waiting on a condition, and running a job to its end."""

import time


def state_name(job):
    """"SUCCEEDED" rather than JOB_STATE_SUCCEEDED's number."""
    from fitrun.v1 import job_pb2  # here, not above: Fitrund alone serves Pythons without the client's stubs

    return job_pb2.JobState.Name(job.state).replace("JOB_STATE_", "")


def wait_for(condition, timeout, what):
    """Polls `condition` until it returns something true, and returns that; fails after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)


def run_to_end(client, spec, timeout=300):
    """Submits `spec`, follows its events to the end, and returns (the ended Job, its events)."""
    from fitrun.client import FINAL_STATES

    job_id = client.submit(spec)
    events = list(client.watch(job_id))
    job = wait_for(lambda: (lambda j: j if j.state in FINAL_STATES else None)(client.get(job_id)), timeout,
                   f"{job_id} to end")
    return job, events


class Fitrund:
    """A real fitrund on OS-chosen ports with a state directory of its own.

    Its binaries come from the test's runfiles unless `fitrund` and `worker` name them (as the
    benchmarks do). It reads files under the test's temporary directory and Debian's datasets, or, with
    `data_roots=None`, fitrund's own default roots (Debian's datasets and its uploads folder). `flags` are
    added to the defaults; `address` is where it serves once started. `env` replaces the environment it inherits
    (a Slurm cluster's SLURM_CONF, say). stop() (or leaving a `with` block) SIGTERMs it and SIGKILLs any
    rank it left, found by its state directory or by `jobs_dir` (where its jobs' files go when that is
    elsewhere: fitrund --shared_dir's jobs/).
    """

    TEST_DATA_ROOTS = "for the tests"

    def __init__(self, state_dir, flags=(), listen="127.0.0.1:0", fitrund=None, worker=None,
                 data_roots=TEST_DATA_ROOTS, cwd=None, env=None, jobs_dir=None):
        import os
        import subprocess

        runfiles = os.path.join(os.environ.get("TEST_SRCDIR", ""), os.environ.get("TEST_WORKSPACE", "fitrun"))
        fitrund = fitrund or os.path.join(runfiles, "server/fitrund")
        worker = worker or os.path.join(runfiles, "worker/fitrun-worker")
        if data_roots == Fitrund.TEST_DATA_ROOTS:
            data_roots = f"{os.environ.get('TEST_TMPDIR', '/tmp')},/usr/share/datasets"
        self.state_dir = state_dir
        self.jobs_dir = jobs_dir
        os.makedirs(state_dir, exist_ok=True)
        for name in ("fitrund.address", "fitrund.metrics_address"):
            if os.path.exists(os.path.join(state_dir, name)):
                os.remove(os.path.join(state_dir, name))
        self.log_path = os.path.join(state_dir, "fitrund.log")
        self._log = open(self.log_path, "a")
        self.process = subprocess.Popen(
            [fitrund, f"--listen={listen}", "--metrics_listen=127.0.0.1:0", f"--state_dir={state_dir}",
             f"--worker_binary={worker}", "--stop_workers_on_exit",
             *([f"--data_roots={data_roots}"] if data_roots is not None else []), *flags],
            stdout=self._log, stderr=subprocess.STDOUT, cwd=cwd, env=env)
        metrics = os.path.join(state_dir, "fitrund.metrics_address")
        wait_for(lambda: (os.path.exists(metrics) and os.path.getsize(metrics) > 0) or self.process.poll() is not None,
                 30, "fitrund to serve")
        self.address = None
        if self.process.poll() is None:
            with open(os.path.join(state_dir, "fitrund.address")) as f:
                self.address = f.read().strip()

    def log(self):
        with open(self.log_path) as f:
            return f.read()

    def kill(self):
        """SIGKILLs fitrund alone, as a crash would: its ranks keep running, for a restarted fitrund on the
        same state directory to re-adopt."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        self._log.close()

    def stop(self):
        import os
        import signal
        import subprocess

        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        needles = tuple(f"FITRUN_ASSIGNMENT={d}/".encode() for d in (self.state_dir, self.jobs_dir) if d)
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/environ", "rb") as f:
                    if any(v.startswith(needles) for v in f.read().split(b"\0")):
                        os.kill(int(pid), signal.SIGKILL)
            except OSError:
                pass
        self._log.close()
        self.remove_cgroups()

    def remove_cgroups(self):
        """Removes the cgroup directories fitrund made (its log says where), once nothing is in them: a
        fitrund that had to be killed cannot, and a test leaves nothing behind on the machine."""
        import errno
        import os
        import re
        import time

        with open(self.log_path) as f:
            said = re.findall(r"job cgroups: cgroup v\d \([^)]*\): each attempt's cgroups? under (.+)", f.read())
        for bases in said:
            for base in bases.split(", "):
                for directory, _, _ in list(os.walk(base, topdown=False)):
                    # The kernel lets a killed rank's cgroup go a moment after its last task: wait
                    # that moment, not for a cgroup another fitrund on this state directory uses.
                    deadline = time.monotonic() + 2
                    while True:
                        try:
                            os.rmdir(directory)
                        except OSError as error:
                            if error.errno == errno.EBUSY and time.monotonic() < deadline:
                                time.sleep(0.05)
                                continue
                        break
                try:
                    os.rmdir(os.path.dirname(base))  # the parent, when no other fitrund's is in it
                except OSError:
                    pass

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.stop()
