"""A Python client of the fitrun coordinator (fitrund): what the `fitrun` CLI does, as calls.

    from fitrun.client import Client
    with Client("127.0.0.1:7070") as fitrun:
        job_id = fitrun.submit({"name": "mlp", "model": {"builtin": "mlp"}, ...})
        for event in fitrun.watch(job_id):
            ...
        print(fitrun.get(job_id).result.test_accuracy)

Specs go to fitrund as YAML text (a dict as JSON, which is YAML), so Python users get the
coordinator's own parsing, defaults and field-naming error messages, exactly as the CLI's users do.
Replies are the API's protobuf messages (fitrun.v1.job_pb2), not copies, so every field the API
grows is there without changes here.

The stubs (fitrun/v1/*_pb2*.py) are generated, not committed: building the package (pip install
./client/python, which tools/setup-python.sh runs into .venv) writes them into the wheel, and
Bazel's //client/python:fitrun generates them into its runfiles.
"""

import codecs
import json
import os
import time
import uuid

import grpc

from fitrun import contract

try:
    from fitrun.v1 import coordinator_pb2
    from fitrun.v1 import coordinator_pb2_grpc
    from fitrun.v1 import job_pb2
except ModuleNotFoundError as e:  # pragma: no cover - depends on the checkout's setup
    if not (e.name or "").startswith("fitrun.v1"):
        raise
    raise ImportError(
        "fitrun's gRPC stubs (fitrun/v1/*_pb2.py) are not generated: install the package "
        "(pip install ./client/python, or tools/setup-python.sh for the repository's .venv)"
    ) from e

__all__ = ["Client", "ClientError", "FINAL_STATES"]

# Where a Client without an address connects, when FITRUN_COORDINATOR is unset: the CLI's default
# (client/cli.h) and fitrund's default --listen.
DEFAULT_ADDRESS = "127.0.0.1:7070"

# The states a job never leaves (JobManager::IsTerminal on the server).
FINAL_STATES = frozenset(
    {job_pb2.JOB_STATE_SUCCEEDED, job_pb2.JOB_STATE_FAILED, job_pb2.JOB_STATE_CANCELLED}
)

# A restarted fitrund drops every stream while the job goes on; the CLI reconnects this long too.
_RECONNECT_SECONDS = 120.0
# Tries of one submit while fitrund is unreachable, as the CLI makes.
_SUBMIT_ATTEMPTS = 4


class ClientError(Exception):
    """A call the coordinator refused or could not answer.

    `code` is the gRPC status code's name ("INVALID_ARGUMENT", "NOT_FOUND", "UNAVAILABLE", ...) so
    callers can branch on it without importing grpc; `message` is the coordinator's own text, which
    names the offending spec field (e.g. "spec.max_steps: must be >= 0 (got -1)").
    """

    def __init__(self, code, message, method="", reason="", field=""):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.method = method
        # What a program branches on: the coordinator's reason (INVALID_SPEC_FIELD, JOB_NOT_FOUND,
        # JOBS_PER_USER_LIMIT, ...) and the field at fault (spec.data.path), "" when not given.
        self.reason = reason
        self.field = field

    @classmethod
    def from_rpc_error(cls, error, method):
        code = error.code() if hasattr(error, "code") else None
        details = error.details() if hasattr(error, "details") else None
        trailers = dict(error.trailing_metadata() or ()) if hasattr(error, "trailing_metadata") else {}
        return cls(code.name if code is not None else "UNKNOWN", details or str(error), method,
                   trailers.get("fitrun-error-reason", ""), trailers.get("fitrun-error-field", ""))


