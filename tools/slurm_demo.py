"""tools/slurm-demo.sh's body: a one-machine Slurm cluster, fitrund --cluster=slurm on it, one job across
two nodes, then everything torn down (the cluster fixture stops its daemons however this ends)."""

import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "slurm"))

from cluster import SlurmCluster, missing_daemons  # noqa: E402

BIN = os.path.join(ROOT, "bazel-bin")


def main(spec):
    if missing_daemons():
        sys.exit(f"Slurm is not installed ({', '.join(missing_daemons())}): run tools/install-deps.sh")
    # Short paths: Slurm's and munge's Unix sockets live under the cluster's directory.
    cluster_dir = tempfile.mkdtemp(prefix="fitrun-slurm-", dir="/tmp")
    shared_dir = tempfile.mkdtemp(prefix="fitrun-shared-", dir="/tmp")
    state_dir = os.path.join(shared_dir, "state")
    os.makedirs(state_dir)
    with SlurmCluster(cluster_dir, nodes=3, cpus_per_node=2) as cluster:
        print(f"Slurm cluster up: nodes {', '.join(cluster.node_names)} (SLURM_CONF={cluster.conf_path})")
        env = dict(os.environ, **cluster.env)
        log_path = os.path.join(state_dir, "fitrund.log")
        with open(log_path, "w") as log:
            daemon = subprocess.Popen(
                [os.path.join(BIN, "server/fitrund"), "--listen=127.0.0.1:0", "--metrics_listen=127.0.0.1:0",
                 f"--state_dir={state_dir}", "--cluster=slurm", "--slurm_virtual_devices=2x1GiB",
                 f"--shared_dir={shared_dir}", f"--worker_binary={os.path.join(BIN, 'worker/fitrun-worker')}",
                 "--stop_workers_on_exit"],
                env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            address_file = os.path.join(state_dir, "fitrund.address")
            for _ in range(300):
                if os.path.exists(address_file) or daemon.poll() is not None:
                    break
                time.sleep(0.1)
            if daemon.poll() is not None:
                sys.exit(open(log_path).read())
            address = open(address_file).read().strip()
            print(f"fitrund --cluster=slurm is serving on {address}")

            def fitrun(*args):
                print(f"\n$ fitrun {' '.join(args)}", flush=True)
                subprocess.run([os.path.join(BIN, "client/fitrun"), f"--coordinator={address}", *args], check=True)

            fitrun("devices")
            fitrun("plan", spec)
            fitrun("submit", spec, "--watch")
            print("\n$ squeue --states=all (what Slurm saw)", flush=True)
            print(cluster.run(["squeue", "--states=all"]).stdout)
        finally:
            daemon.terminate()
            daemon.wait(timeout=30)
    print(f"cluster stopped; the job's files are under {shared_dir}/jobs")


if __name__ == "__main__":
    main(sys.argv[1])
