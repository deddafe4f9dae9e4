"""Three users of one real fitrund, as root with throwaway Unix accounts: alice and bob run their jobs
while mallory does everything one user can to harm them or the daemon:

- floods the WorkerChannel with her own job's token (in every Slurm job's environment): log lines,
  progress with forged 60 GB peaks, and endless failure, out-of-memory and final reports, from four
  streams at once, and hellos with made-up tokens for alice's and bob's ranks;
- floods PlanJob from eight threads with a new workload every call (each would queue a memory probe);
- takes, as her account, the rendezvous port of every attempt of alice's and bob's she learns of
  (the test reads it for her, as an attacker able to guess it would), or joins the store behind it.

Every honest job SUCCEEDS with its expected steps, among them alice's script that names no batch
(planned from its own first run); mallory's squats and joins all fail; fitrund's resident memory and its store
stay under the bounds below, which the test prints with what it measured.

Skipped, and reported as skipped, when not run as root.
"""

import hashlib
import os
import pwd
import shutil
import socket
import sqlite3
import struct
import subprocess
import tempfile
import threading
import time
import unittest

import grpc

from accounts import install_for_accounts, token_line, useradd, userdel, world_readable
from fitrun.client import Client, ClientError
from fitrun.v1 import job_pb2, worker_pb2, worker_pb2_grpc
from jobs import Fitrund, state_name, wait_for
import junit_main

TESTS = os.path.dirname(os.path.abspath(__file__))
# What fitrund may hold while all of it goes on: its resident memory (it starts at about 20 MiB
# here), and its store (what the jobs store, mallory's capped at --max_events_per_job).
MAX_RSS_BYTES = 200 << 20
MAX_STORE_BYTES = 32 << 20
EVENT_CAP = 5000


