"""fitrund's web page in a real browser: Debian's headless Chromium, driven over the DevTools protocol
(tests/cdp.py), against a real fitrund training a real job on two virtual CPU devices.

The job list shows the running job and the devices it holds; the job's page, opened from the list
while the job runs, draws its plan and its ranks' memory bars and receives events live; once the job
has ended, its loss curve has one point per progress event rank 0 reported (counted over gRPC with
the Python client's watch) and every event arrived exactly once. Screenshots of both views go to
$TEST_UNDECLARED_OUTPUTS_DIR (Bazel keeps them as the test's outputs).

On a secured fitrund (--auth_tokens) the page is the sign-in page until a token is pasted into it; a
wrong one is refused there; the right one gives a session (an HttpOnly cookie the page's code cannot
read) with which the page lists that user's jobs only and follows their events, another user's job
being no job of theirs; signing out brings the sign-in page back.
"""

import hashlib
import json
import os
import sys
import tempfile
import unittest

from cdp import Browser
from fitrun.client import Client, FINAL_STATES
from jobs import Fitrund, run_to_end, state_name, wait_for
import junit_main

WORK = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
OUTPUTS = os.environ.get("TEST_UNDECLARED_OUTPUTS_DIR") or os.environ.get("TEST_TMPDIR") or WORK
DAEMON = ["--devices=cpu:2x1GiB", "--memory_probe=false"]
STEPS = 300  # with 2 ranks about 20 s of training here: long enough to watch it live

SPEC = {
    "name": "web-page-mlp",
    "model": {"builtin": "mlp"},
    "data": {"kind": "fashion_mnist", "path": "/usr/share/datasets/fashion-mnist"},
    "optimizer": {"kind": "sgd", "lr": 0.05, "momentum": 0.9},
    "global_batch_size": 256,
    "max_steps": STEPS,
    "resources": {"min_devices": 2, "max_devices": 2},
    "seed": 3,
}


def js(value):
    """A Python value as a JavaScript literal."""
    return json.dumps(value)


