"""fitrun.Client against the real fitrund that python_client_test.sh started (--address).

CoordinatorTest: each test submits its own jobs; they share the daemon and its two virtual CPU
devices, so they wait for the devices to be free again rather than for fixed times. PackageTest:
where the package comes from, and what the client sends and retries, against recording fakes.
"""

import argparse
import json
import os
import sys
import tempfile
import time
import unittest

import grpc

import fitrun.client
import fitrun.v1.job_pb2
from fitrun.client import Client, ClientError
from fitrun.v1 import coordinator_pb2
from fitrun.v1 import job_pb2
from jobs import wait_for
import junit_main

ADDRESS = None  # set from --address in main

DATA = "/usr/share/datasets/fashion-mnist"


def mlp_spec(name, max_steps):
    return {
        "name": name,
        "model": {"builtin": "mlp"},
        "data": {"kind": "fashion_mnist", "path": DATA},
        "optimizer": {"kind": "sgd", "lr": 0.05, "momentum": 0.9},
        "global_batch_size": 256,
        "max_steps": max_steps,
        "resources": {"min_devices": 2, "max_devices": 2},
        "seed": 7,
    }


class PackageTest(unittest.TestCase):
    def test_comes_from_the_runfiles_and_does_not_import_torch(self):
        # PYTHONPATH names the runfiles' client/python; a module found anywhere else (an installed
        # fitrun, or a fitrun.pth an old set-up left) would mean the Bazel-generated stubs are not what this test exercises.
        root = os.environ["PYTHONPATH"].split(os.pathsep)[0]
        for module in (fitrun.client, fitrun.v1.job_pb2):
            self.assertTrue(module.__file__.startswith(root + os.sep), f"{module.__name__} from {module.__file__}")
        self.assertNotIn("torch", sys.modules)
        # What the package's __init__ exports for notebooks (lazily, so ranks need no grpc).
        self.assertIs(fitrun.Client, Client)
        self.assertIs(fitrun.ClientError, ClientError)

    def test_specs_go_as_the_cli_sends_them_with_the_working_directory(self):
        sent = []

        class RecordingStub:
            def SubmitJob(self, request, timeout, metadata=None):
                sent.append(request)
                return coordinator_pb2.SubmitJobResponse(job=job_pb2.Job(id="j-recorded"))

            def PlanJob(self, request, timeout, metadata=None):
                sent.append(request)
                return coordinator_pb2.PlanJobResponse()

        client = Client("127.0.0.1:1")  # never dialled: the stub is replaced
        client._stub = RecordingStub()
        spec = {"name": "s", "script": {"command": ["train.py"], "working_dir": "sub"}}
        self.assertEqual(client.submit(spec), "j-recorded")
        self.assertEqual(json.loads(sent[0].spec_yaml), spec)  # a dict as JSON, which is YAML
        yaml_text = "name: s\nscript: {command: [x], working_dir: rel}\n"
        client.plan(yaml_text)
        self.assertEqual(sent[1].spec_yaml, yaml_text)  # text verbatim, as the CLI sends a file
        client.submit(job_pb2.JobSpec(name="s"))
        self.assertEqual(sent[2].spec.name, "s")
        for request in sent:
            self.assertEqual(request.client_dir, os.getcwd())
        with self.assertRaises(ValueError):
            client.submit({"name": "s", "optimizer": {"lr": float("nan")}})
        client.close()

    def test_watch_resumes_after_the_last_event_when_the_stream_is_lost(self):
        # A restarted fitrund drops the stream mid-job; the watch reconnects and asks for the rest.
        class Lost(grpc.RpcError):
            def code(self):
                return grpc.StatusCode.UNAVAILABLE

            def details(self):
                return "connection reset"

        class Call:
            def __init__(self, events, then_lose):
                self.events, self.then_lose = events, then_lose

            def __iter__(self):
                yield from self.events
                if self.then_lose:
                    raise Lost()

            def cancel(self):
                pass

        def event(sequence, to=None):
            e = job_pb2.JobEvent(job_id="j-1", sequence=sequence)
            if to is not None:
                e.state_changed.to = to
            return e

        requested = []

        class FlakyStub:
            def WatchJob(self, request, metadata=None):
                requested.append(request.from_sequence)
                if len(requested) == 1:
                    return Call([event(1, job_pb2.JOB_STATE_QUEUED), event(2)], then_lose=True)
                if len(requested) == 2:
                    return Call([], then_lose=True)  # not back yet
                return Call([event(3), event(4, job_pb2.JOB_STATE_SUCCEEDED)], then_lose=False)

        client = Client("127.0.0.1:1")
        client._stub = FlakyStub()
        self.assertEqual([e.sequence for e in client.watch("j-1")], [1, 2, 3, 4])
        self.assertEqual(requested, [1, 3, 3])

        class DeadStub:
            def WatchJob(self, request, metadata=None):
                return Call([event(1)] if request.from_sequence == 1 else [], then_lose=True)

        client._stub = DeadStub()
        with self.assertRaises(ClientError) as raised:
            list(client.watch("j-1", reconnect_for=0.5))
        self.assertEqual(raised.exception.code, "UNAVAILABLE")
        client.close()