def rss_bytes(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def store_bytes(state_dir):
    db = sqlite3.connect(f"file:{os.path.join(state_dir, 'fitrun.db')}?mode=ro", uri=True, timeout=10)
    try:
        pages, free, size = (db.execute(f"PRAGMA {p}").fetchone()[0] for p in ("page_count", "freelist_count",
                                                                             "page_size"))
        return (pages - free) * size
    finally:
        db.close()


def token_of(state_dir, job_id):
    db = sqlite3.connect(f"file:{os.path.join(state_dir, 'fitrun.db')}?mode=ro", uri=True, timeout=10)
    try:
        return db.execute("SELECT token FROM jobs WHERE id = ?", (job_id,)).fetchone()[0]
    finally:
        db.close()


def rendezvous_ports(job_ids):
    """The MASTER_PORT of every live rank of `job_ids`, read as root from /proc."""
    wanted = {j.encode() for j in job_ids}
    ports = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = dict(v.split(b"=", 1) for v in f.read().split(b"\0") if b"=" in v)
        except OSError:
            continue
        if env.get(b"FITRUN_JOB_ID") in wanted and b"MASTER_PORT" in env:
            ports.add(int(env[b"MASTER_PORT"]))
    return ports


class ThreeUsersTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        if os.geteuid() != 0:
            raise unittest.SkipTest("needs root: fitrund runs jobs as other accounts only as root")
        cls.accounts = []
        cls.work = tempfile.mkdtemp(prefix="fitrun-three-", dir="/tmp")
        os.chmod(cls.work, 0o755)
        suffix = os.getpid()
        cls.names = {user: f"ft{user[0]}{suffix}" for user in ("alice", "bob", "mallory")}
        for account in cls.names.values():
            useradd(account)
            cls.accounts.append(account)
        worker = install_for_accounts(os.path.join(cls.work, "install"))
        cls.scripts = os.path.join(cls.work, "scripts")
        os.makedirs(cls.scripts)
        shutil.copy(os.path.join(TESTS, "scripts", "toy_train.py"), cls.scripts)
        cls.corpus = os.path.join(cls.scripts, "corpus.txt")
        with open(cls.corpus, "w") as f:
            f.write("fitrun trains what fits on the devices it has. " * 2000)
        world_readable(cls.scripts)
        tokens = os.path.join(cls.work, "tokens")
        with open(tokens, "w") as f:
            for user, account in cls.names.items():
                f.write(token_line(user, f"{user}-token", account))
        cls.state = os.path.join(cls.work, "state")
        cls.daemon = Fitrund(cls.state, ["--devices=cpu:3x1GiB", f"--auth_tokens={tokens}",
                                         f"--max_events_per_job={EVENT_CAP}", "--max_rank_host_memory=8GiB",
                                         "--max_rank_processes=4096"],
                             worker=worker, data_roots=f"{cls.scripts},/usr/share/datasets")
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

    def client(self, user):
        return Client(self.daemon.address, timeout=60, token=f"{user}-token")

    @staticmethod
    def mlp(name, steps):
        return {"name": name, "model": {"builtin": "mlp"},
                "data": {"kind": "fashion_mnist", "path": "/usr/share/datasets/fashion-mnist"},
                "optimizer": {"kind": "sgd", "lr": 0.05}, "global_batch_size": 32, "max_steps": steps,
                "resources": {"min_devices": 1, "max_devices": 1}}

    def script(self, name, steps, devices, fixed_batch=True, extra=()):
        spec = {"name": name,
                "script": {"command": ["/usr/bin/python3", "toy_train.py", "--steps", str(steps), *extra],
                           "working_dir": self.scripts, "env": {"OMP_NUM_THREADS": "1"}},
                "global_batch_size": 16, "optimizer": {"lr": 0.001},
                "resources": {"min_devices": devices, "max_devices": devices},
                "fault_tolerance": {"max_restarts": 0}}
        if fixed_batch:
            spec["resources"]["per_device_batch"] = 16 // devices
        else:
            spec["script"]["batch_flag"] = "--batch_size"
        return spec

    def as_mallory(self, program):
        """Starts a Python program as mallory's account; returns the process."""
        account = pwd.getpwnam(self.names["mallory"])

        def become():
            os.setgid(account.pw_gid)
            os.setgroups([])
            os.setuid(account.pw_uid)
        return subprocess.Popen(["/usr/bin/python3", "-c", program], preexec_fn=become, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, cwd="/")

    # ---- mallory's attacks, each on threads of its own until `stop` is set ----

    def flood_reports(self, job_id, stop, counts):
        token = token_of(self.state, job_id)
        hello = worker_pb2.WorkerReport(hello=worker_pb2.Hello(job_id=job_id, attempt=1, rank=0, world_size=1,
                                                               job_token=token))
        reason = "forged " * 2300

        def reports():
            yield hello
            i = 0
            while not stop.is_set():
                i += 1
                yield worker_pb2.WorkerReport(log=job_pb2.LogLine(text=f"mallory's line {i}"))
                yield worker_pb2.WorkerReport(progress=job_pb2.Progress(step=i, peak_bytes=60 << 30, live_bytes=1))
                yield worker_pb2.WorkerReport(failed=worker_pb2.RankFailed(reason=reason))
                yield worker_pb2.WorkerReport(oom=job_pb2.OutOfMemory(step=i, requested_bytes=1 << 40))
                yield worker_pb2.WorkerReport(finished=job_pb2.RankFinished(steps=i))
                counts["reports"] += 5

        while not stop.is_set():
            try:
                with grpc.insecure_channel(self.daemon.address) as channel:
                    for _ in worker_pb2_grpc.WorkerChannelStub(channel).Connect(reports(), timeout=600):
                        pass
            except grpc.RpcError as error:
                counts["streams_ended"] += 1
                if stop.wait(0.2):
                    return

    def forge_hellos(self, victims, stop, counts):
        with grpc.insecure_channel(self.daemon.address) as channel:
            stub = worker_pb2_grpc.WorkerChannelStub(channel)
            while not stop.is_set():
                for job_id in list(victims):
                    hello = worker_pb2.WorkerReport(hello=worker_pb2.Hello(
                        job_id=job_id, attempt=1, rank=0, world_size=1, job_token=os.urandom(16).hex()))
                    try:
                        list(stub.Connect(iter([hello]), timeout=10))
                        counts["hellos_answered"] += 1
                    except grpc.RpcError:
                        counts["hellos_refused"] += 1
                stop.wait(0.05)

    def flood_plans(self, stop, counts, thread):
        mallory = self.client("mallory")
        i = 0
        while not stop.is_set():
            i += 1
            # A workload of its own every time (its width), tight on a device, so measured before a plan.
            spec = {"name": f"probe-me-{thread}-{i}", "model": {"builtin": "gpt", "gpt": {
                        "layers": 2, "heads": 4, "hidden": 256 + 4 * ((thread * 100000 + i) % 4093), "context": 128}},
                    "data": {"kind": "text", "path": self.corpus},
                    "optimizer": {"kind": "adamw", "lr": 0.001}, "global_batch_size": 256, "max_steps": 2,
                    "resources": {"min_devices": 1, "max_devices": 1}}
            try:
                mallory.plan(spec)
                counts["plans_answered"] += 1
            except ClientError as error:
                refused = error.reason == "PLANS_PER_USER_LIMIT"
                counts["plans_refused" if refused else "plans_failed"] += 1
                if not refused and len(counts["plan_errors"]) < 3:
                    counts["plan_errors"].append(str(error)[:200])

    def squat_and_join(self, honest_jobs, stop, counts):
        tried = set()
        while not stop.is_set():
            for port in rendezvous_ports(honest_jobs) - tried:
                tried.add(port)
                said = self.as_mallory(f"""
import socket, struct
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
try:
    s.bind(("127.0.0.1", {port}))
    s.listen(8)
    print("squatted")
except OSError:
    print("squat refused")
c = socket.create_connection(("127.0.0.1", {port}), timeout=10)
c.sendall(bytes([0]) + struct.pack("<I", 0x3C85F7CE) + bytes([13]) + struct.pack("<I", 7))
try:
    print("joined" if c.recv(4) else "join refused")
except OSError:
    print("join refused")
""").communicate(timeout=60)[0]
                # What she did counts while the attempt is on: a port its ranks let go is anyone's.
                if port not in rendezvous_ports(honest_jobs):
                    continue
                for word in ("squatted", "squat refused", "joined", "join refused"):
                    counts[word] += said.split("\n").count(word)
            stop.wait(0.2)

    def test_two_users_jobs_succeed_while_a_third_attacks_and_fitrund_stays_bounded(self):
        alice, bob, mallory = self.client("alice"), self.client("bob"), self.client("mallory")
        started = time.monotonic()
        baseline_rss = rss_bytes(self.daemon.process.pid)
        # Mallory's own job, for its token: a script that does little for as long as the test runs.
        mallorys = mallory.submit(self.script("mallorys", 100000, 1, extra=("--step_seconds", "1")))
        wait_for(lambda: mallory.get(mallorys).last_progress.step > 0, 180, "mallory's job to run")

        stop = threading.Event()
        counts = {k: 0 for k in ("reports", "streams_ended", "hellos_answered", "hellos_refused", "plans_answered",
                                 "plans_refused", "plans_failed", "squatted", "squat refused", "joined",
                                 "join refused")}
        counts["plan_errors"] = []
        honest = []
        attacks = [threading.Thread(target=self.flood_reports, args=(mallorys, stop, counts)) for _ in range(4)]
        attacks += [threading.Thread(target=self.forge_hellos, args=(honest, stop, counts))]
        attacks += [threading.Thread(target=self.flood_plans, args=(stop, counts, t)) for t in range(8)]
        attacks += [threading.Thread(target=self.squat_and_join, args=(honest, stop, counts))]
        for attack in attacks:
            attack.start()

        peak_rss = [baseline_rss]

        def watch_rss():
            while not stop.wait(0.5):
                peak_rss.append(rss_bytes(self.daemon.process.pid))
        watcher = threading.Thread(target=watch_rss)
        watcher.start()
        try:
            # Alice and bob: built-in jobs, a 2-rank script meeting at its rendezvous, and alice's
            # script that names no batch, planned from its own first run.
            expected = {}
            for client, user in ((alice, "alice"), (bob, "bob")):
                for i in range(2):
                    job_id = client.submit(self.mlp(f"{user}-mlp-{i}", 20))
                    expected[job_id] = (client, 20)
                job_id = client.submit(self.script(f"{user}-ddp", 6, 2, extra=("--start_delay", "1")))
                expected[job_id] = (client, 6)
            job_id = alice.submit(self.script("alice-measured", 4, 1, fixed_batch=False))
            expected[job_id] = (alice, 4)
            honest.extend(expected)

            def all_ended():
                ended = {}
                for job_id, (client, _) in expected.items():
                    job = client.get(job_id)
                    if state_name(job) not in ("SUCCEEDED", "FAILED", "CANCELLED"):
                        return None
                    ended[job_id] = job
                return ended
            ended = wait_for(all_ended, 900, "alice's and bob's jobs to end")
        finally:
            stop.set()
            for attack in attacks:
                attack.join(120)
            watcher.join()
        took = time.monotonic() - started
        mallory.cancel(mallorys)
        wait_for(lambda: state_name(mallory.get(mallorys)) in ("CANCELLED", "FAILED"), 60, "mallory's job to end")
        stored = store_bytes(self.state)
        print(f"three users: {len(ended)} honest jobs in {took:.0f} s; mallory sent {counts['reports']} forged "
              f"reports ({counts['streams_ended']} streams ended), {counts['hellos_refused']} forged hellos refused "
              f"and {counts['hellos_answered']} answered, {counts['plans_answered']} plans answered, "
              f"{counts['plans_refused']} refused ({counts['plans_failed']} failed otherwise), squats "
              f"{counts['squatted']} taken / {counts['squat refused']} refused, joins {counts['joined']} / "
              f"{counts['join refused']} refused; fitrund's resident memory {baseline_rss / 2**20:.0f} MiB at "
              f"start, {max(peak_rss) / 2**20:.0f} MiB at most (bound {MAX_RSS_BYTES >> 20} MiB); its store "
              f"{stored / 2**20:.1f} MiB (bound {MAX_STORE_BYTES >> 20} MiB); plan errors other than the limit: "
              f"{counts['plan_errors']}", flush=True)
        for job_id, job in ended.items():
            self.assertEqual(state_name(job), "SUCCEEDED", f"{job_id} {job.spec.name}: {job.failure_reason}")
            steps = expected[job_id][1]
            self.assertEqual(job.last_progress.step, steps, f"{job_id} {job.spec.name}")
        measured = ended[honest[-1]]
        self.assertFalse(any("analytic estimate" in r for r in measured.plan.reasons), measured.plan.reasons)
        self.assertGreater(counts["reports"], 10000, "the flood ran")
        self.assertGreater(counts["plans_refused"], 0)
        self.assertEqual(counts["hellos_answered"], 0)
        self.assertGreater(counts["squat refused"] + counts["join refused"], 0, "mallory found ports to try")
        self.assertEqual((counts["squatted"], counts["joined"]), (0, 0))
        self.assertLess(max(peak_rss), MAX_RSS_BYTES)
        self.assertLess(stored, MAX_STORE_BYTES)


if __name__ == "__main__":
    junit_main.main()
