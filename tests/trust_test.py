"""A job's owner attacks the fitrund running it, with a real fitrund as root, real throwaway accounts and
real script ranks (tests/scripts/hostile.py), and gains nothing (docs/security.md, "What fitrund
trusts"):

- symlinks planted in the job's own directory never make fitrund (root) give away, change or write a
  file for a second attempt: the victims keep their owner, mode and contents;
- a rank log replaced by a symlink to a root-only file shows nothing of it; replaced by a FIFO (or a
  symlink to /dev/zero) it blocks no call of any user's;
- a data file swapped for a FIFO after submit freezes no scheduling pass;
- a forged 60 GB peak changes no other user's plan;
- a script cannot read its rank's job token;
- a spec asking for more than the operator's ceilings is refused, naming the flag;
- another account can neither take an attempt's rendezvous port before its ranks do nor join the
  c10d store behind it (fitrund holds both, and serves the job's account only);
- a spec naming another account's private file through /proc/<pid>/cwd is refused without a word of
  where it leads (fitrund reads specs with the owner's rights and no capability of root's).

Skipped, and reported as skipped, when not run as root.
"""

import os
import pwd
import shutil
import stat
import subprocess
import tempfile
import time
import unittest

from accounts import install_for_accounts, token_line, useradd, userdel, world_readable
from fitrun.client import Client, ClientError
from jobs import Fitrund, run_to_end, state_name, wait_for
import junit_main

TESTS = os.path.dirname(os.path.abspath(__file__))


def snapshot(path):
    """(owner, mode, contents or listing) of a file or directory, without following a last symlink."""
    info = os.lstat(path)
    if stat.S_ISDIR(info.st_mode):
        contents = sorted(os.listdir(path))
    else:
        with open(path, "rb") as f:
            contents = f.read()
    return info.st_uid, stat.S_IMODE(info.st_mode), contents


class TrustTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        if os.geteuid() != 0:
            raise unittest.SkipTest("needs root: fitrund runs jobs as other accounts only as root")
        cls.accounts = []
        cls.work = tempfile.mkdtemp(prefix="fitrun-trust-", dir="/tmp")
        os.chmod(cls.work, 0o755)
        suffix = os.getpid()
        cls.alice, cls.bob = f"fta{suffix}", f"ftb{suffix}"
        useradd(cls.alice)
        cls.accounts.append(cls.alice)
        useradd(cls.bob)
        cls.accounts.append(cls.bob)
        cls.alice_uid = int(os.popen(f"id -u {cls.alice}").read())

        worker = install_for_accounts(os.path.join(cls.work, "install"))
        cls.scripts = os.path.join(cls.work, "scripts")
        os.makedirs(cls.scripts)
        for script in ("toy_train.py", "hostile.py"):
            shutil.copy(os.path.join(TESTS, "scripts", script), cls.scripts)
        world_readable(cls.scripts)

        # Root's own: what an attack would reach. Readable (a victim file, a victim directory) and
        # root-only (a secret).
        cls.victims = os.path.join(cls.work, "victims")
        os.makedirs(cls.victims)
        os.chmod(cls.victims, 0o755)
        cls.victim_file = os.path.join(cls.victims, "config")
        with open(cls.victim_file, "w") as f:
            f.write("root's configuration\n")
        os.chmod(cls.victim_file, 0o644)
        cls.victim_dir = os.path.join(cls.victims, "etc")
        os.makedirs(cls.victim_dir)
        os.chmod(cls.victim_dir, 0o755)
        cls.secret = os.path.join(cls.victims, "shadow")
        with open(cls.secret, "w") as f:
            f.write("root-only-secret-4f1a\n")
        os.chmod(cls.secret, 0o600)

        # Alice's data, hers alone, under a data root.
        cls.data = os.path.join(cls.work, "data")
        os.makedirs(cls.data)
        os.chmod(cls.data, 0o755)

        tokens = os.path.join(cls.work, "tokens")
        with open(tokens, "w") as f:
            f.write(token_line("alice", "alice-token", cls.alice))
            f.write(token_line("bob", "bob-token", cls.bob))
        cls.state = os.path.join(cls.work, "state")
        cls.daemon = Fitrund(cls.state, ["--devices=cpu:2x512MiB", f"--auth_tokens={tokens}",
                                         "--max_rank_host_memory=8GiB", "--max_rank_processes=4096"],
                             worker=worker, data_roots=f"{cls.data},{cls.scripts},/usr/share/datasets")
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

    def client(self, token="alice-token"):
        return Client(self.daemon.address, timeout=30, token=token)

    def hostile(self, name, attack, target=None, restarts=1, steps=2):
        command = ["/usr/bin/python3", "hostile.py", "--attack", attack, *(["--target", target] if target else []),
                   "--steps", str(steps)]
        return {
            "name": name,
            "script": {"command": command, "working_dir": self.scripts, "env": {"OMP_NUM_THREADS": "1"}},
            "global_batch_size": 16,
            "optimizer": {"lr": 0.001},
            "resources": {"min_devices": 1, "max_devices": 1, "per_device_batch": 16},
            "fault_tolerance": {"max_restarts": restarts},
        }

    def job_dir(self, job_id):
        return os.path.join(self.state, "jobs", job_id)

    def assert_answers_quickly(self):
        """Every call of another user's answers within a second: nothing holds fitrund's lock."""
        for call in (lambda c: c.list(), lambda c: c.devices()):
            start = time.monotonic()
            call(self.client("bob-token"))
            self.assertLess(time.monotonic() - start, 1.0)

    def test_symlinks_planted_for_a_second_attempt_never_make_fitrund_give_away_or_write_a_file(self):
        victims = [self.victim_file, self.victim_dir]
        before = [snapshot(v) for v in victims]
        # checkpoints -> a root file (fitrund would chown and chmod it for attempt 2)
        job, _ = run_to_end(self.client(), self.hostile("ckpt-link", "symlink-checkpoints", self.victim_file))
        self.assertEqual(state_name(job), "FAILED")
        self.assertIn("symlink", job.failure_reason)
        # attempt-2 -> a root directory (fitrund would chown it and write an assignment into it)
        job, _ = run_to_end(self.client(), self.hostile("attempt-link", "symlink-attempt", self.victim_dir))
        self.assertEqual(state_name(job), "FAILED")
        self.assertIn("symlink", job.failure_reason)
        # attempt-2/assignment.textproto -> a root file (fitrund would overwrite it): the link is replaced,
        # the attempt runs on its own assignment and the job succeeds.
        job, _ = run_to_end(self.client(), self.hostile("assignment-link", "plant-assignment", self.victim_file))
        self.assertEqual(state_name(job), "SUCCEEDED", job.failure_reason)
        self.assertEqual(job.attempts, 2)
        assignment = os.path.join(self.job_dir(job.id), "attempt-2", "assignment.textproto")
        self.assertFalse(os.path.islink(assignment))
        self.assertEqual(os.lstat(assignment).st_uid, self.alice_uid, "written as the job's owner")
        self.assertEqual([snapshot(v) for v in victims], before, "a victim changed owner, mode or contents")

    def test_a_log_replaced_by_a_symlink_to_a_root_only_file_shows_nothing_of_it(self):
        for target in (self.secret, "/dev/zero"):
            job, events = run_to_end(self.client(), self.hostile("log-link", "log-symlink", target, restarts=0))
            self.assertEqual(state_name(job), "FAILED")
            self.assertNotIn("root-only-secret", job.failure_reason)
            tails = [e.rank_exited.log_tail for e in events if e.WhichOneof("event") == "rank_exited"]
            self.assertTrue(tails)
            for tail in tails:
                self.assertNotIn("root-only-secret", tail)
                self.assertIn("cannot be shown", tail)
            start = time.monotonic()
            with self.assertRaises(ClientError) as refused:
                "".join(self.client().logs(job.id))
            self.assertLess(time.monotonic() - start, 5.0)
            self.assertEqual(refused.exception.code, "FAILED_PRECONDITION")
            self.assertIn("symlink", str(refused.exception))
            self.assert_answers_quickly()

    def test_a_log_replaced_by_a_fifo_blocks_no_call(self):
        job, events = run_to_end(self.client(), self.hostile("log-fifo", "log-fifo", restarts=0))
        self.assertEqual(state_name(job), "FAILED")
        self.assertTrue(stat.S_ISFIFO(os.lstat(os.path.join(self.job_dir(job.id), "attempt-1", "rank-0.log")).st_mode))
        tails = [e.rank_exited.log_tail for e in events if e.WhichOneof("event") == "rank_exited"]
        self.assertIn("a FIFO", tails[0])
        start = time.monotonic()
        with self.assertRaises(ClientError) as refused:
            "".join(self.client().logs(job.id))
        self.assertLess(time.monotonic() - start, 5.0)
        self.assertIn("a FIFO", str(refused.exception))
        self.assert_answers_quickly()

    def test_a_data_file_swapped_for_a_fifo_after_submit_freezes_no_scheduling_pass(self):
        text = os.path.join(self.data, f"corpus-{os.getpid()}.txt")
        with open(text, "w") as f:
            f.write("fitrun trains what fits. " * 200)
        os.chown(text, self.alice_uid, -1)
        alice = self.client()
        # A job holding both devices, so the next one waits for scheduling passes.
        blocker = alice.submit({"name": "blocker", "model": {"builtin": "mlp"},
                                "data": {"kind": "fashion_mnist", "path": "/usr/share/datasets/fashion-mnist"},
                                "optimizer": {"kind": "sgd", "lr": 0.05}, "global_batch_size": 64,
                                "max_steps": 100000, "resources": {"min_devices": 2, "max_devices": 2}})
        # Its built-in ranks report: they took their job token off its descriptor as alice's account.
        wait_for(lambda: alice.get(blocker).last_progress.step > 0, 120, "the blocker's ranks to report")
        queued = alice.submit({"name": "on-text", "model": {"builtin": "gpt", "gpt": {"layers": 1, "heads": 2,
                                                                                       "hidden": 32, "context": 16}},
                               "data": {"kind": "text", "path": text}, "optimizer": {"kind": "adamw", "lr": 0.001},
                               "global_batch_size": 8, "max_steps": 2,
                               "resources": {"min_devices": 1, "max_devices": 1}})
        os.remove(text)
        os.mkfifo(text)
        os.chown(text, self.alice_uid, -1)
        alice.cancel(blocker, "make room")
        # The queued job is planned from what was read at submit: it launches (its own rank then
        # meets the FIFO, as its owner, in its own process) while every call keeps answering.
        wait_for(lambda: state_name(alice.get(queued)) not in ("QUEUED", "PLANNING"), 60, "the queued job to launch")
        self.assert_answers_quickly()
        alice.cancel(queued, "done")
        wait_for(lambda: state_name(alice.get(queued)) == "CANCELLED", 30, "the cancel")
        self.assert_answers_quickly()

    def test_a_forged_peak_changes_no_other_users_plan(self):
        spec = self.hostile("forger", "forge-peak", restarts=0, steps=3)
        del spec["resources"]["per_device_batch"]
        spec["script"]["batch_flag"] = "--batch_size"
        bob = self.client("bob-token")

        def settled_plan(client):
            def measured():
                try:
                    plan = client.plan(spec).plan
                except ClientError:  # a script's memory is known only once its probe has run
                    return None
                return plan if not any("analytic estimate" in r for r in plan.reasons) else None
            return wait_for(measured, 180, "the workload's memory to be measured")

        before = settled_plan(bob)
        job, _ = run_to_end(self.client(), spec)
        self.assertEqual(state_name(job), "SUCCEEDED", job.failure_reason)
        after = settled_plan(bob)
        self.assertEqual((after.per_device_batch, after.predicted.total_bytes),
                         (before.per_device_batch, before.predicted.total_bytes))
        self.assertFalse(any("real runs" in r for r in after.reasons), after.reasons)

    def test_a_script_cannot_read_its_ranks_job_token(self):
        job, _ = run_to_end(self.client(), self.hostile("token-thief", "steal-token", restarts=0))
        self.assertEqual(state_name(job), "SUCCEEDED", job.failure_reason)
        with open(os.path.join(self.job_dir(job.id), "attempt-1", "rank-0.log")) as f:
            log = f.read()
        self.assertIn("hostile: token in own environment: none", log)
        self.assertIn("hostile: supervisor's environ: denied", log)
        self.assertIn("hostile: supervisor's mem: denied", log)

    def toy(self, name, *args, steps=6):
        return {
            "name": name,
            "script": {"command": ["/usr/bin/python3", "toy_train.py", "--steps", str(steps), *args],
                       "working_dir": self.scripts, "env": {"OMP_NUM_THREADS": "1"}},
            "global_batch_size": 16,
            "optimizer": {"lr": 0.001},
            "resources": {"min_devices": 2, "max_devices": 2, "per_device_batch": 8},
            "fault_tolerance": {"max_restarts": 0},
        }

    def rendezvous_port(self, job_id):
        """The MASTER_PORT the job's ranks were given, read as root from their environment."""
        def port():
            for pid in filter(str.isdigit, os.listdir("/proc")):
                try:
                    with open(f"/proc/{pid}/environ", "rb") as f:
                        env = dict(v.split(b"=", 1) for v in f.read().split(b"\0") if b"=" in v)
                except OSError:
                    continue
                if env.get(b"FITRUN_JOB_ID") == job_id.encode() and b"MASTER_PORT" in env:
                    return int(env[b"MASTER_PORT"])
            return None
        return wait_for(port, 60, f"{job_id}'s ranks to start")

    def as_bob(self, program, timeout=30):
        """Runs a Python program as bob's account (another user's, or any local account's); its output."""
        bob = pwd.getpwnam(self.bob)

        def become():
            os.setgid(bob.pw_gid)
            os.setgroups([])
            os.setuid(bob.pw_uid)
        return subprocess.run(["/usr/bin/python3", "-c", program], preexec_fn=become, capture_output=True,
                              text=True, timeout=timeout, cwd="/").stdout

    def test_another_account_cannot_take_an_attempts_rendezvous_port_before_its_ranks(self):
        # The ranks take five seconds before they meet: the port they were given must be held meanwhile.
        job_id = self.client().submit(self.toy("squatted", "--start_delay", "5"))
        port = self.rendezvous_port(job_id)
        said = self.as_bob(f"""
import socket, time
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
try:
    s.bind(("127.0.0.1", {port}))
    s.listen(16)
    print("squatted", flush=True)
    time.sleep(20)  # as a store the ranks would meet at
except OSError as error:
    print("refused:", error.strerror)
""")
        job = wait_for(lambda: (lambda j: j if state_name(j) in ("SUCCEEDED", "FAILED") else None)(
            self.client().get(job_id)), 240, f"{job_id} to end")
        self.assertIn("refused: Address already in use", said)
        self.assertEqual(state_name(job), "SUCCEEDED", job.failure_reason)

    def test_another_account_cannot_join_an_attempts_store(self):
        job_id = self.client().submit(self.toy("joined", "--step_seconds", "0.3", steps=40))
        port = self.rendezvous_port(job_id)
        wait_for(lambda: self.client().get(job_id).last_progress.step > 0, 120, f"{job_id} to train")
        # A 1.13 client's GETNUMKEYS, then a 2.x client's VALIDATE and PING: any answer means joined.
        said = self.as_bob(f"""
import socket, struct
for hello in (bytes([6]), bytes([0]) + struct.pack("<I", 0x3C85F7CE) + bytes([13]) + struct.pack("<I", 7)):
    s = socket.create_connection(("127.0.0.1", {port}), timeout=10)
    s.sendall(hello)
    try:
        reply = s.recv(8)
    except OSError:
        reply = b""
    print("answered" if reply else "refused", flush=True)
""")
        self.assertEqual(said.split(), ["refused", "refused"], said)
        job = wait_for(lambda: (lambda j: j if state_name(j) in ("SUCCEEDED", "FAILED") else None)(
            self.client().get(job_id)), 240, f"{job_id} to end")
        self.assertEqual(state_name(job), "SUCCEEDED", job.failure_reason)
        self.assertIn("refused a connection", self.daemon.log())

    def test_a_spec_reaching_another_accounts_private_file_through_proc_is_refused(self):
        bob = pwd.getpwnam(self.bob)
        private = os.path.join(self.data, f"bob-private-{os.getpid()}")
        inner = os.path.join(private, "inner")
        os.makedirs(inner)
        notes = os.path.join(inner, "notes.txt")
        with open(notes, "w") as f:
            f.write("bob's private notes. " * 200)
        for path in (private, inner, notes):
            os.chown(path, bob.pw_uid, bob.pw_gid)
        os.chmod(private, 0o700)  # alice cannot search it
        os.chmod(inner, 0o755)
        os.chmod(notes, 0o644)

        def become_bob():
            os.setgid(bob.pw_gid)
            os.setgroups([])
            os.setuid(bob.pw_uid)
        holder = subprocess.Popen(["/bin/sleep", "300"], cwd=inner, preexec_fn=become_bob)
        link = os.path.join(self.data, f"through-proc-{os.getpid()}.txt")
        try:
            os.symlink(f"/proc/{holder.pid}/cwd/notes.txt", link)
            os.lchown(link, self.alice_uid, -1)
            spec = {"name": "peek", "model": {"builtin": "gpt", "gpt": {"layers": 1, "heads": 2, "hidden": 32,
                                                                         "context": 16}},
                    "data": {"kind": "text", "path": link}, "optimizer": {"kind": "adamw", "lr": 0.001},
                    "global_batch_size": 8, "max_steps": 2, "resources": {"min_devices": 1, "max_devices": 1}}
            with self.assertRaises(ClientError) as refused:
                self.client().submit(spec)
            self.assertEqual(refused.exception.code, "INVALID_ARGUMENT", refused.exception)
            self.assertNotIn("bob-private", str(refused.exception))
        finally:
            holder.kill()
            holder.wait()
            os.remove(link)
            shutil.rmtree(private, ignore_errors=True)

    def test_a_spec_above_the_operators_ceilings_is_refused_naming_the_flag(self):
        for resources, flag in (({"host_memory": "1TiB"}, "--max_rank_host_memory"),
                                ({"max_processes": 1000000}, "--max_rank_processes")):
            spec = self.hostile("greedy", "none")
            spec["resources"].update(resources)
            with self.assertRaises(ClientError) as refused:
                self.client().submit(spec)
            self.assertEqual(refused.exception.code, "INVALID_ARGUMENT")
            self.assertIn(flag, str(refused.exception))


if __name__ == "__main__":
    junit_main.main()
