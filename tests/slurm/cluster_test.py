"""tests/slurm/cluster.py's SlurmCluster against Debian's real slurmctld, slurmd and munged: three nodes
come up idle at their own addresses; a 4-rank Gloo all_reduce runs across two of them through sbatch,
srun and fitrund's rank shim (worker/slurm/rank_shim.sh); scancel of a running job leaves none of its
processes; a job asking for more nodes than exist stays PENDING with a reason; stopping a cluster with a
job running leaves no process.

Skipped only when the daemons are not installed. The daemons' logs go to the test's undeclared outputs.
"""

import json
import os
import shutil
import sys
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from cluster import SlurmCluster, pid_alive, short_directory, skip_unless_installed, wait_for  # noqa: E402
import junit_main  # noqa: E402

PYTHON = "/usr/bin/python3"
RANK_SHIM = os.path.join(HERE, "..", "..", "worker", "slurm", "rank_shim.sh")
FINAL_JOB_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
                    "PREEMPTED", "BOOT_FAIL", "DEADLINE"}


def keep_logs(cluster, name):
    outputs = os.environ.get("TEST_UNDECLARED_OUTPUTS_DIR")
    if outputs and os.path.isdir(cluster.log_dir):
        shutil.copytree(cluster.log_dir, os.path.join(outputs, name), dirs_exist_ok=True)


def read(path):
    with open(path) as f:
        return f.read()


class SlurmClusterTest(unittest.TestCase):
    """One 3-node cluster for the whole class; each test leaves it with no job and every node idle."""

    @classmethod
    def setUpClass(cls):
        skip_unless_installed()
        cls.workdir = short_directory()
        started = time.monotonic()
        cls.cluster = SlurmCluster(cls.workdir, nodes=3, cpus_per_node=2, real_memory_mib=4096)
        try:
            cls.cluster.start()
        except BaseException:
            keep_logs(cls.cluster, "cluster-logs")
            shutil.rmtree(cls.workdir, ignore_errors=True)
            raise
        print(f"cluster of 3 nodes idle in {time.monotonic() - started:.2f} s", file=sys.stderr)

    @classmethod
    def tearDownClass(cls):
        cls.cluster.stop()
        keep_logs(cls.cluster, "cluster-logs")
        shutil.rmtree(cls.workdir, ignore_errors=True)

    def tearDown(self):
        self.cluster.run(["scancel", "--user", str(os.getuid())], check=False)
        wait_for(lambda: not self.cluster.run(["squeue", "--noheader", "--format=%i"]).stdout.strip(), 30,
                 "the queue to empty")
        self.cluster.wait_idle()

    def sbatch(self, *args):
        """Submits; returns the job id `sbatch --parsable` printed."""
        out = self.cluster.run(["sbatch", "--parsable", *args]).stdout.strip()
        return out.split(";")[0]

    def wait_job(self, job_id, states, timeout):
        """Waits until job `job_id` is in one of `states` (or any final state); returns its fields."""
        def reached():
            job = self.cluster.job(job_id)
            self.assertIsNotNone(job, f"job {job_id} vanished from slurmctld")
            state = job["JobState"]
            return job if state in states or state in FINAL_JOB_STATES else None
        return wait_for(reached, timeout, f"job {job_id} to be {'/'.join(sorted(states))}")

    def test_nodes_idle_at_their_addresses(self):
        nodes = self.cluster.nodes()
        self.assertEqual(sorted(nodes), ["n1", "n2", "n3"])
        for name, fields in nodes.items():
            self.assertEqual(fields["State"], "IDLE", name)
            self.assertEqual(fields["NodeAddr"], self.cluster.node_addr(name))
            self.assertEqual(fields["CPUTot"], "2", name)
            self.assertEqual(fields["RealMemory"], "4096", name)
        self.assertEqual([self.cluster.node_addr(n) for n in ("n1", "n2", "n3")],
                         ["127.0.0.2", "127.0.0.3", "127.0.0.4"])

    def test_gloo_all_reduce_across_two_nodes(self):
        out_dir = os.path.join(self.workdir, "ddp")
        os.makedirs(out_dir)
        script = os.path.join(out_dir, "job.sh")
        with open(script, "w") as f:
            # The rendezvous as fitrund's batch scripts set it: the first node's NodeAddr, a port from
            # the job id.
            f.write("#!/bin/sh\n"
                    "export OMP_NUM_THREADS=1\n"
                    'first=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)\n'
                    "export MASTER_ADDR=$(scontrol show node --oneliner \"$first\" | tr ' ' '\\n' | "
                    "sed -n 's/^NodeAddr=//p')\n"
                    "export MASTER_PORT=$((20000 + SLURM_JOB_ID % 10000))\n"
                    f"exec srun --kill-on-bad-exit=1 --output={out_dir}/rank-%t.out sh {RANK_SHIM} "
                    f"{PYTHON} {HERE}/allreduce.py\n")
        job_id = self.sbatch("--nodes=2", "--ntasks-per-node=2", f"--output={out_dir}/batch-%j.out",
                             "--job-name=allreduce", script)
        job = self.wait_job(job_id, {"COMPLETED"}, 90)
        outputs = {}
        for rank in range(4):
            path = os.path.join(out_dir, f"rank-{rank}.out")
            outputs[rank] = read(path) if os.path.exists(path) else "(no output)"
        batch = read(os.path.join(out_dir, f"batch-{job_id}.out"))
        self.assertEqual(job["JobState"], "COMPLETED",
                         f"{job}\nbatch:\n{batch}\n" + "\n".join(f"rank {r}:\n{o}" for r, o in outputs.items()))

        node_names = self.cluster.run(["scontrol", "show", "hostnames", job["NodeList"]]).stdout.split()
        self.assertEqual(len(node_names), 2, job["NodeList"])
        reports = [json.loads(outputs[rank].strip().splitlines()[-1]) for rank in range(4)]
        master_port = 20000 + int(job_id) % 10000
        for rank, report in enumerate(reports):
            self.assertEqual(report["rank"], rank)
            self.assertEqual(report["world_size"], 4)
            self.assertEqual(report["value"], 10.0, f"rank {rank}: 1+2+3+4 all-reduced")
            self.assertEqual(report["master"], f"{self.cluster.node_addr(node_names[0])}:{master_port}")
            self.assertEqual(report["local_world_size"], 2)
            self.assertEqual(report["group_rank"], report["slurm_node_id"])
            self.assertEqual(report["node"], node_names[report["slurm_node_id"]])
        self.assertEqual(sorted(r["slurm_node_id"] for r in reports), [0, 0, 1, 1])
        self.assertEqual(sorted((r["slurm_node_id"], r["local_rank"]) for r in reports),
                         [(0, 0), (0, 1), (1, 0), (1, 1)])

    def test_scancel_leaves_no_process(self):
        pid_dir = os.path.join(self.workdir, "cancelled")
        os.makedirs(pid_dir)
        job_id = self.sbatch("--nodes=2", "--ntasks-per-node=1", f"--output={pid_dir}/batch.out", "--wrap",
                             f"srun sh -c 'echo $$ > {pid_dir}/task-$SLURM_PROCID.pid; exec sleep 600'")
        pid_files = [os.path.join(pid_dir, f"task-{rank}.pid") for rank in range(2)]
        wait_for(lambda: all(os.path.exists(p) and os.path.getsize(p) for p in pid_files), 30, "both tasks")
        tasks = [int(read(p)) for p in pid_files]
        self.assertTrue(all(pid_alive(pid) for pid in tasks))
        before = self.cluster.job_processes(job_id)
        self.assertTrue(set(tasks) <= set(before), f"tasks {tasks} not among the job's processes {before}")

        self.cluster.run(["scancel", job_id])
        job = self.wait_job(job_id, {"CANCELLED"}, 30)
        self.assertEqual(job["JobState"], "CANCELLED")
        wait_for(lambda: not self.cluster.job_processes(job_id), 30, f"job {job_id}'s processes to end")
        self.assertFalse([pid for pid in before if pid_alive(pid)], "processes left by scancel")
        self.cluster.wait_idle()

    def test_more_nodes_than_exist_stays_pending(self):
        job_id = self.sbatch("--nodes=4", "--output=/dev/null", "--wrap", "true")

        def pending_with_reason():
            state, _, reason = self.cluster.run(
                ["squeue", "--noheader", "--format=%T|%r", "-j", job_id]).stdout.strip().partition("|")
            return (state, reason) if reason not in ("", "None") else None
        state, reason = wait_for(pending_with_reason, 30, f"a reason for job {job_id}")
        self.assertEqual(state, "PENDING")
        print(f"job asking for 4 of 3 nodes: {state}, reason {reason}", file=sys.stderr)

        self.cluster.run(["scancel", job_id])
        self.assertEqual(self.wait_job(job_id, {"CANCELLED"}, 30)["JobState"], "CANCELLED")


