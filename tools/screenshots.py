"""Regenerates the screenshots in deploy/screenshots from a real fitrund training real jobs.

    bazel build //server:fitrund //worker:fitrun-worker //client:fitrun && bash tools/setup-python.sh \
        && .venv/bin/python tools/screenshots.py

It starts fitrund (state in a temporary directory, two virtual 1 GiB CPU devices, ports chosen by the
OS), runs a short mlp job to its end, then starts a longer one and queues a third behind it. While the
long one trains it saves:

  web-page.png    the long job's whole page on fitrund's metrics port, in Debian's headless Chromium
                  1280 pixels wide (tests/cdp.py drives it), once its curve and memory bars have filled in
  fitrun-top.png  the plain text of `fitrun top --once`, shown in a dark terminal-styled page and
                  captured by the same browser

Binaries default to the workspace's bazel-bin; --fitrund, --worker and --fitrun name others.
"""

import argparse
import html
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))

from cdp import Browser  # noqa: E402
from fitrun.client import Client, FINAL_STATES  # noqa: E402
from jobs import Fitrund, state_name, wait_for  # noqa: E402

DATA = "/usr/share/datasets/fashion-mnist"


def mlp(name, steps, devices, every_steps=0):
    spec = {
        "name": name,
        "model": {"builtin": "mlp"},
        "data": {"kind": "fashion_mnist", "path": DATA},
        "optimizer": {"kind": "sgd", "lr": 0.05, "momentum": 0.9},
        "global_batch_size": 256,
        "max_steps": steps,
        "resources": {"min_devices": devices, "max_devices": devices},
        "seed": 1,
    }
    if every_steps:
        spec["checkpoint"] = {"every_steps": every_steps}
    return spec


TERMINAL_PAGE = """<!DOCTYPE html>
<html><head><meta charset="utf-8"><style>
  body {{ margin: 0; padding: 28px; background: #dfe3e8; }}
  #term {{ display: inline-block; background: #0f1419; border-radius: 9px; overflow: hidden;
    box-shadow: 0 10px 30px rgba(15, 20, 25, .35); }}
  .bar {{ display: flex; align-items: center; gap: 7px; height: 30px; padding: 0 12px; background: #1c232b; }}
  .bar i {{ width: 11px; height: 11px; border-radius: 50%; }}
  .bar span {{ margin-left: 10px; color: #8b98a5; font: 12px "DejaVu Sans", sans-serif; }}
  pre {{ margin: 0; padding: 14px 20px 18px; color: #d3dae3; font: 13px/1.4 "DejaVu Sans Mono", monospace; }}
  pre b {{ color: #ffffff; }}
</style></head><body>
<div id="term">
  <div class="bar"><i style="background:#ff5f57"></i><i style="background:#febc2e"></i><i style="background:#28c840"></i>
    <span>{title}</span></div>
  <pre>{text}</pre>
</div>
</body></html>
"""


def terminal_html(title, text):
    """`text` (plain, or with ANSI colours, which are dropped) as a dark terminal window; the first
    line, top's header, in bold."""
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text).rstrip("\n")
    first, _, rest = text.partition("\n")
    body = f"<b>{html.escape(first)}</b>\n{html.escape(rest)}" if rest else html.escape(first)
    return TERMINAL_PAGE.format(title=html.escape(title), text=body)


def fitrun_top(fitrun, address):
    """The output of `fitrun top --once`, or None (and why) when this fitrun has no top."""
    command = [fitrun, f"--coordinator={address}", "top", "--once"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60,
                            env=dict(os.environ, COLUMNS="120", LINES="40"))
    if result.returncode != 0:
        return None, f"`{' '.join(command[1:])}` exited with {result.returncode}: {result.stderr.strip()[:300]}"
    return result.stdout, None


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fitrund", default=os.path.join(ROOT, "bazel-bin/server/fitrund"))
    parser.add_argument("--worker", default=os.path.join(ROOT, "bazel-bin/worker/fitrun-worker"))
    parser.add_argument("--fitrun", default=os.path.join(ROOT, "bazel-bin/client/fitrun"))
    parser.add_argument("--chromium", default="/usr/bin/chromium")
    parser.add_argument("--out", default=os.path.join(ROOT, "deploy/screenshots"))
    args = parser.parse_args()
    for binary in (args.fitrund, args.worker, args.fitrun, args.chromium):
        if not os.access(binary, os.X_OK):
            sys.exit(f"{binary}: not an executable (bazel build //server:fitrund //worker:fitrun-worker //client:fitrun)")
    os.makedirs(args.out, exist_ok=True)
    work = tempfile.mkdtemp(prefix="fitrun-screenshots-")
    made = []
    try:
        daemon = Fitrund(os.path.join(work, "state"), ["--devices=cpu:2x1GiB", "--memory_probe=false"],
                         fitrund=args.fitrund, worker=args.worker, data_roots=f"{work},/usr/share/datasets")
        try:
            if not daemon.address:
                sys.exit("fitrund did not start:\n" + daemon.log())
            with open(os.path.join(daemon.state_dir, "fitrund.metrics_address")) as f:
                base = "http://" + f.read().strip()
            client = Client(daemon.address)

            # History for the list, then the job to show, with one waiting behind it.
            warmup = client.submit(mlp("mlp-warmup", 60, 2))
            wait_for(lambda: client.get(warmup).state in FINAL_STATES, 300, f"{warmup} to end")
            steps = 900
            job_id = client.submit(mlp("fashion-mnist-mlp", steps, 2, every_steps=300))
            client.submit(mlp("mlp-one-device", 200, 1))
            wait_for(lambda: client.get(job_id).last_progress.step >= steps * 0.45, 300, f"{job_id} to be half done")

            with Browser(args.chromium) as browser:
                page = browser.page()
                page.navigate(f"{base}/#/jobs/{job_id}")
                page.wait_for("window.fitrunPage.liveEventsReceived > 3 && window.fitrunPage.lossPoints > 20"
                              " && document.querySelectorAll('#memory .mem .peak').length === 2", 120,
                              "the page's curve, live events and memory bars")
                time.sleep(2.5)  # one more refresh of the job, so the bars show the latest peaks
                if state_name(client.get(job_id)) != "RUNNING":
                    sys.exit(f"{job_id} ended before its page was captured; run again on a less busy machine")
                path = os.path.join(args.out, "web-page.png")
                page.screenshot(path, full_page=True)
                made.append(path)
                print(f"{path}: {job_id} at step {client.get(job_id).last_progress.step}/{steps}, "
                      f"{page.evaluate('window.fitrunPage.lossPoints')} points on its curve")

                text, why_not = fitrun_top(args.fitrun, daemon.address)
                if text is None:
                    print(f"fitrun-top.png not made: {why_not}")
                else:
                    term = os.path.join(work, "top.html")
                    with open(term, "w") as f:
                        f.write(terminal_html("fitrun top --once", text))
                    page.navigate("file://" + term)
                    path = os.path.join(args.out, "fitrun-top.png")
                    page.screenshot(path, selector="#term", margin=20)
                    made.append(path)
                    print(f"{path}: {len(text.splitlines())} lines of fitrun top --once")
            for job in client.list(states=["queued", "planning", "running"]):
                client.cancel(job.id)
            client.close()
        finally:
            daemon.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("wrote " + ", ".join(os.path.relpath(p, ROOT) for p in made))


if __name__ == "__main__":
    main()
