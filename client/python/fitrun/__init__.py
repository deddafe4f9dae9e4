"""fitrun for Python: the rank side of a script job, and a client for fitrund.

In a training script started by fitrun (or by torchrun)::

    run = fitrun.init()
    batch = run.per_device_batch or args.batch_size
    ...
    run.report(step=step, loss=loss.item(), samples=batch, metrics={"accuracy": acc})
    if run.should_stop():
        ...

From a notebook::

    client = fitrun.Client("127.0.0.1:7070")
    job_id = client.submit({"name": "mlp", ...})
    for event in client.watch(job_id): ...

The rank side needs neither grpc nor generated stubs; the client is imported on first use.
"""

from fitrun.run import Run, init

__all__ = ["Client", "ClientError", "Run", "init"]


def __getattr__(name):
    # The client pulls in grpc and the generated stubs; a training rank that only reports does not.
    if name in ("Client", "ClientError"):
        from fitrun import client

        return getattr(client, name)
    raise AttributeError(f"module 'fitrun' has no attribute {name!r}")