class CoordinatorTest(unittest.TestCase):
    def setUp(self):
        self.client = Client(ADDRESS, timeout=10.0)
        self.addCleanup(self.client.close)
        # A previous test's cancelled ranks may still be stopping.
        wait_for(lambda: all(not d.job_id for d in self.client.devices()), 60, "both devices free")

    def submit(self, spec):
        """Submits, and makes sure a test that fails midway leaves no job running for the next."""
        job_id = self.client.submit(spec)
        self.addCleanup(self.cancel_unless_ended, job_id)
        return job_id

    def cancel_unless_ended(self, job_id):
        if self.client.get(job_id).state not in fitrun.client.FINAL_STATES:
            self.client.cancel(job_id, reason="the test failed")

    def test_devices(self):
        devices = self.client.devices()
        self.assertEqual(sorted(d.id for d in devices), ["cpu:0", "cpu:1"])
        self.assertTrue(all(d.kind == job_pb2.DEVICE_KIND_CPU for d in devices))

    def test_without_an_address_it_connects_where_fitrun_coordinator_says_as_the_cli_does(self):
        saved = os.environ.pop("FITRUN_COORDINATOR", None)
        try:
            with Client() as client:
                self.assertEqual(client.address, "127.0.0.1:7070")
            os.environ["FITRUN_COORDINATOR"] = ADDRESS
            with Client() as client:
                self.assertEqual(client.address, ADDRESS)
                self.assertEqual(sorted(d.id for d in client.devices()), ["cpu:0", "cpu:1"])
            with Client("127.0.0.1:1") as client:  # an address given wins
                self.assertEqual(client.address, "127.0.0.1:1")
        finally:
            os.environ.pop("FITRUN_COORDINATOR", None)
            if saved is not None:
                os.environ["FITRUN_COORDINATOR"] = saved

    def test_plan_from_dict_text_and_file_agree(self):
        spec = mlp_spec("py-plan", 3)
        by_dict = self.client.plan(spec)
        self.assertIsInstance(by_dict, coordinator_pb2.PlanJobResponse)
        self.assertEqual(list(by_dict.plan.device_ids), ["cpu:0", "cpu:1"])
        self.assertEqual(by_dict.plan.total_steps, 3)
        self.assertEqual(by_dict.spec.name, "py-plan")

        yaml_text = "\n".join(
            [
                "name: py-plan",
                "model: {builtin: mlp}",
                f"data: {{kind: fashion_mnist, path: {DATA}}}",
                "optimizer: {kind: sgd, lr: 0.05, momentum: 0.9}",
                "global_batch_size: 256",
                "max_steps: 3",
                "resources: {min_devices: 2, max_devices: 2}",
                "seed: 7",
                "",
            ]
        )
        by_text = self.client.plan(yaml_text)
        with tempfile.NamedTemporaryFile("w", suffix=".yaml", dir=os.getcwd()) as f:
            f.write(yaml_text)
            f.flush()
            by_path = self.client.plan(os.path.basename(f.name))  # relative to the cwd, as the CLI's
        for other in (by_text, by_path):
            self.assertEqual(other.spec, by_dict.spec)
            self.assertEqual(other.plan.per_device_batch, by_dict.plan.per_device_batch)
            self.assertEqual(list(other.plan.device_ids), list(by_dict.plan.device_ids))
        with self.assertRaises(FileNotFoundError):
            self.client.plan("no-such-spec.yaml")

    def test_script_working_dir_is_relative_to_this_process(self):
        # fitrund resolves it against the client_dir the client sends: this test's directory.
        os.makedirs("scripts/here", exist_ok=True)
        spec = {
            "name": "py-script",
            "script": {"command": ["/bin/true"], "working_dir": "scripts/here"},
            "global_batch_size": 64,
            "max_steps": 3,
            "resources": {"min_devices": 1, "max_devices": 2},
        }
        self.assertEqual(self.client.plan(spec).spec.script.working_dir, os.path.join(os.getcwd(), "scripts/here"))
        yaml_text = "name: py-script\nscript: {command: [/bin/true]}\nglobal_batch_size: 64\nmax_steps: 3\n"
        self.assertEqual(self.client.plan(yaml_text).spec.script.working_dir, os.getcwd())
        spec["script"]["working_dir"] = "scripts/nowhere"
        with self.assertRaises(ClientError) as raised:
            self.client.submit(spec)
        self.assertEqual(raised.exception.code, "INVALID_ARGUMENT")
        self.assertIn("spec.script.working_dir", raised.exception.message)
        self.assertIn(os.path.join(os.getcwd(), "scripts/nowhere"), raised.exception.message)

    def test_mlp_job_runs_to_succeeded_with_progress(self):
        jobs_before = {j.id for j in self.client.list()}
        job_id = self.submit(mlp_spec("py-mlp", 3))
        self.assertTrue(job_id.startswith("j-"), job_id)
        self.assertNotIn(job_id, jobs_before)

        events = list(self.client.watch(job_id))  # ends by itself when the job ends
        self.assertEqual([e.sequence for e in events], list(range(1, len(events) + 1)), "not dense from 1")
        self.assertTrue(all(e.job_id == job_id for e in events))
        states = [e.state_changed.to for e in events if e.HasField("state_changed")]
        self.assertEqual(states[0], job_pb2.JOB_STATE_QUEUED)
        self.assertIn(job_pb2.JOB_STATE_RUNNING, states)
        self.assertEqual(states[-1], job_pb2.JOB_STATE_SUCCEEDED, [job_pb2.JobState.Name(s) for s in states])
        progress = [e.progress for e in events if e.HasField("progress")]
        self.assertTrue(progress, "no progress event")
        self.assertEqual(max(p.step for p in progress), 3)
        self.assertTrue(all(p.total_steps == 3 and p.loss > 0 for p in progress))

        job = self.client.get(job_id)
        self.assertEqual(job.state, job_pb2.JOB_STATE_SUCCEEDED)
        self.assertEqual(job.result.steps, 3)
        self.assertTrue(job.result.has_test_accuracy)
        self.assertEqual(job.last_sequence, events[-1].sequence)

        self.assertIn(job_id, [j.id for j in self.client.list()])
        self.assertIn(job_id, [j.id for j in self.client.list(states=["succeeded"])])
        self.assertNotIn(job_id, [j.id for j in self.client.list(states=[job_pb2.JOB_STATE_RUNNING, "failed"])])

        # Watching an ended job replays its history and ends; from_sequence skips what was seen.
        self.assertEqual([e.sequence for e in self.client.watch(job_id, from_sequence=len(events) - 1)],
                         [len(events) - 1, len(events)])

        log = "".join(self.client.logs(job_id, rank=1))
        self.assertIn("rank 1/2", log)
        self.assertIn("test accuracy", "".join(self.client.logs(job_id)))  # rank 0 evaluates

    def test_cancel_stops_a_running_job(self):
        job_id = self.submit(mlp_spec("py-long", 100000))
        events = []
        cancelled = None
        for event in self.client.watch(job_id):
            events.append(event)
            # Cancel once the ranks train, so stopping real processes is what is tested.
            if cancelled is None and event.HasField("progress") and event.progress.step >= 2:
                cancelled = self.client.cancel(job_id, reason="python client test")
        self.assertIsNotNone(cancelled, "the job ended before it trained two steps")
        self.assertEqual(cancelled.id, job_id)
        final = [e.state_changed for e in events if e.HasField("state_changed")][-1]
        self.assertEqual(final.to, job_pb2.JOB_STATE_CANCELLED)
        self.assertEqual(final.reason, "python client test")
        job = self.client.get(job_id)
        self.assertEqual(job.state, job_pb2.JOB_STATE_CANCELLED)
        self.assertLess(job.last_progress.step, 100000)
        # Its ranks really stop: the devices are given back.
        wait_for(lambda: all(d.job_id != job_id for d in self.client.devices()), 30, "the ranks to stop")

        with self.assertRaises(ClientError) as raised:
            self.client.cancel(job_id)
        self.assertEqual(raised.exception.code, "FAILED_PRECONDITION")

    def test_bad_spec_raises_invalid_argument_naming_the_field(self):
        jobs_before = len(self.client.list())
        with self.assertRaises(ClientError) as raised:
            self.client.submit(dict(mlp_spec("py-bad", 3), max_steps=-1))
        self.assertEqual(raised.exception.code, "INVALID_ARGUMENT")
        self.assertIn("spec.max_steps", raised.exception.message)
        self.assertEqual(raised.exception.method, "SubmitJob")
        self.assertIn("INVALID_ARGUMENT", str(raised.exception))

        bad_model = dict(mlp_spec("py-bad", 3), model={"builtin": "no-such-model"})
        with self.assertRaises(ClientError) as raised:
            self.client.submit(bad_model)
        self.assertEqual(raised.exception.code, "INVALID_ARGUMENT")
        self.assertIn("spec.model", raised.exception.message)

        with self.assertRaises(ClientError) as raised:
            self.client.plan("name: py-bad\nmodel: {builtin: mlp}\nglobal_batch_size: many\n")
        self.assertEqual(raised.exception.code, "INVALID_ARGUMENT")
        self.assertIn("spec.global_batch_size", raised.exception.message)

        self.assertEqual(len(self.client.list()), jobs_before, "a rejected spec was stored")

    def test_unknown_job_raises_not_found(self):
        for call in (
            lambda: self.client.get("j-nope"),
            lambda: self.client.cancel("j-nope"),
            lambda: list(self.client.watch("j-nope")),
            lambda: list(self.client.logs("j-nope")),
        ):
            with self.assertRaises(ClientError) as raised:
                call()
            self.assertEqual(raised.exception.code, "NOT_FOUND")
            self.assertIn("j-nope", raised.exception.message)

    def test_unreachable_coordinator_raises_unavailable(self):
        with Client("127.0.0.1:1", timeout=2.0) as client:
            with self.assertRaises(ClientError) as raised:
                client.get("j-1")
            self.assertEqual(raised.exception.code, "UNAVAILABLE")
            with self.assertRaises(ClientError) as raised:
                next(client.watch("j-1"))  # fails at once, not after the reconnect window
            self.assertEqual(raised.exception.code, "UNAVAILABLE")


def main():
    global ADDRESS
    parser = argparse.ArgumentParser()
    parser.add_argument("--address", required=True)
    args, rest = parser.parse_known_args()
    ADDRESS = args.address
    junit_main.main(argv=[sys.argv[0]] + rest)


if __name__ == "__main__":
    main()