class Client:
    """One connection to a coordinator at "host:port": `address`, or FITRUN_COORDINATOR, or 127.0.0.1:7070,
    as for the CLI.

    `timeout` (seconds) bounds each unary call; streams (watch, logs) have no deadline, since a job
    may run for hours. Thread-safe (one gRPC channel); close it, or use it as a context manager.

    A fitrund serving TLS needs `ca` (the PEM file its certificate chains to), and with mutual TLS
    `cert` and `key` (a client certificate and its key); one with users needs `token`, sent as a
    bearer token with every call. Each defaults to FITRUN_CA, FITRUN_CERT, FITRUN_KEY, FITRUN_TOKEN,
    as for the CLI.
    """

    def __init__(self, address=None, timeout=10.0, ca=None, cert=None, key=None, token=None):
        address = address or os.environ.get(contract.COORDINATOR) or DEFAULT_ADDRESS
        self.address = address
        self.timeout = timeout
        ca = ca or os.environ.get("FITRUN_CA")
        cert = cert or os.environ.get("FITRUN_CERT")
        key = key or os.environ.get("FITRUN_KEY")
        token = token or os.environ.get("FITRUN_TOKEN")
        self._metadata = (("authorization", f"Bearer {token}"),) if token else None
        if ca or cert:
            if bool(cert) != bool(key):
                raise ValueError("cert and key: give both, or neither")
            read = lambda path: open(path, "rb").read() if path else None  # noqa: E731
            credentials = grpc.ssl_channel_credentials(read(ca), read(key), read(cert))
            self._channel = grpc.secure_channel(address, credentials)
        else:
            self._channel = grpc.insecure_channel(address)
        self._stub = coordinator_pb2_grpc.CoordinatorStub(self._channel)

    def close(self):
        self._channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()

    def __repr__(self):
        return f"Client({self.address!r}, timeout={self.timeout})"

    # ---- jobs ------------------------------------------------------------------------------------

    def submit(self, spec):
        """Validates, stores and queues a job; returns its id.

        `spec` is a dict, YAML (or JSON) text, a path to a spec file, or a JobSpec message. Its
        relative paths (script.working_dir) mean paths from this process's working directory, which
        goes with the request as the CLI sends its own; fitrund resolves them, for every client
        alike. Raises ClientError with INVALID_ARGUMENT, naming the field, for a spec it rejects.
        """
        # A submit whose answer is lost is retried with the same request id, which never makes two jobs.
        request = coordinator_pb2.SubmitJobRequest(client_dir=os.getcwd(), request_id=uuid.uuid4().hex,
                                                   **_spec_source(spec))
        backoff = 0.2
        for attempt in range(1, _SUBMIT_ATTEMPTS + 1):
            try:
                return self._unary("SubmitJob", request).job.id
            except ClientError as e:
                if e.code != "UNAVAILABLE" or attempt == _SUBMIT_ATTEMPTS:
                    raise
            time.sleep(backoff)
            backoff *= 2

    def plan(self, spec):
        """The plan `spec` would get now (a PlanJobResponse: the parsed spec and the Plan); nothing
        is stored or run."""
        request = coordinator_pb2.PlanJobRequest(client_dir=os.getcwd(), **_spec_source(spec))
        return self._unary("PlanJob", request)

    def get(self, job_id):
        """The job's Job message: state, plan, last progress, result, attempts."""
        return self._unary("GetJob", coordinator_pb2.GetJobRequest(job_id=job_id))

    def list(self, states=()):
        """Every job (a list of Job), or only those in `states` (JobState values or names such as
        "running" or "JOB_STATE_RUNNING")."""
        request = coordinator_pb2.ListJobsRequest(states=[_job_state(s) for s in states])
        jobs = []
        while True:  # every page
            page = self._unary("ListJobs", request)
            jobs.extend(page.jobs)
            if not page.next_page_token:
                return jobs
            request.page_token = page.next_page_token

    def cancel(self, job_id, reason=""):
        """Stops every rank of the job, which ends CANCELLED; returns the Job as the coordinator
        saw it when it accepted (watch or get it to see it end)."""
        request = coordinator_pb2.CancelJobRequest(job_id=job_id, reason=reason)
        return self._unary("CancelJob", request).job

    def devices(self):
        """The coordinator's devices (a list of Device), with their free memory and holders."""
        return list(self._unary("ListDevices", coordinator_pb2.ListDevicesRequest()).devices)

    def watch(self, job_id, from_sequence=1, reconnect_for=_RECONNECT_SECONDS):
        """Yields the job's JobEvent messages from `from_sequence` (the whole history by default),
        then live ones, and ends when the job has reached a final state.

        A coordinator that restarts drops the stream while the job goes on, so once the stream has
        delivered, a lost one is resumed after the last event yielded (as the CLI does) for up to
        `reconnect_for` seconds. A coordinator unreachable from the start fails at once instead.
        """
        next_sequence = max(1, from_sequence)
        delivered = False
        give_up = None
        backoff = 0.2
        while True:
            call = self._stub.WatchJob(
                coordinator_pb2.WatchJobRequest(job_id=job_id, from_sequence=next_sequence),
                metadata=self._metadata,
            )
            try:
                for event in call:
                    delivered = True
                    if event.sequence > 0:  # 0: an EventsMissed notice, not a stored event
                        next_sequence = event.sequence + 1
                        give_up = None
                    yield event
                return  # the coordinator ends the stream once the job has ended
            except grpc.RpcError as e:
                if not delivered or e.code() != grpc.StatusCode.UNAVAILABLE:
                    raise ClientError.from_rpc_error(e, "WatchJob") from None
                now = time.monotonic()
                give_up = give_up or now + reconnect_for
                if now >= give_up:
                    raise ClientError.from_rpc_error(e, "WatchJob") from None
            finally:
                call.cancel()  # a caller that stops iterating early must not leave the stream open
            time.sleep(backoff)
            backoff = min(backoff * 2, 2.0)

    def logs(self, job_id, rank=None, follow=False, attempt=0):
        """Yields text chunks of one rank's log (stdout and stderr) of the job's latest attempt (or
        of `attempt`); rank None is rank 0. With follow, keeps yielding until the attempt ends.

        Bytes are decoded as UTF-8 across chunk boundaries (a character split between two chunks
        is not mangled); undecodable bytes become U+FFFD, since a log is for reading.
        """
        call = self._stub.StreamLogs(
            coordinator_pb2.StreamLogsRequest(
                job_id=job_id, rank=0 if rank is None else rank, follow=follow, attempt=attempt
            ),
            metadata=self._metadata,
        )
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        try:
            for chunk in call:
                text = decoder.decode(chunk.data)
                if text:
                    yield text
        except grpc.RpcError as e:
            raise ClientError.from_rpc_error(e, "StreamLogs") from None
        finally:
            call.cancel()
        tail = decoder.decode(b"", final=True)
        if tail:
            yield tail

    # ---- plumbing --------------------------------------------------------------------------------

    def _unary(self, method, request):
        try:
            return getattr(self._stub, method)(request, timeout=self.timeout, metadata=self._metadata)
        except grpc.RpcError as e:
            raise ClientError.from_rpc_error(e, method) from None


