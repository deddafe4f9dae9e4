"""Warm ranks (fitrund --warm_ranks) with a real fitrund and real fitrun-worker ranks: a job after the
first runs on ranks started before it was submitted, and they take its identity (job, rank, world,
token) over their pipe; a user's warm ranks run as that user's account and never take another user's
job (root only, with throwaway accounts); a warm rank that dies idle is never handed a job, and one
that crashes in its job is that rank's crash, which the job recovers from; a fitrund killed mid-job
re-adopts its warm ranks by the id its record keeps; and idle warm ranks are gone within a second of
fitrund stopping, by SIGTERM or SIGKILL.
"""

import os
import shutil
import signal
import socket
import tempfile
import time
import unittest

from accounts import install_for_accounts, token_line, useradd, userdel
from fitrun.client import Client
from jobs import Fitrund, run_to_end, state_name, wait_for
import junit_main

DATA = "/usr/share/datasets/fashion-mnist"


def mlp_job(name, steps=3):
    return {
        "name": name,
        "model": {"builtin": "mlp"},
        "data": {"kind": "fashion_mnist", "path": DATA},
        "optimizer": {"kind": "sgd", "lr": 0.05},
        "global_batch_size": 64,
        "max_steps": steps,
        "resources": {"min_devices": 2, "max_devices": 2},
    }


def read(path, mode="r"):
    try:
        with open(path, mode) as f:
            return f.read()
    except OSError:
        return b"" if "b" in mode else ""


def parent_of(pid):
    for line in read(f"/proc/{pid}/status").splitlines():
        if line.startswith("PPid:"):
            return int(line.split()[1])
    return 0


def uid_of(pid):
    for line in read(f"/proc/{pid}/status").splitlines():
        if line.startswith("Uid:"):
            return int(line.split()[1])
    return -1


def idle_warm_ranks(fitrund):
    """Pids of `fitrund`'s warm ranks still waiting for a job: its children that carry FITRUN_WARM_RANK
    and whose output still goes nowhere (a rank handed a job writes to its log)."""
    pids = set()
    for entry in filter(str.isdigit, os.listdir("/proc")):
        pid = int(entry)
        if b"FITRUN_WARM_RANK=" not in read(f"/proc/{pid}/environ", "rb") or parent_of(pid) != fitrund.process.pid:
            continue
        try:
            if os.readlink(f"/proc/{pid}/fd/1") == "/dev/null":
                pids.add(pid)
        except OSError:
            pass
    return pids


def alive(pid):
    state = [l for l in read(f"/proc/{pid}/status").splitlines() if l.startswith("State:")]
    return bool(state) and "Z" not in state[0].split()[1]


def running_reason(client, job_id):
    for event in client.watch(job_id):
        if event.WhichOneof("event") == "state_changed" and state_name_of(event.state_changed.to) == "RUNNING":
            return event.state_changed.reason
    return ""


def state_name_of(number):
    from fitrun.v1 import job_pb2

    return job_pb2.JobState.Name(number).replace("JOB_STATE_", "")


def rank_pids(job, attempt=-1):
    return [rank.pid for rank in job.attempt_history[attempt].ranks]


class WarmRanksTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.work = tempfile.mkdtemp(prefix="fitrun-warm-", dir=os.environ.get("TEST_TMPDIR"))

    def start(self, name, flags=(), listen="127.0.0.1:0"):
        daemon = Fitrund(os.path.join(self.work, name), ["--devices=cpu:2x512MiB", "--warm_ranks=2", *flags],
                         listen=listen)
        self.addCleanup(daemon.stop)
        self.assertIsNotNone(daemon.address, daemon.log())
        return daemon

    def wait_idle(self, daemon, count, what="warm ranks"):
        return wait_for(lambda: (lambda p: p if len(p) >= count else None)(idle_warm_ranks(daemon)), 60,
                        f"{count} idle {what}")

    def test_a_later_job_runs_on_ranks_started_before_it_and_takes_its_identity(self):
        daemon = self.start("identity")
        client = Client(daemon.address, timeout=30)
        first, _ = run_to_end(client, mlp_job("first"))
        self.assertEqual(state_name(first), "SUCCEEDED")
        self.assertNotIn("warm", running_reason(client, first.id))
        warm = self.wait_idle(daemon, 2)
        job, events = run_to_end(client, mlp_job("second"))
        self.assertEqual(state_name(job), "SUCCEEDED", job.failure_reason)
        self.assertIn("(2 warm)", running_reason(client, job.id))
        self.assertEqual(set(rank_pids(job)), warm)
        said = [e.log.text for e in events if e.WhichOneof("event") == "log"]
        for rank in (0, 1):
            # Each rank reported as its own rank of this job (the token was accepted: the Hello is
            # refused without it), and its log is the job's.
            self.assertTrue(any(f"rank {rank}/2 on cpu:{rank}" in text for text in said), said)
            log = "".join(client.logs(job.id, rank=rank))
            self.assertIn("warm rank: its job taken", log)
        self.assertEqual(len([e for e in events if e.WhichOneof("event") == "rank_finished"]), 2)
        # The pool started as many again for the next job.
        self.assertEqual(len(self.wait_idle(daemon, 2) - warm), 2)

    def test_a_warm_rank_that_dies_idle_is_never_handed_a_job(self):
        daemon = self.start("dies-idle")
        client = Client(daemon.address, timeout=30)
        run_to_end(client, mlp_job("first"))
        warm = sorted(self.wait_idle(daemon, 2))
        os.kill(warm[0], signal.SIGKILL)
        wait_for(lambda: not alive(warm[0]), 10, "the killed warm rank gone")
        job, _ = run_to_end(client, mlp_job("second"))
        self.assertEqual(state_name(job), "SUCCEEDED", job.failure_reason)
        self.assertIn("(1 warm)", running_reason(client, job.id))
        self.assertNotIn(warm[0], rank_pids(job))
        self.assertIn(warm[1], rank_pids(job))
        self.assertEqual(job.restarts, 0)

    def test_a_warm_rank_that_crashes_in_its_job_is_restarted_like_any_rank(self):
        daemon = self.start("crashes")
        client = Client(daemon.address, timeout=30)
        run_to_end(client, mlp_job("first"))
        warm = self.wait_idle(daemon, 2)
        job_id = client.submit(mlp_job("long", steps=1000000))
        wait_for(lambda: client.get(job_id).last_progress.step >= 1, 60, "a first step on the warm ranks")
        job = client.get(job_id)
        self.assertEqual(set(rank_pids(job)), warm)
        os.kill(rank_pids(job)[1], signal.SIGKILL)
        wait_for(lambda: (lambda j: j if len(j.attempt_history) == 2 and state_name(j) == "RUNNING" else None)(
            client.get(job_id)), 60, "a second attempt")
        job = client.get(job_id)
        self.assertEqual(job.restarts, 1)
        self.assertEqual(job.attempt_history[0].ranks[1].signal, signal.SIGKILL)
        client.cancel(job_id, "test done")
        wait_for(lambda: state_name(client.get(job_id)) == "CANCELLED", 30, "CANCELLED")

    def test_a_restarted_fitrund_re_adopts_its_warm_ranks_by_their_recorded_id(self):
        state = "readopt"
        # One address for both fitrunds, so that the ranks' reports reach the second.
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            listen = f"127.0.0.1:{s.getsockname()[1]}"
        first = self.start(state, ["--stop_workers_on_exit=false"], listen=listen)
        client = Client(first.address, timeout=30)
        run_to_end(client, mlp_job("first"))
        warm = self.wait_idle(first, 2)
        job_id = client.submit(mlp_job("long", steps=1000000))
        wait_for(lambda: client.get(job_id).last_progress.step >= 1, 60, "a first step on the warm ranks")
        self.assertEqual(set(rank_pids(client.get(job_id))), warm)
        first.kill()  # SIGKILL: the job's ranks stay; the idle warm ranks see their pipes end
        second = self.start(state, ["--stop_workers_on_exit"], listen=listen)
        client = Client(second.address, timeout=30)
        wait_for(lambda: state_name(client.get(job_id)) == "RUNNING", 30, "the job re-adopted")
        step = client.get(job_id).last_progress.step
        wait_for(lambda: client.get(job_id).last_progress.step > step, 60, "steps reported to the new fitrund")
        self.assertEqual(len(client.get(job_id).attempt_history), 1)
        client.cancel(job_id, "test done")
        wait_for(lambda: state_name(client.get(job_id)) == "CANCELLED", 30, "CANCELLED")
        said = [e.log.text for e in client.watch(job_id) if e.WhichOneof("event") == "log"]
        self.assertTrue(any("re-adopted all 2 ranks" in text for text in said), said)
        for pid in warm:
            wait_for(lambda: not alive(pid), 15, f"warm rank {pid} stopped by the cancel")

    def test_idle_warm_ranks_are_gone_when_fitrund_stops(self):
        # Nothing but fitrund's end tells them: SIGTERM's shutdown, or (SIGKILL) their pipes' end.
        # How soon is printed, not asserted: on a loaded machine a rank's exit takes what it takes.
        for how in ("SIGTERM", "SIGKILL"):
            with self.subTest(how=how):
                daemon = self.start(f"stops-{how}")
                client = Client(daemon.address, timeout=30)
                run_to_end(client, mlp_job("first"))
                warm = self.wait_idle(daemon, 2)
                stopped = time.monotonic()
                daemon.process.send_signal(getattr(signal, how))
                wait_for(lambda: not any(alive(pid) for pid in warm), 30, "the idle warm ranks gone")
                print(f"after {how}: the idle warm ranks were gone in {time.monotonic() - stopped:.2f} s", flush=True)


