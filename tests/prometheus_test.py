"""deploy/'s monitoring against the real thing: Debian's Prometheus scraping a real fitrund every second,
with a config made from deploy/prometheus/prometheus.yml and its alerts.yml, while a real mlp job trains
on two virtual CPU devices. Every expression of every panel of deploy/grafana/fitrun-dashboard.json must
return data, and every alert rule must evaluate without error.

A second, short case scrapes a fitrund with users (--auth_tokens) and TLS (--tls_cert), as a shared one
is: /metrics answers only its users and over HTTPS only, so that config has prometheus.yml's
authorization and HTTPS blocks uncommented, with the token of a "prometheus" user in the file it names
and the certificate as its CA, exactly as deploy/ tells an operator to; Prometheus must reach it and
store its series. (The long case stays in local mode: as root, a fitrund with users runs each
job as its owner's Unix account, which a test user does not have; tests/owners_test covers that.)

Alerts firing and resolving are promtool's unit tests (deploy/prometheus/alerts_test.yml, run by
//deploy:prometheus_rules_test); here the rules only have to evaluate on fitrund's real series.
Prometheus' log is printed, and kept in the test's undeclared outputs, when something fails.
"""

import contextlib
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.error
import urllib.parse
import urllib.request

from fitrun.client import Client, FINAL_STATES
from jobs import Fitrund, state_name, wait_for
import junit_main

RUNFILES = os.path.join(os.environ.get("TEST_SRCDIR", ""), os.environ.get("TEST_WORKSPACE", "fitrun"))
DEPLOY = os.path.join(RUNFILES, "deploy")
PROMETHEUS = "/usr/bin/prometheus"
WORK = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))

DAEMON = ["--devices=cpu:2x1GiB", "--memory_probe=false"]
# Long enough to be running through every query; cancelled once they are done.
JOB = {
    "name": "scraped",
    "model": {"builtin": "mlp"},
    "data": {"kind": "fashion_mnist", "path": "/usr/share/datasets/fashion-mnist"},
    "optimizer": {"kind": "sgd", "lr": 0.05, "momentum": 0.9},
    "global_batch_size": 256,
    "max_steps": 100000,
    "resources": {"min_devices": 2, "max_devices": 2},
    "seed": 7,
}
# How long one expression may take to return data: rate() and increase() need two scrapes in their
# window, and a series computed at scrape time needs the scrape after the thing appeared.
QUERY_SECONDS = 30