class StopTest(unittest.TestCase):
    """Leaving the `with` block while a job runs ends every daemon, slurmstepd and task."""

    @classmethod
    def setUpClass(cls):
        skip_unless_installed()

    def test_stop_with_a_running_job_leaves_no_process(self):
        workdir = short_directory()
        try:
            with SlurmCluster(workdir, nodes=2, gpus_per_node=2) as cluster:
                daemons = list(cluster.daemon_pids().values())
                self.assertEqual(len(daemons), 4, cluster.daemon_pids())
                gpus = cluster.run(["srun", "--nodes=2", "--ntasks-per-node=2", "--gpus-per-task=1", "sh", "-c",
                                    "echo $SLURMD_NODENAME $CUDA_VISIBLE_DEVICES"]).stdout.split("\n")
                self.assertEqual(sorted(filter(None, gpus)), ["n1 0", "n1 1", "n2 0", "n2 1"])
                job_id = cluster.run(["sbatch", "--parsable", "--nodes=2", "--output=/dev/null", "--wrap",
                                      "srun sleep 600"]).stdout.strip()
                wait_for(lambda: len(cluster.job_processes(job_id)) >= 4, 30,
                         "the batch step, two step daemons and two tasks")
                processes = cluster.job_processes(job_id)
                conf = cluster.conf_path
            keep_logs(cluster, "stop-logs")
            survivors = [pid for pid in daemons + processes if pid_alive(pid)]
            self.assertEqual(survivors, [], "processes left after stop()")
            marked = [pid for pid in map(int, filter(str.isdigit, os.listdir("/proc"))) if pid_alive(pid)
                      and f"SLURM_CONF={conf}".encode() in _environ(pid)]
            self.assertEqual(marked, [], "processes with the cluster's SLURM_CONF left after stop()")
        finally:
            shutil.rmtree(workdir, ignore_errors=True)


def _environ(pid):
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f.read().split(b"\0")
    except OSError:
        return []


if __name__ == "__main__":
    junit_main.main(argv=sys.argv[:1])