class WarmRanksOfUsersTest(unittest.TestCase):
    """Root only: jobs run as their owners' accounts, and so do their warm ranks."""

    @classmethod
    def setUpClass(cls):
        if os.geteuid() != 0:
            raise unittest.SkipTest("needs root: fitrund runs jobs as other accounts only as root")
        cls.work = tempfile.mkdtemp(prefix="fitrun-warm-users-", dir="/tmp")
        os.chmod(cls.work, 0o755)
        cls.accounts = [f"fwa{os.getpid()}", f"fwb{os.getpid()}"]
        cls.alice_uid, cls.bob_uid = (useradd(name) for name in cls.accounts)
        worker = install_for_accounts(os.path.join(cls.work, "install"))
        tokens = os.path.join(cls.work, "tokens")
        with open(tokens, "w") as f:
            f.write(token_line("alice", "alice-token", cls.accounts[0]))
            f.write(token_line("bob", "bob-token", cls.accounts[1]))
        cls.daemon = Fitrund(os.path.join(cls.work, "state"),
                             ["--devices=cpu:2x512MiB", "--warm_ranks=4", f"--auth_tokens={tokens}"], worker=worker)
        if cls.daemon.address is None:
            raise AssertionError(f"fitrund did not start:\n{cls.daemon.log()}")

    @classmethod
    def tearDownClass(cls):
        if hasattr(cls, "daemon"):
            cls.daemon.stop()
        for account in getattr(cls, "accounts", []):
            userdel(account)
        if hasattr(cls, "work"):
            shutil.rmtree(cls.work, ignore_errors=True)

    def idle_of(self, uid):
        return {pid for pid in idle_warm_ranks(self.daemon) if uid_of(pid) == uid}

    def test_a_users_warm_ranks_run_as_their_account_and_take_only_their_jobs(self):
        alice = Client(self.daemon.address, timeout=30, token="alice-token")
        bob = Client(self.daemon.address, timeout=30, token="bob-token")
        first, _ = run_to_end(alice, mlp_job("alice-first"))
        self.assertEqual(state_name(first), "SUCCEEDED", first.failure_reason)
        alices = wait_for(lambda: (lambda p: p if len(p) == 2 else None)(self.idle_of(self.alice_uid)), 60,
                          "alice's two warm ranks")
        # Bob's job finds no warm rank of his, and never one of alice's.
        job, _ = run_to_end(bob, mlp_job("bob-first"))
        self.assertEqual(state_name(job), "SUCCEEDED", job.failure_reason)
        self.assertNotIn("warm", running_reason(bob, job.id))
        self.assertFalse(set(rank_pids(job)) & alices)
        self.assertEqual(self.idle_of(self.alice_uid), alices)
        bobs = wait_for(lambda: (lambda p: p if len(p) == 2 else None)(self.idle_of(self.bob_uid)), 60,
                        "bob's two warm ranks")
        # Alice's next job takes hers; bob's stay his.
        job, _ = run_to_end(alice, mlp_job("alice-second"))
        self.assertEqual(state_name(job), "SUCCEEDED", job.failure_reason)
        self.assertIn("(2 warm)", running_reason(alice, job.id))
        self.assertEqual(set(rank_pids(job)), alices)
        self.assertTrue(bobs <= self.idle_of(self.bob_uid))


if __name__ == "__main__":
    junit_main.main()