def free_port():
    """A port the OS has just handed out on loopback (and taken back)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def prometheus_config(template, target, rules, credentials_file=None, ca_file=None):
    """deploy/prometheus/prometheus.yml edited as text (no YAML library in the standard one): scrape
    and evaluate every second, scrape `target`, and load the rule file at the absolute path `rules`;
    with `credentials_file`, the template's commented authorization block uncommented to send the
    bearer token in that file; with `ca_file`, its HTTPS block, trusting that CA. Each edit must apply
    exactly once, so a reshaped template fails here rather than being ignored."""
    edits = [
        (r"(?m)^(\s*)scrape_interval:.*$", r"\1scrape_interval: 1s"),
        (r"(?m)^(\s*)evaluation_interval:.*$", r"\1evaluation_interval: 1s"),
        (r"(?m)^(\s*)- alerts\.yml\s*$", lambda m: f"{m.group(1)}- {json.dumps(rules)}"),
        (r"(?m)^(\s*)- targets: \[.*\]\s*$", lambda m: f"{m.group(1)}- targets: [{json.dumps(target)}]"),
    ]
    if credentials_file is not None:
        edits += [
            (r"(?m)^(\s*)# authorization:\s*$", r"\1authorization:"),
            (r"(?m)^(\s*)#   type: Bearer\s*$", r"\1  type: Bearer"),
            (r"(?m)^(\s*)#   credentials_file: .*$",
             lambda m: f"{m.group(1)}  credentials_file: {json.dumps(credentials_file)}"),
        ]
    if ca_file is not None:
        edits += [
            (r"(?m)^(\s*)# scheme: https\s*$", r"\1scheme: https"),
            (r"(?m)^(\s*)# tls_config:\s*$", r"\1tls_config:"),
            (r"(?m)^(\s*)#   ca_file: .*$", lambda m: f"{m.group(1)}  ca_file: {json.dumps(ca_file)}"),
        ]
    for pattern, replacement in edits:
        template, count = re.subn(pattern, replacement, template)
        if count != 1:
            raise AssertionError(f"prometheus.yml: expected one line matching {pattern!r}, found {count}")
    return template


class Prometheus:
    """Debian's prometheus on a free loopback port, storing in `work`, with a config made by
    prometheus_config. stop() SIGTERMs it (SIGKILL after 15 s)."""

    def __init__(self, work, config_text):
        os.makedirs(work, exist_ok=True)
        self.config_path = os.path.join(work, "prometheus.yml")
        with open(self.config_path, "w") as f:
            f.write(config_text)
        self.log_path = os.path.join(work, "prometheus.log")
        self.process = None
        for _ in range(3):  # another process may take the port between free_port() and the bind
            self.address = f"127.0.0.1:{free_port()}"
            storage = tempfile.mkdtemp(dir=work, prefix="data-")
            with open(self.log_path, "a") as log:
                self.process = subprocess.Popen(
                    [PROMETHEUS, f"--config.file={self.config_path}", f"--storage.tsdb.path={storage}",
                     f"--web.listen-address={self.address}"],
                    stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            try:
                wait_for(lambda: self.process.poll() is not None or self._ready(), 60, "Prometheus to be ready")
            except AssertionError:
                self.stop()
                raise AssertionError(f"Prometheus was not ready in 60 s:\n{self.log()}") from None
            if self.process.poll() is None:
                return
            if "address already in use" not in self.log():
                break
        raise AssertionError(f"Prometheus exited ({self.process.returncode}):\n{self.log()}")

    def _ready(self):
        try:
            with urllib.request.urlopen(f"http://{self.address}/-/ready", timeout=2) as reply:
                return reply.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def api(self, path, **params):
        """GET /api/v1/<path>: its `data`, or AssertionError with Prometheus' error."""
        url = f"http://{self.address}/api/v1/{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        try:
            with urllib.request.urlopen(url, timeout=10) as reply:
                body = json.load(reply)
        except urllib.error.HTTPError as e:  # 400 and 422 carry the reason in JSON
            body = json.load(e)
        if body.get("status") != "success":
            raise AssertionError(f"{path} {params}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr):
        """The instant query's result (a list of series, or a scalar's [time, value])."""
        return self.api("query", query=expr)["result"]

    def log(self):
        with open(self.log_path) as f:
            return f.read()

    def stop(self):
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def dashboard_targets(dashboard, variables):
    """(panel title, refId, expression with the dashboard's variables filled in) of every target of
    every panel, those in rows too. `variables` maps names to values ($x, ${x} and ${x:format})."""
    def fill(expr):
        return re.sub(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)", lambda m: variables[m.group(1) or m.group(2)], expr)

    for panel in dashboard["panels"]:
        for inner in panel.get("panels", []) if panel.get("type") == "row" else [panel]:
            for target in inner.get("targets", []):
                yield inner["title"], target["refId"], fill(target["expr"])


def selectors_in(expr):
    """The series selectors of a PromQL expression: each metric name with its {matchers}, if any."""
    return re.findall(r"\b(?:fitrun_\w+|up)(?:\{[^}]*\})?", expr)


def alert_names(rules_text):
    return re.findall(r"(?m)^\s*- alert:\s*(\w+)\s*$", rules_text)


class PrometheusTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.fitrund = Fitrund(os.path.join(WORK, "fitrund"), DAEMON)
        cls.addClassCleanup(cls.fitrund.stop)  # runs even when setUpClass fails, after the ones below
        assert cls.fitrund.address, cls.fitrund.log()
        with open(os.path.join(cls.fitrund.state_dir, "fitrund.metrics_address")) as f:
            cls.metrics_address = f.read().strip()
        with open(os.path.join(DEPLOY, "prometheus/prometheus.yml")) as f:
            config = prometheus_config(f.read(), cls.metrics_address, os.path.join(DEPLOY, "prometheus/alerts.yml"))
        with cls.logs_on_failure():
            cls.prometheus = Prometheus(os.path.join(WORK, "prometheus"), config)
            cls.addClassCleanup(cls.prometheus.stop)
            wait_for(cls.scraping, 30, f"Prometheus to scrape fitrund at {cls.metrics_address}")

            cls.client = Client(cls.fitrund.address)
            cls.addClassCleanup(cls.client.close)
            cls.job_id = cls.client.submit(JOB)
            cls.addClassCleanup(cls.cancel_job)
            wait_for(lambda: state_name(cls.client.get(cls.job_id)) == "RUNNING", 120, f"{cls.job_id} to run")
            # Its per-job series are computed at scrape time, from its ranks' first report on.
            wait_for(lambda: cls.prometheus.query(f'fitrun_job_step{{job_id="{cls.job_id}"}} > 0'), 60,
                     f"Prometheus to scrape {cls.job_id}'s steps")
        print(f"Prometheus at {cls.prometheus.address} scrapes fitrund's {cls.metrics_address}; "
              f"{cls.job_id} is running", flush=True)

    @classmethod
    def scraping(cls):
        targets = cls.prometheus.api("targets")["activeTargets"]
        return any(t["scrapeUrl"].startswith(f"http://{cls.metrics_address}/") and t["health"] == "up"
                   for t in targets)

    @classmethod
    def cancel_job(cls):
        if cls.client.get(cls.job_id).state not in FINAL_STATES:
            cls.client.cancel(cls.job_id, reason="the Prometheus test is done")

    @classmethod
    @contextlib.contextmanager
    def logs_on_failure(cls):
        """Prints Prometheus' and fitrund's logs if the block fails, and keeps Prometheus' whole log."""
        try:
            yield
        except BaseException:
            prometheus = getattr(cls, "prometheus", None)
            if prometheus is not None:
                print(f"---- prometheus.log (last 80 lines)\n{''.join(prometheus.log().splitlines(True)[-80:])}")
                outputs = os.environ.get("TEST_UNDECLARED_OUTPUTS_DIR")
                if outputs:
                    shutil.copy(prometheus.log_path, os.path.join(outputs, "prometheus.log"))
            print(f"---- fitrund.log (last 40 lines)\n{''.join(cls.fitrund.log().splitlines(True)[-40:])}")
            raise

    def assert_still_running(self):
        job = self.client.get(self.job_id)
        self.assertEqual(state_name(job), "RUNNING", f"{self.job_id} ended before the checks did: {job.failure_reason}")

    def test_every_dashboard_expression_returns_data(self):
        with open(os.path.join(DEPLOY, "grafana/fitrun-dashboard.json")) as f:
            dashboard = json.load(f)
        # $job as the running job's id (no regex or PromQL escapes needed), so the per-job panels must
        # find that job; every device.
        self.assertRegex(self.job_id, r"^[A-Za-z0-9_-]+$")
        variables = {"job": self.job_id, "device": ".*", "__rate_interval": "1m"}
        targets = list(dashboard_targets(dashboard, variables))
        self.assertGreater(len(targets), 0)
        empty = []
        print()
        with self.logs_on_failure():
            for title, ref_id, expr in targets:
                result = []
                deadline = time.monotonic() + QUERY_SECONDS
                while not result and time.monotonic() < deadline:
                    result = self.prometheus.query(expr)  # an invalid one raises at once
                    if not result:
                        time.sleep(0.5)
                print(f"{'ok   ' if result else 'EMPTY'} {len(result):2} series  {title} [{ref_id}]: {expr}", flush=True)
                if not result:
                    empty.append(f"{title} [{ref_id}]: {expr}")
            self.assert_still_running()
            self.assertEqual(empty, [], f"{len(empty)} of {len(targets)} dashboard expressions returned nothing")
        print(f"{len(targets)} dashboard expressions returned data while {self.job_id} ran", flush=True)

    def test_metrics_follow_prometheus_conventions(self):
        """`promtool check metrics` on a scrape taken while the job runs (so the per-job series are in it)."""
        with urllib.request.urlopen(f"http://{self.metrics_address}/metrics", timeout=10) as reply:
            text = reply.read()
        self.assertIn(f'fitrun_job_step{{job_id="{self.job_id}"}}'.encode(), text)
        check = subprocess.run(["/usr/bin/promtool", "check", "metrics"], input=text, capture_output=True)
        self.assertEqual(check.returncode, 0, (check.stdout + check.stderr).decode())
        families = sum(1 for line in text.splitlines() if line.startswith(b"# TYPE fitrun_"))
        print(f"\npromtool check metrics: clean, {families} fitrun_ families", flush=True)

    def test_every_alert_rule_evaluates(self):
        with open(os.path.join(DEPLOY, "prometheus/alerts.yml")) as f:
            names = alert_names(f.read())
        self.assertGreater(len(names), 0)
        print()
        with self.logs_on_failure():
            # FitrunCoordinatorDown watches the scrape job prometheus.yml names.
            self.assertTrue(self.prometheus.query('up{job="fitrund"} == 1'), "no scrape job named fitrund is up")
            # Prometheus loaded the file, and has evaluated every rule without error at least once.
            def rules_evaluated():
                rules = [r for g in self.prometheus.api("rules")["groups"] for r in g["rules"]]
                return rules if rules and all(r["health"] == "ok" for r in rules) else None

            try:
                rules = wait_for(rules_evaluated, 30, "every rule to be evaluated")
            except AssertionError:
                rules = [r for g in self.prometheus.api("rules")["groups"] for r in g["rules"]]
                self.fail("rules not evaluated cleanly: " +
                          "; ".join(f"{r['name']}: {r['health']} {r.get('lastError', '')}" for r in rules))
            self.assertEqual(sorted(r["name"] for r in rules), sorted(names))
            unmatched = []
            for rule in rules:
                result = self.prometheus.query(rule["query"])  # raises on an evaluation error
                # A quiet rule is only worth something if its selectors find fitrund's series (a
                # misnamed metric or a bucket bound written otherwise would keep it quiet forever).
                selectors = selectors_in(rule["query"])
                unmatched += [f"{rule['name']}: {s}" for s in selectors if not self.prometheus.query(s)]
                firing = [a["labels"] for a in rule.get("alerts", [])]
                print(f"ok   {rule['name']}: {len(result)} series, {rule['state']} {firing or ''}; "
                      f"selectors {', '.join(selectors)}", flush=True)
            self.assertEqual(unmatched, [], "alert selectors that match none of fitrund's series")
            self.assert_still_running()
        print(f"{len(rules)} alert rules evaluated on fitrund's series", flush=True)


class SecuredScrapeTest(unittest.TestCase):
    """Prometheus with prometheus.yml's authorization and HTTPS blocks on, scraping a fitrund with
    --auth_tokens and --tls_cert (a self-signed certificate for 127.0.0.1 made here by openssl)."""

    def test_prometheus_scrapes_over_https_with_its_own_users_token(self):
        work = tempfile.mkdtemp(dir=WORK)
        token = "prometheus-scrape-token"
        tokens = os.path.join(work, "tokens")
        with open(tokens, "w") as f:
            f.write(f"prometheus user {hashlib.sha256(token.encode()).hexdigest()}\n")
        credentials = os.path.join(work, "fitrun-token")
        with open(credentials, "w") as f:
            f.write(token)
        os.chmod(credentials, 0o600)
        cert, key = os.path.join(work, "fitrund.pem"), os.path.join(work, "fitrund.key")
        subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                        "-nodes", "-keyout", key, "-out", cert, "-days", "2", "-subj", "/CN=localhost",
                        "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        fitrund = Fitrund(os.path.join(work, "fitrund"),
                          DAEMON + [f"--auth_tokens={tokens}", f"--tls_cert={cert}", f"--tls_key={key}"])
        self.addCleanup(fitrund.stop)
        self.assertTrue(fitrund.address, fitrund.log())
        with open(os.path.join(fitrund.state_dir, "fitrund.metrics_address")) as f:
            address = f.read().strip()
        # Without the token, fitrund refuses the scrape.
        with self.assertRaises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"https://{address}/metrics", timeout=10,
                                   context=ssl.create_default_context(cafile=cert))
        self.assertEqual(refused.exception.code, 401)

        with open(os.path.join(DEPLOY, "prometheus/prometheus.yml")) as f:
            config = prometheus_config(f.read(), address, os.path.join(DEPLOY, "prometheus/alerts.yml"), credentials,
                                       ca_file=cert)
        self.assertIn(f"credentials_file: {json.dumps(credentials)}", config)
        self.assertIn("scheme: https", config)
        prometheus = Prometheus(os.path.join(work, "prometheus"), config)
        self.addCleanup(prometheus.stop)
        try:
            targets = wait_for(lambda: [t for t in prometheus.api("targets")["activeTargets"]
                                        if t["scrapeUrl"] == f"https://{address}/metrics" and t["health"] == "up"],
                               30, f"Prometheus to scrape fitrund at https://{address} with the token")
            series = wait_for(lambda: prometheus.query('fitrun_build_info{job="fitrund"}'), 30,
                              "fitrun_build_info in Prometheus")
        except AssertionError:
            print(f"---- prometheus.log (last 40 lines)\n{''.join(prometheus.log().splitlines(True)[-40:])}")
            raise
        self.assertEqual(len(series), 1)
        print(f"\nPrometheus scraped the secured fitrund at https://{address} with its token: {targets[0]['health']}, "
              f"{series[0]['metric']}", flush=True)


if __name__ == "__main__":
    junit_main.main(argv=sys.argv[:1])