class WebPageTest(unittest.TestCase):
    def setUp(self):
        self.daemon = Fitrund(os.path.join(WORK, "fitrund"), DAEMON)
        self.addCleanup(self.daemon.stop)
        self.assertTrue(self.daemon.address, self.daemon.log())
        with open(os.path.join(self.daemon.state_dir, "fitrund.metrics_address")) as f:
            self.base = "http://" + f.read().strip()
        self.client = Client(self.daemon.address)
        self.addCleanup(self.client.close)
        self.browser = Browser()
        self.addCleanup(self.browser.close)
        self.page = self.browser.page()

    def screenshot(self, name, full_page=False):
        path = os.path.join(OUTPUTS, name)
        size = self.page.screenshot(path, full_page=full_page)
        self.assertGreater(size, 10_000, f"{name} is suspiciously small")
        print(f"saved {path} ({size} bytes)")

    def test_job_list_and_a_running_jobs_page(self):
        page = self.page
        job_id = self.client.submit(SPEC)
        wait_for(lambda: self.client.get(job_id).last_progress.step > 0, 120, f"{job_id} to report progress")
        plan = self.client.get(job_id).plan

        # The job list: the job with its name, state and owner, linking to its page; the devices it holds.
        page.navigate(self.base + "/#/")
        row = f"document.querySelector('#jobs tr[data-job={js(job_id)}]')"
        page.wait_for(f"window.fitrunPage.view === 'list' && {row} !== null", 20, "the job list to show the job")
        cells = page.evaluate(f"Array.from({row}.cells, (c) => c.textContent.trim())")
        self.assertEqual(cells[0], job_id)
        self.assertEqual(cells[1], "web-page-mlp")
        self.assertIn(cells[2], ("RUNNING", "SUCCEEDED"))
        self.assertEqual(cells[5], "local")
        self.assertEqual(cells[6], "1")
        self.assertRegex(cells[3], rf"^\d+/{STEPS}$")
        held = page.wait_for(
            "(() => { const rows = document.querySelectorAll('#devices tr[data-device]');"
            " return rows.length === 2 && Array.from(rows, (r) => [r.cells[0].textContent, r.cells[3].textContent,"
            " r.querySelectorAll('.mem').length]); })()", 20, "the devices table")
        print(f"job list: {job_id} {cells[1]} {cells[2]} {cells[3]}; devices {held}")
        self.assertEqual(sorted(d for d, _, _ in held), ["cpu:0", "cpu:1"])
        for device, holder, bars in held:
            if state_name(self.client.get(job_id)) == "RUNNING":
                self.assertIn(job_id, holder, f"{device} should be held by the running job")
            self.assertEqual(bars, 1)
        self.screenshot("web-page-list.png")

        # Its page, opened from the list's link while the job runs.
        page.evaluate(f"document.querySelector('#jobs a[href=\"#/jobs/{job_id}\"]').click()")
        page.wait_for(f"window.fitrunPage.view === 'job' && window.fitrunPage.jobId === {js(job_id)}"
                      " && document.querySelector('#plan .chip') !== null", 20, "the job's page and its plan")
        shown = page.evaluate(
            "({devices: Array.from(document.querySelectorAll('#plan .chip'), (c) => c.textContent),"
            " batch: document.getElementById('plan-batch').textContent,"
            " strategy: document.getElementById('plan-strategy').textContent,"
            " parts: document.querySelectorAll('#plan-breakdown > div').length,"
            " reasons: document.querySelectorAll('#plan ul.reasons li').length,"
            " title: document.querySelector('#job-header h1').textContent})")
        self.assertEqual(shown["devices"], list(plan.device_ids))
        self.assertEqual(shown["batch"], str(plan.per_device_batch))
        self.assertEqual(shown["strategy"], "activations and optimizer states kept on every rank")  # the mlp's plan
        self.assertGreaterEqual(shown["parts"], 5)  # weights, gradients, optimizer state, activations, ...
        self.assertEqual(shown["reasons"], len(plan.reasons))
        self.assertEqual(shown["title"], "web-page-mlp")
        ranks = page.wait_for(
            "(() => { const rows = document.querySelectorAll('#memory tr.rank');"
            " return rows.length === 2 && Array.from(rows, (r) => ({rank: r.dataset.rank,"
            " planned: r.querySelectorAll('.mem .planned').length, text: r.querySelector('.memtext').textContent})); })()",
            20, "a memory bar per rank")
        for rank in ranks:
            self.assertEqual(rank["planned"], 1, rank)
            self.assertIn("cap 1.0 GiB", rank["text"])
        live = page.wait_for("window.fitrunPage.liveEventsReceived", 60, "an event to arrive live")
        running = state_name(self.client.get(job_id))
        print(f"job page: plan {shown}; ranks {ranks}; {live} live event(s) so far, job {running}")
        page.wait_for("window.fitrunPage.lossPoints > 5", 60, "the loss curve to grow")
        self.screenshot("web-page-job-running.png")

        # The end: the stream closes, the curve has a point per rank-0 progress event, nothing twice.
        page.wait_for("window.fitrunPage.ended", 300, "the page to see the job end")
        job = wait_for(lambda: (lambda j: j if j.state in FINAL_STATES else None)(self.client.get(job_id)), 30,
                       f"{job_id} to end")
        self.assertEqual(state_name(job), "SUCCEEDED", job.failure_reason)
        events = list(self.client.watch(job_id))
        progress = [e for e in events if e.WhichOneof("event") == "progress" and e.progress.rank == 0]
        state = page.evaluate("window.fitrunPage")
        points = page.evaluate("Number(document.getElementById('loss-curve').dataset.points)")
        print(f"after the end: page {state}; rank-0 progress events over gRPC {len(progress)}; "
              f"events {len(events)} (last sequence {job.last_sequence}); curve data-points {points}")
        self.assertGreater(len(progress), 5)
        self.assertEqual(state["lossPoints"], len(progress))
        self.assertEqual(points, len(progress))
        self.assertEqual(state["eventsReceived"], job.last_sequence)
        self.assertGreater(state["liveEventsReceived"], 0)
        self.assertLessEqual(state["liveEventsReceived"], state["eventsReceived"])

        # What the page shows of the ended job once it has read it again.
        ended = page.wait_for(
            "(() => { const badge = document.querySelector('#job-header .badge');"
            " return badge && badge.textContent === 'SUCCEEDED' && {"
            " attempts: Array.from(document.querySelectorAll('#attempts > table:first-of-type tbody tr'), (r) => r.cells[6].textContent),"
            " markers: document.querySelectorAll('#loss-curve .metric').length,"
            " lines: document.querySelectorAll('#events .ev').length}; })()", 20, "the page to show the job SUCCEEDED")
        self.assertEqual(ended["attempts"], [job.attempt_history[0].outcome])
        self.assertEqual(ended["markers"], 1)  # the test accuracy at the last step
        self.assertEqual(ended["lines"], job.last_sequence)
        print(f"ended: {ended}; test accuracy {job.result.test_accuracy:.4f}")
        self.screenshot("web-page-job.png")
        self.screenshot("web-page-job-full.png", full_page=True)

        # An unknown job's page says so instead of waiting forever.
        page.evaluate("location.hash = '#/jobs/j-999999'")
        page.wait_for("window.fitrunPage.view === 'job' && document.querySelector('#app .banner') !== null"
                      " && document.querySelector('#app .banner').textContent.startsWith('No job j-999999')",
                      20, "the unknown job's page to say so")
        print("unknown job: " + page.evaluate("document.querySelector('#app .banner').textContent"))


def tiny_job(name, steps):
    return dict(SPEC, name=name, max_steps=steps, global_batch_size=64)


