"""The fitrun wheel as a user installs it: built from the tree (pip wheel, the in-tree backend), put
into a fresh virtual environment without Debian's packages, its dependencies (grpcio, protobuf) from
the package index at client/python/wheel-constraints.txt's versions, and used there against the real
fitrund with_fitrund.sh started (--address): a job submitted and watched to SUCCEEDED, another
cancelled while it runs.

Needs the package index (pip's cache serves a second run); without it the test fails naming pip's
error, since a user's install would too.
"""

import argparse
import glob
import os
import subprocess
import sys
import tempfile
import textwrap
import unittest

import junit_main

RUNFILES = os.path.join(os.environ.get("TEST_SRCDIR", ""), os.environ.get("TEST_WORKSPACE", "fitrun"))
ADDRESS = None

# What a user runs in the environment: only the wheel's fitrun and what pip put beside it.
CLIENT_SESSION = textwrap.dedent("""
    import sys, time
    import fitrun
    from fitrun import Client
    from fitrun.client import FINAL_STATES
    from fitrun.v1 import job_pb2
    print("module", fitrun.__file__)
    client = Client(sys.argv[1])
    name = lambda state: job_pb2.JobState.Name(state).replace("JOB_STATE_", "")

    def until(condition, seconds, what):
        deadline = time.monotonic() + seconds
        while not condition():
            if time.monotonic() > deadline:
                sys.exit(f"timed out waiting for {what}")
            time.sleep(0.2)

    mlp = {"name": "wheel-mlp", "model": {"builtin": "mlp"},
           "data": {"kind": "fashion_mnist", "path": "/usr/share/datasets/fashion-mnist"},
           "optimizer": {"kind": "sgd", "lr": 0.05}, "global_batch_size": 128, "max_steps": 5,
           "resources": {"min_devices": 1, "max_devices": 1}, "seed": 3}
    done = client.submit(mlp)
    seen = [name(e.state_changed.to) for e in client.watch(done) if e.HasField("state_changed")]
    print("watched", done, ",".join(seen), name(client.get(done).state))

    running = client.submit(dict(mlp, name="wheel-long", max_steps=100000))
    until(lambda: client.get(running).last_progress.step > 0, 120, "the long job's first step")
    client.cancel(running, reason="the wheel test cancels it")
    until(lambda: client.get(running).state in FINAL_STATES, 60, "the cancelled job to end")
    print("cancelled", running, name(client.get(running).state))
""")


def run(command, **kwargs):
    result = subprocess.run(command, capture_output=True, text=True, **kwargs)
    if result.returncode != 0:
        raise AssertionError(f"{' '.join(command)} exited {result.returncode}:\n{result.stdout}\n{result.stderr}")
    return result


class WheelTest(unittest.TestCase):
    def test_the_wheel_installs_from_the_index_and_submits_watches_and_cancels(self):
        work = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
        # A copy of the package's tree (the runfiles are links; pip builds from a real folder).
        source = os.path.join(work, "src")
        os.makedirs(os.path.join(source, "client"))
        subprocess.run(["cp", "-rL", os.path.join(RUNFILES, "client/python"), os.path.join(source, "client/python")],
                       check=True)
        subprocess.run(["cp", "-rL", os.path.join(RUNFILES, "proto"), os.path.join(source, "proto")], check=True)
        wheels = os.path.join(work, "wheels")
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
        env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
        run(["/usr/bin/python3", "-m", "pip", "wheel", "--no-deps", "--no-index", "-w", wheels,
             os.path.join(source, "client/python")], env=env)
        (wheel,) = glob.glob(os.path.join(wheels, "fitrun-*.whl"))

        venv = os.path.join(work, "venv")
        run(["/usr/bin/python3", "-m", "venv", venv], env=env)  # no system site packages
        python = os.path.join(venv, "bin", "python")
        run([python, "-m", "pip", "install", "--quiet", "--constraint",
             os.path.join(RUNFILES, "client/python/wheel-constraints.txt"), wheel], env=env)
        installed = run([python, "-m", "pip", "list", "--format=freeze"], env=env).stdout
        for pinned in open(os.path.join(RUNFILES, "client/python/wheel-constraints.txt")):
            pinned = pinned.split("#")[0].strip()
            if pinned:
                self.assertIn(pinned, installed.splitlines())
        self.assertIn("fitrun==", installed)

        result = run([python, "-c", CLIENT_SESSION, ADDRESS], env=env, cwd=work, timeout=300)
        print(result.stdout)
        said = {line.split(" ")[0]: line.split(" ")[1:] for line in result.stdout.splitlines()}
        # The wheel's own module, not the runfiles' or Debian's.
        self.assertTrue(said["module"][0].startswith(os.path.join(venv, "lib")), said["module"])
        job, states, final = said["watched"]
        self.assertEqual(final, "SUCCEEDED")
        self.assertEqual(states.split(",")[-1], "SUCCEEDED")
        self.assertIn("RUNNING", states.split(","))
        self.assertEqual(said["cancelled"][1], "CANCELLED")


def main():
    global ADDRESS
    parser = argparse.ArgumentParser()
    parser.add_argument("--address", required=True)
    args, rest = parser.parse_known_args()
    ADDRESS = args.address
    junit_main.main(argv=[sys.argv[0]] + rest)


if __name__ == "__main__":
    main()
