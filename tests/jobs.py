"""What the Python end-to-end tests share: waiting on a condition, and running a job to its end."""

import time

from fitrun.client import FINAL_STATES
from fitrun.v1 import job_pb2


def state_name(job):
    """"SUCCEEDED" rather than JOB_STATE_SUCCEEDED's number."""
    return job_pb2.JobState.Name(job.state).replace("JOB_STATE_", "")


def wait_for(condition, timeout, what):
    """Polls `condition` until it returns something true, and returns that; fails after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)


def run_to_end(client, spec, timeout=300):
    """Submits `spec`, follows its events to the end, and returns (the ended Job, its events)."""
    job_id = client.submit(spec)
    events = list(client.watch(job_id))
    job = wait_for(lambda: (lambda j: j if j.state in FINAL_STATES else None)(client.get(job_id)), timeout,
                   f"{job_id} to end")
    return job, events