class SecuredWebPageTest(unittest.TestCase):
    """The job ran before fitrund had users, so it is the user `local`'s; fitrund then starts again on the
    same state with users `local` and `bob`. (As root, a fitrund with users runs each job as its owner's
    Unix account, which these users do not have; tests/owners_test covers that.)"""

    def setUp(self):
        work = tempfile.mkdtemp(dir=WORK)
        state = os.path.join(work, "fitrund")
        with Fitrund(state, DAEMON) as before_users:
            self.assertTrue(before_users.address, before_users.log())
            with Client(before_users.address) as client:
                self.job, _ = run_to_end(client, tiny_job("before-users", 30))
        tokens = os.path.join(work, "tokens")
        with open(tokens, "w") as f:
            for user in ("local", "bob"):
                f.write(f"{user} user {hashlib.sha256(f'{user}-token'.encode()).hexdigest()}\n")
        self.daemon = Fitrund(state, DAEMON + [f"--auth_tokens={tokens}"])
        self.addCleanup(self.daemon.stop)
        self.assertTrue(self.daemon.address, self.daemon.log())
        with open(os.path.join(self.daemon.state_dir, "fitrund.metrics_address")) as f:
            self.base = "http://" + f.read().strip()
        self.browser = Browser()
        self.addCleanup(self.browser.close)
        self.page = self.browser.page()

    def sign_in_with(self, token):
        """Pastes `token` into the sign-in form, as a user would, and submits it."""
        self.page.evaluate("(() => { const input = document.getElementById('token'); input.value = '';"
                           " input.focus(); return document.activeElement === input; })()")
        self.page.call("Input.insertText", text=token)
        self.page.evaluate("document.getElementById('submit').click()")

    def sign_out(self):
        self.page.evaluate("location.hash = '#/'")  # the next sign-in then lands on the job list
        self.page.evaluate("document.getElementById('sign-out').click()")
        self.page.wait_event("Page.loadEventFired", 20)
        self.page.wait_for("window.fitrunLogin && window.fitrunLogin.state === 'ready'", 20, "the sign-in page again")

    def signed_in_list(self, user):
        """Waits for the jobs page signed in as `user`; the ids its job list shows."""
        self.page.wait_event("Page.loadEventFired", 20)
        self.page.wait_for("window.fitrunPage && window.fitrunPage.view === 'list'"
                           f" && window.fitrunPage.user === {js(user)}", 20, f"the jobs page, signed in as {user}")
        self.assertIn(user, self.page.evaluate("document.getElementById('user').textContent"))
        return self.page.wait_for("(() => { const body = document.querySelector('#jobs tbody');"
                                  " return body && body.rows.length > 0"
                                  " && [Array.from(body.querySelectorAll('tr[data-job]'), (r) => r.dataset.job)]; })()",
                                  20, "the job list")[0]

    def test_signing_in_with_a_pasted_token_shows_the_users_own_jobs(self):
        page, job = self.page, self.job
        self.assertEqual(state_name(job), "SUCCEEDED", job.failure_reason)
        self.assertEqual(job.owner, "local")

        page.navigate(self.base + "/#/")
        page.wait_for("window.fitrunLogin && window.fitrunLogin.state === 'ready'", 20, "the sign-in page")
        self.assertIsNone(page.evaluate("window.fitrunPage || null"), "the jobs page before signing in")
        size = page.screenshot(os.path.join(OUTPUTS, "web-page-sign-in.png"))
        print(f"saved web-page-sign-in.png ({size} bytes)")

        # A wrong token is refused on the page itself.
        self.sign_in_with("not-a-token")
        refused = page.wait_for("window.fitrunLogin.state === 'refused' && window.fitrunLogin.message", 20,
                                "the wrong token to be refused")
        self.assertIn("not one fitrund knows", refused)

        # bob: no jobs of his, and the job is no job of his.
        self.sign_in_with("bob-token")
        self.assertEqual(self.signed_in_list("bob"), [])
        page.evaluate(f"location.hash = '#/jobs/{job.id}'")
        page.wait_for("window.fitrunPage.view === 'job' && document.querySelector('#app .banner') !== null"
                      f" && document.querySelector('#app .banner').textContent.startsWith('No job {job.id}')",
                      20, "the job to be no job of bob's")
        self.sign_out()
        self.assertEqual(page.evaluate("fetch('api/jobs').then((r) => r.status)"), 401)

        # Its owner: the job in the list, and its page with every event over the session cookie.
        self.sign_in_with("local-token")
        self.assertEqual(self.signed_in_list("local"), [job.id])
        self.assertNotIn("fitrun_session", page.evaluate("document.cookie"), "the session cookie is not HttpOnly")
        page.screenshot(os.path.join(OUTPUTS, "web-page-signed-in.png"))
        page.evaluate(f"location.hash = '#/jobs/{job.id}'")
        page.wait_for(f"window.fitrunPage.view === 'job' && window.fitrunPage.ended"
                      f" && window.fitrunPage.eventsReceived === {job.last_sequence}", 30,
                      "the job's events over the session")
        self.sign_out()
        print(f"bob saw no job; local saw {job.id} and its {job.last_sequence} events; both signed out")


if __name__ == "__main__":
    junit_main.main(argv=[sys.argv[0]])
