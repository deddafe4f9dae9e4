"""Each job runs as its owner's Unix account, with a real fitrund as root, real throwaway accounts
and real script ranks: a user without an account is refused at submit naming why; a rank runs with
its owner's uid and cannot read another user's job directory, log or data, nor fitrund's database;
a spec naming a file its owner cannot read is refused at submit though fitrund (root) could read
it; job directories are their owners' (0700) and fitrund's state its own.

The accounts are made with useradd and removed at the end; the binaries the ranks run are copied
where the accounts can reach them (tests/accounts.py). Skipped, and reported as skipped, when not run as root.
"""

import glob
import os
import shutil
import stat
import tempfile
import unittest

from accounts import install_for_accounts, token_line, useradd, userdel, world_readable
from fitrun.client import Client, ClientError
from jobs import Fitrund, run_to_end, state_name
import junit_main

TESTS = os.path.dirname(os.path.abspath(__file__))


class OwnersTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        if os.geteuid() != 0:
            raise unittest.SkipTest("needs root: fitrund runs jobs as other accounts only as root")
        cls.accounts = []
        cls.work = tempfile.mkdtemp(prefix="fitrun-owners-", dir="/tmp")
        os.chmod(cls.work, 0o755)
        suffix = os.getpid()
        cls.alice, cls.bob = f"fra{suffix}", f"frb{suffix}"
        cls.alice_uid = useradd(cls.alice)
        cls.accounts.append(cls.alice)
        cls.bob_uid = useradd(cls.bob)
        cls.accounts.append(cls.bob)

        # What ranks run, where every account can reach it.
        worker = install_for_accounts(os.path.join(cls.work, "install"))
        scripts = os.path.join(cls.work, "scripts")
        os.makedirs(scripts)
        for script in ("toy_train.py", "owner_check.py"):
            shutil.copy(os.path.join(TESTS, "scripts", script), scripts)
        world_readable(scripts)

        # Bob's own data, his alone; and a script of his.
        cls.data = os.path.join(cls.work, "data")
        cls.bob_data = os.path.join(cls.data, "bob")
        os.makedirs(cls.bob_data)
        os.chmod(cls.data, 0o755)
        cls.bob_secret = os.path.join(cls.bob_data, "secret.txt")
        with open(cls.bob_secret, "w") as f:
            f.write("bob's\n")
        cls.bob_script = os.path.join(cls.bob_data, "train.py")
        shutil.copy(os.path.join(scripts, "toy_train.py"), cls.bob_script)
        for path in (cls.bob_data, cls.bob_secret, cls.bob_script):
            os.chown(path, cls.bob_uid, cls.bob_uid)
        os.chmod(cls.bob_data, 0o700)

        tokens = os.path.join(cls.work, "tokens")
        with open(tokens, "w") as f:
            f.write(token_line("alice", "alice-token", cls.alice))
            f.write(token_line("bob", "bob-token", cls.bob))
            f.write(token_line("carol", "carol-token"))  # no Unix account
        cls.state = os.path.join(cls.work, "state")
        cls.scripts = scripts
        cls.daemon = Fitrund(cls.state, ["--devices=cpu:2x512MiB", f"--auth_tokens={tokens}"],
                             worker=worker,
                             data_roots=f"{cls.data},{scripts},/usr/share/datasets")
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

    def client(self, token):
        return Client(self.daemon.address, timeout=30, token=token)

    def script_spec(self, name, command, **extra):
        spec = {
            "name": name,
            "script": {"command": command, "working_dir": self.scripts, "env": {"OMP_NUM_THREADS": "1"}},
            "global_batch_size": 16,
            "optimizer": {"lr": 0.001},
            "resources": {"min_devices": 1, "max_devices": 1},
            "fault_tolerance": {"max_restarts": 0},
        }
        spec.update(extra)
        return spec

    def job_dir(self, job_id):
        return os.path.join(self.state, "jobs", job_id)

    def rank_log(self, job_id):
        logs = sorted(glob.glob(os.path.join(self.job_dir(job_id), "attempt-*", "rank-0.log")))
        self.assertTrue(logs, f"no rank log for {job_id}")
        with open(logs[-1]) as f:
            return f.read()

    def test_a_user_without_a_unix_account_is_refused_at_submit_naming_why(self):
        spec = self.script_spec("carols", ["/usr/bin/python3", "toy_train.py", "--steps", "2"])
        with self.assertRaises(ClientError) as refused:
            self.client("carol-token").submit(spec)
        self.assertEqual(refused.exception.code, "FAILED_PRECONDITION")
        self.assertIn("user carol has no Unix account", str(refused.exception))
        self.assertEqual(list(self.client("carol-token").list()), [], "nothing was stored")

    def test_a_spec_naming_a_file_its_owner_cannot_read_is_refused_though_fitrund_could(self):
        spec = self.script_spec("bobs-script", ["/usr/bin/python3", self.bob_script, "--steps", "2"])
        with self.assertRaises(ClientError) as refused:
            self.client("alice-token").submit(spec)
        self.assertEqual(refused.exception.code, "INVALID_ARGUMENT")
        self.assertIn("spec.script.command[1]", str(refused.exception))
        # Bob may name his own script.
        job_id = self.client("bob-token").submit(spec)
        self.client("bob-token").cancel(job_id, "the test only needed it accepted")

    def test_ranks_run_as_their_owner_and_cannot_read_another_users_files(self):
        bob, _ = run_to_end(self.client("bob-token"), self.script_spec(
            "bobs", ["/usr/bin/python3", "owner_check.py", "--steps", "2", "--own_checkpoints"]))
        self.assertEqual(state_name(bob), "SUCCEEDED", bob.failure_reason)
        self.assertEqual(bob.run_as, self.bob)
        self.assertIn(f"uid {self.bob_uid}\n", self.rank_log(bob.id))
        bob_dir = self.job_dir(bob.id)
        info = os.stat(bob_dir)
        self.assertEqual((info.st_uid, stat.S_IMODE(info.st_mode)), (self.bob_uid, 0o700))
        bob_log = sorted(glob.glob(os.path.join(bob_dir, "attempt-*", "rank-0.log")))[-1]
        self.assertEqual(os.stat(bob_log).st_uid, self.bob_uid, "the log was opened as its rank")

        forbidden = [bob_dir, bob_log, os.path.join(bob_dir, "checkpoints"), self.bob_secret,
                     os.path.join(self.state, "fitrun.db"), os.path.join(self.state, "jobs")]
        alice, _ = run_to_end(self.client("alice-token"), self.script_spec(
            "alices", ["/usr/bin/python3", "owner_check.py", "--try", ",".join(forbidden), "--steps", "2"]))
        self.assertEqual(state_name(alice), "SUCCEEDED", alice.failure_reason)
        log = self.rank_log(alice.id)
        self.assertIn(f"uid {self.alice_uid}\n", log)
        for path in forbidden:
            self.assertIn(f"denied {path}\n", log, f"alice's rank could get at {path}:\n{log}")

    def test_fitrunds_own_state_is_its_alone(self):
        def mode(path):
            info = os.stat(path)
            return info.st_uid, stat.S_IMODE(info.st_mode)

        self.assertEqual(mode(self.state), (0, 0o711), "others pass through to their job directories only")
        self.assertEqual(mode(os.path.join(self.state, "jobs")), (0, 0o711))
        self.assertEqual(mode(os.path.join(self.state, "fitrun.db")), (0, 0o600))


if __name__ == "__main__":
    junit_main.main()
