"""Nobody wears a real fitrund down (docs/security.md, "What fitrund trusts"): not anyone holding a
job's token (every job's environment carries it on Slurm), not a user flooding calls, not a
stranger on the metrics port or the WorkerChannel. Each case fails without its bound:

- a stolen token's flood of final, failure and out-of-memory reports stores one of each, and a flood
  of log lines stops at the job's event cap with a line saying so;
- ended jobs beyond --retain_finished_jobs leave the store, events and all;
- a user calling PlanJob in a loop from many threads is refused past a rate and a few calls at once,
  while another user's plans answer at once;
- WorkerChannel streams that never say hello are ended at their deadline, and one peer may hold only a
  few; a stolen token opens only a few streams for its rank;
- a secured fitrund answers no reflection request;
- the metrics port answers within seconds while dozens of connections send their requests a byte at a
  time.

Runs as any user: the job's token is read from fitrund's database, as a job's own processes would
find it in their environment.
"""

import hashlib
import os
import sqlite3
import tempfile
import threading
import time
import unittest

import grpc

from fitrun.client import Client, ClientError
from fitrun.v1 import job_pb2, worker_pb2, worker_pb2_grpc
from jobs import Fitrund, state_name, wait_for
import junit_main

WORK = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
EVENT_CAP = 2000
RETAINED = 3


def mlp(name, steps=100000, devices=2):
    return {"name": name, "model": {"builtin": "mlp"},
            "data": {"kind": "fashion_mnist", "path": "/usr/share/datasets/fashion-mnist"},
            "optimizer": {"kind": "sgd", "lr": 0.05}, "global_batch_size": 64, "max_steps": steps,
            "resources": {"min_devices": devices, "max_devices": devices}}


class Store:
    """fitrund's database, read as a job's process holding the token, or an operator, would."""

    def __init__(self, state_dir):
        self.path = os.path.join(state_dir, "fitrun.db")

    def query(self, sql, *args):
        db = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, timeout=10)
        try:
            return db.execute(sql, args).fetchall()
        finally:
            db.close()

    def token(self, job_id):
        return self.query("SELECT token FROM jobs WHERE id = ?", job_id)[0][0]

    def events(self, job_id):
        return self.query("SELECT COUNT(*) FROM events WHERE job_id = ?", job_id)[0][0]

    def jobs(self):
        return [row[0] for row in self.query("SELECT id FROM jobs ORDER BY submit_order")]

    def bytes(self):
        """What the database holds, its free pages (which later writes reuse) left out."""
        pages, free, size = (self.query(f"PRAGMA {p}")[0][0] for p in ("page_count", "freelist_count", "page_size"))
        return (pages - free) * size

    def event_bytes(self, job_id):
        return self.query("SELECT COALESCE(SUM(LENGTH(event)), 0) FROM events WHERE job_id = ?", job_id)[0][0]


class WearTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.state = os.path.join(WORK, "state")
        tokens = os.path.join(WORK, "tokens")
        with open(tokens, "w") as f:
            for user in ("alice", "mallory"):
                f.write(f"{user} user {hashlib.sha256(f'{user}-token'.encode()).hexdigest()}\n")
        cls.daemon = Fitrund(cls.state, ["--devices=cpu:2x1GiB", "--memory_probe=false", f"--auth_tokens={tokens}",
                                         "--unix_accounts=none", f"--retain_finished_jobs={RETAINED}",
                                         f"--max_events_per_job={EVENT_CAP}"])
        assert cls.daemon.address, cls.daemon.log()
        cls.client = Client(cls.daemon.address, timeout=30, token="alice-token")
        cls.store = Store(cls.state)

    @classmethod
    def tearDownClass(cls):
        for job in cls.client.list(states=["queued", "planning", "running"]):
            cls.client.cancel(job.id)
        cls.daemon.stop()

    def running_job(self, name):
        job_id = self.client.submit(mlp(name))
        wait_for(lambda: self.client.get(job_id).last_progress.step > 0, 120, f"{job_id}'s ranks to report")
        return job_id

    def send_as_rank(self, job_id, rank, reports):
        """Opens a WorkerChannel stream as `rank` of the job's first attempt with its token, sends
        `reports` and waits for fitrund to end the stream."""
        hello = worker_pb2.WorkerReport(hello=worker_pb2.Hello(job_id=job_id, attempt=1, rank=rank, world_size=2,
                                                               job_token=self.store.token(job_id)))
        with grpc.insecure_channel(self.daemon.address) as channel:
            stub = worker_pb2_grpc.WorkerChannelStub(channel)
            for _ in stub.Connect(iter([hello, *reports]), timeout=120):
                pass

    def test_a_stolen_tokens_floods_store_one_end_per_rank_and_stop_at_the_event_cap(self):
        job_id = self.running_job("flooded")
        before_bytes, before_events = self.store.event_bytes(job_id), self.store.events(job_id)
        lines = [worker_pb2.WorkerReport(log=job_pb2.LogLine(text=f"forged line {i}")) for i in range(3 * EVENT_CAP)]
        reason = "forged " * 2300  # 16 KiB, the most a failure's reason keeps
        ends = []
        for _ in range(600):
            ends += [worker_pb2.WorkerReport(failed=worker_pb2.RankFailed(reason=reason)),
                     worker_pb2.WorkerReport(oom=job_pb2.OutOfMemory(step=1, requested_bytes=1 << 40)),
                     worker_pb2.WorkerReport(finished=job_pb2.RankFinished(steps=1))]
        try:
            self.send_as_rank(job_id, 1, lines + ends)
        finally:
            self.client.cancel(job_id)
        grown_events = self.store.events(job_id) - before_events
        grown_bytes = self.store.event_bytes(job_id) - before_bytes
        print(f"wear: {len(lines)} forged log lines and {len(ends)} forged ends stored {grown_events} events, "
              f"its events grew by {grown_bytes / 1e6:.2f} MB", flush=True)
        # Without the bounds: every report its event, 600 reasons of 16 KiB (10 MB) among them.
        self.assertLess(self.store.events(job_id), EVENT_CAP + 50)
        self.assertLess(grown_bytes, 1e6)
        texts = [e.log.text for e in self._events(job_id) if e.WhichOneof("event") == "log"]
        self.assertEqual(sum(t.startswith("failed: forged") for t in texts), 1, "one failure of rank 1")
        self.assertTrue(any("--max_events_per_job" in t for t in texts), "a line says the cap is reached")
        self.assertTrue(any("more final, failure or out-of-memory reports" in t for t in texts),
                        "a line says the repeated ends were dropped")
        wait_for(lambda: state_name(self.client.get(job_id)) in ("CANCELLED", "FAILED"), 60, "the job to end")

    def _events(self, job_id):
        rows = self.store.query("SELECT event FROM events WHERE job_id = ? ORDER BY sequence", job_id)
        events = []
        for (blob,) in rows:
            event = job_pb2.JobEvent()
            event.ParseFromString(blob)
            events.append(event)
        return events

    def test_ended_jobs_beyond_the_retention_leave_the_store_with_their_events(self):
        blocker = self.running_job("holds-the-devices")
        ended = []
        for i in range(RETAINED + 4):
            job_id = self.client.submit(mlp(f"queued-{i}"))
            self.client.cancel(job_id, "not needed")
            ended.append(job_id)
        gone = ended[:-RETAINED]
        wait_for(lambda: not set(gone) & set(self.store.jobs()), 30, "the oldest ended jobs to leave the store")
        kept = self.store.jobs()
        for job_id in ended[-RETAINED:]:
            self.assertIn(job_id, kept)
        self.assertIn(blocker, kept, "a job still running is never forgotten")
        for job_id in gone:
            self.assertEqual(self.store.events(job_id), 0)
        listed = [job.id for job in self.client.list()]
        self.assertFalse(set(gone) & set(listed))
        self.client.cancel(blocker)

    def test_a_plan_flood_is_refused_past_its_rate_and_another_users_plans_answer_at_once(self):
        mallory = Client(self.daemon.address, timeout=30, token="mallory-token")
        outcomes = {"ok": 0, "refused": 0, "other": []}
        lock = threading.Lock()

        def flood(thread):
            for i in range(60):
                spec = mlp(f"plan-{thread}-{i}", steps=100 + i)
                try:
                    mallory.plan(spec)
                    kind = "ok"
                except ClientError as error:
                    kind = "refused" if error.reason == "PLANS_PER_USER_LIMIT" else None
                    if kind is None:
                        with lock:
                            outcomes["other"].append(str(error))
                        continue
                with lock:
                    outcomes[kind] += 1

        started = time.monotonic()
        threads = [threading.Thread(target=flood, args=(t,)) for t in range(8)]
        for thread in threads:
            thread.start()
        slowest = 0.0
        while any(thread.is_alive() for thread in threads):
            asked = time.monotonic()
            self.assertTrue(self.client.plan(mlp("alices-plan")).plan.device_ids)
            slowest = max(slowest, time.monotonic() - asked)
            time.sleep(0.1)  # a person, or a tool polling for a calibrated plan
        for thread in threads:
            thread.join()
        elapsed = time.monotonic() - started
        print(f"wear: 480 PlanJob calls from 8 threads in {elapsed:.1f} s: {outcomes['ok']} answered, "
              f"{outcomes['refused']} refused; another user's slowest plan meanwhile {slowest * 1000:.0f} ms",
              flush=True)
        self.assertEqual(outcomes["other"], [])
        self.assertGreater(outcomes["refused"], 0)
        self.assertLessEqual(outcomes["ok"], 40 + 20 * elapsed + 1, "a burst of 40, then 20 a second")
        self.assertLess(slowest, 2.0)

    def test_streams_without_a_hello_end_at_their_deadline_and_one_peer_holds_a_few(self):
        release = threading.Event()

        def silent():  # a stream that never sends its hello
            release.wait(60)
            return
            yield

        outcomes = []
        lock = threading.Lock()

        def hold(channel):
            started = time.monotonic()
            try:
                for _ in worker_pb2_grpc.WorkerChannelStub(channel).Connect(silent(), timeout=60):
                    pass
                code = "OK"
            except grpc.RpcError as error:
                code = error.code().name
            with lock:
                outcomes.append((code, time.monotonic() - started))

        with grpc.insecure_channel(self.daemon.address) as channel:
            threads = [threading.Thread(target=hold, args=(channel,)) for _ in range(20)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(40)
            release.set()
        print(f"wear: 20 streams without a hello: {sorted(outcomes)}", flush=True)
        refused = [t for code, t in outcomes if code == "RESOURCE_EXHAUSTED"]
        expired = [t for code, t in outcomes if code == "DEADLINE_EXCEEDED"]
        self.assertEqual(len(refused), 4, outcomes)
        self.assertEqual(len(expired), 16, outcomes)
        self.assertTrue(all(t < 5 for t in refused), outcomes)
        self.assertTrue(all(8 < t < 30 for t in expired), outcomes)

    def test_a_stolen_token_opens_only_a_few_streams_for_its_rank(self):
        job_id = self.running_job("many-streams")
        hello = worker_pb2.WorkerReport(hello=worker_pb2.Hello(job_id=job_id, attempt=1, rank=1, world_size=2,
                                                               job_token=self.store.token(job_id)))
        release = threading.Event()

        def hello_then_wait():
            yield hello
            release.wait(60)

        codes = []
        streams = []
        try:
            with grpc.insecure_channel(self.daemon.address) as channel:
                stub = worker_pb2_grpc.WorkerChannelStub(channel)
                for _ in range(8):
                    call = stub.Connect(hello_then_wait(), timeout=60)
                    streams.append(call)
                time.sleep(2)  # each said hello; the refused ones have ended
                for call in streams:
                    codes.append(call.code().name if call.done() else "open")
                release.set()
        finally:
            self.client.cancel(job_id)
        print(f"wear: 8 streams with rank 1's stolen token: {codes}", flush=True)
        # The rank's own stream and three more at most.
        self.assertEqual(codes.count("open"), 3, codes)
        self.assertEqual(codes.count("RESOURCE_EXHAUSTED"), 5, codes)

    def test_a_secured_fitrund_answers_no_reflection_request(self):
        list_services = b"\x3a\x00"  # ServerReflectionRequest{list_services: ""}
        with grpc.insecure_channel(self.daemon.address) as channel:
            call = channel.stream_stream("/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
                                         request_serializer=lambda b: b, response_deserializer=lambda b: b)
            with self.assertRaises(grpc.RpcError) as refused:
                list(call(iter([list_services]), timeout=10))
        self.assertEqual(refused.exception.code(), grpc.StatusCode.UNIMPLEMENTED)

    def test_the_metrics_port_answers_while_dozens_of_connections_send_a_byte_at_a_time(self):
        import socket

        with open(os.path.join(self.state, "fitrund.metrics_address")) as f:
            host, port = f.read().strip().rsplit(":", 1)
        slow = []
        for _ in range(60):
            sock = socket.create_connection((host, int(port)), timeout=5)
            sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # never the blank line
            slow.append(sock)
        try:
            import urllib.request

            started = time.monotonic()
            request = urllib.request.Request(f"http://{host}:{port}/metrics",
                                             headers={"Authorization": "Bearer alice-token"})
            with urllib.request.urlopen(request, timeout=60) as answer:
                self.assertEqual(answer.status, 200)
            took = time.monotonic() - started
        finally:
            for sock in slow:
                sock.close()
        print(f"wear: /metrics answered in {took:.1f} s behind 60 connections that never finish their request",
              flush=True)
        self.assertLess(took, 15)


if __name__ == "__main__":
    junit_main.main()