def _spec_source(spec):
    """The SubmitJobRequest/PlanJobRequest `source` oneof for a spec given as the user had it."""
    if isinstance(spec, job_pb2.JobSpec):
        return {"spec": spec}
    if isinstance(spec, dict):
        # NaN and infinities are not YAML numbers: refused here rather than as a parse error there.
        return {"spec_yaml": json.dumps(spec, indent=2, allow_nan=False, default=_json_default)}
    if isinstance(spec, os.PathLike) or (isinstance(spec, str) and _looks_like_path(spec)):
        # Read here and sent as text, as the CLI does: the file is on this machine, not fitrund's.
        with open(spec, encoding="utf-8") as f:
            return {"spec_yaml": f.read()}
    if isinstance(spec, str):
        return {"spec_yaml": spec}
    raise TypeError(f"spec: expected a dict, YAML text, a file path or a JobSpec, got {type(spec).__name__}")


def _looks_like_path(text):
    # A spec's text has a newline or is one flow mapping; a path has neither. A path that does not
    # exist should fail here as a missing file, not at fitrund as a spec that is one string.
    return "\n" not in text and not text.lstrip().startswith("{")


def _json_default(value):
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    raise TypeError(f"spec: {type(value).__name__} {value!r} is not a YAML scalar")


def _job_state(state):
    if isinstance(state, int):
        return state
    name = str(state).upper()
    if not name.startswith("JOB_STATE_"):
        name = "JOB_STATE_" + name
    try:
        return job_pb2.JobState.Value(name)
    except ValueError:
        known = ", ".join(n[len("JOB_STATE_"):].lower() for n in job_pb2.JobState.keys()[1:])
        raise ValueError(f"states: unknown job state {state!r}; use one of: {known}") from None
