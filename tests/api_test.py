"""The API's hygiene against a real fitrund: idempotent submits by request id, ListJobs in pages over
1,000 jobs, bounded requests (spec size, jobs and streams per user) refused with RESOURCE_EXHAUSTED
naming the limit, and every error's machine-readable reason and field.
"""

import os
import sys
import tempfile
import threading
import unittest

import grpc

from fitrun.client import Client, ClientError
from fitrun.v1 import coordinator_pb2, coordinator_pb2_grpc
from jobs import Fitrund, state_name, wait_for
import junit_main

WORK = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
DAEMON = ["--devices=cpu:2x1GiB", "--memory_probe=false"]


def job_yaml(name, steps=100000):
    # Long enough to hold both devices for the whole test, so every later job stays queued.
    return (f"name: {name}\nmodel: {{builtin: mlp}}\n"
            "data: {kind: fashion_mnist, path: /usr/share/datasets/fashion-mnist}\n"
            f"optimizer: {{kind: sgd, lr: 0.05}}\nglobal_batch_size: 64\nmax_steps: {steps}\n"
            "resources: {min_devices: 2, max_devices: 2}\n")


def error_details(error):
    trailers = dict(error.trailing_metadata() or ())
    return trailers.get("fitrun-error-reason"), trailers.get("fitrun-error-field")


class ApiTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.daemon = Fitrund(os.path.join(WORK, "api"), DAEMON + ["--max_jobs_per_user=1003", "--max_streams_per_user=2"])
        assert cls.daemon.address, cls.daemon.log()
        cls.channel = grpc.insecure_channel(cls.daemon.address)
        cls.stub = coordinator_pb2_grpc.CoordinatorStub(cls.channel)
        cls.client = Client(cls.daemon.address)

    @classmethod
    def tearDownClass(cls):
        for job in cls.client.list(states=["queued", "planning", "running"]):
            cls.client.cancel(job.id)
        cls.daemon.stop()

    def test_a_retried_submit_with_its_request_id_gives_one_job(self):
        before = len(self.client.list())
        request = coordinator_pb2.SubmitJobRequest(spec_yaml=job_yaml("retried"), request_id="req-0001")
        first = self.stub.SubmitJob(request, timeout=10).job
        again = self.stub.SubmitJob(request, timeout=10).job
        self.assertEqual(first.id, again.id)
        self.assertEqual(first.request_id, "req-0001")
        self.assertEqual(len(self.client.list()), before + 1)
        other = coordinator_pb2.SubmitJobRequest(spec_yaml=job_yaml("another-spec"), request_id="req-0001")
        with self.assertRaises(grpc.RpcError) as reused:
            self.stub.SubmitJob(other, timeout=10)
        self.assertEqual(reused.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn(f"already created job {first.id} with a different spec", reused.exception.details())
        self.assertEqual(error_details(reused.exception), ("INVALID_REQUEST", "request_id"))
        self.client.cancel(first.id)

    def test_list_jobs_pages_through_a_thousand_jobs(self):
        ids = [self.client.submit(job_yaml(f"many-{i}")) for i in range(1000)]
        seen, token, pages = [], "", 0
        while True:
            page = self.stub.ListJobs(coordinator_pb2.ListJobsRequest(page_size=128, page_token=token), timeout=10)
            pages += 1
            self.assertLessEqual(len(page.jobs), 128)
            seen.extend(job.id for job in page.jobs)
            token = page.next_page_token
            if not token:
                break
        self.assertEqual([i for i in seen if i in set(ids)], ids)  # each once, oldest first
        self.assertEqual(len(seen), len(set(seen)))
        self.assertGreaterEqual(pages, 8)
        self.assertEqual(self.client.list(states=["queued"])[-1].id, ids[-1])  # the client pages too
        with self.assertRaises(grpc.RpcError) as bad:
            self.stub.ListJobs(coordinator_pb2.ListJobsRequest(page_token="not-a-token"), timeout=10)
        self.assertEqual(bad.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertEqual(error_details(bad.exception), ("INVALID_REQUEST", "page_token"))
        for job_id in ids:
            self.client.cancel(job_id)

    def test_over_limit_requests_get_resource_exhausted_naming_the_limit(self):
        huge = job_yaml("huge") + "# " + "x" * (70 << 10) + "\n"
        with self.assertRaises(ClientError) as spec:
            self.client.submit(huge)
        self.assertEqual((spec.exception.code, spec.exception.reason), ("RESOURCE_EXHAUSTED", "SPEC_SIZE_LIMIT"))
        self.assertIn("over the limit of 65536 bytes", spec.exception.message)

        running = self.client.submit(job_yaml("held"))
        wait_for(lambda: state_name(self.client.get(running)) == "RUNNING", 60, "a job to run")
        open_jobs = len(self.client.list(states=["queued", "planning", "running"]))
        extra = [self.client.submit(job_yaml(f"fill-{i}")) for i in range(1003 - open_jobs)]
        with self.assertRaises(ClientError) as jobs:
            self.client.submit(job_yaml("one-too-many"))
        self.assertEqual((jobs.exception.code, jobs.exception.reason), ("RESOURCE_EXHAUSTED", "JOBS_PER_USER_LIMIT"))
        self.assertIn("--max_jobs_per_user", jobs.exception.message)
        for job_id in extra:
            self.client.cancel(job_id)

        # Two streams open (the limit); a third is refused, and a closed one makes room again.
        streams = [self.stub.WatchJob(coordinator_pb2.WatchJobRequest(job_id=running)) for _ in range(2)]
        for stream in streams:
            next(stream)  # open and reading
        with self.assertRaises(grpc.RpcError) as third:
            next(self.stub.WatchJob(coordinator_pb2.WatchJobRequest(job_id=running)))
        self.assertEqual(third.exception.code(), grpc.StatusCode.RESOURCE_EXHAUSTED)
        self.assertEqual(error_details(third.exception)[0], "STREAMS_PER_USER_LIMIT")
        streams[0].cancel()
        wait_for(lambda: self._can_watch(running), 10, "a stream slot to free up")
        streams[1].cancel()
        self.client.cancel(running)

    def _can_watch(self, job_id):
        stream = self.stub.WatchJob(coordinator_pb2.WatchJobRequest(job_id=job_id))
        try:
            next(stream)
            return True
        except grpc.RpcError:
            return False
        finally:
            stream.cancel()

    def test_errors_say_their_reason_and_field(self):
        with self.assertRaises(ClientError) as missing:
            self.client.get("j-999999")
        self.assertEqual(missing.exception.reason, "JOB_NOT_FOUND")
        bad = job_yaml("bad").replace("max_steps: 100000", "max_steps: -1")
        with self.assertRaises(ClientError) as invalid:
            self.client.submit(bad)
        self.assertEqual((invalid.exception.reason, invalid.exception.field), ("INVALID_SPEC_FIELD", "spec.max_steps"))


if __name__ == "__main__":
    junit_main.main(argv=[sys.argv[0]])
