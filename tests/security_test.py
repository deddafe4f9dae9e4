"""A fitrund people can share, with real daemons, real ranks and real certificates: TLS on both
services (the ranks dial back over it), plain text refused, the loopback rule (the metrics port's
too), users with bearer tokens who see and stop only their own jobs, tokens reloaded on SIGHUP, and
mutual TLS naming the job's owner. The metrics port over real HTTP and HTTPS: its API and /metrics
for the same users (each seeing their own jobs), a web session that a SIGHUP removing its token ends,
--metrics_public, and TLS with the gRPC port's certificates (a client certificate naming its holder). The CA and certificates are made by openssl for this run.
"""

import json
import os
import signal
import ssl
import subprocess
import sys
import tempfile
import unittest
import urllib.error
import urllib.request
from http.client import HTTPException

from fitrun.client import Client, ClientError
from jobs import Fitrund, run_to_end, state_name, wait_for
import junit_main

WORK = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))


def openssl(*args):
    subprocess.run(["openssl", *args], check=True, cwd=WORK, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def make_certificates():
    """ca.pem, server.pem/key for 127.0.0.1 and localhost, and alice.pem/key (common name alice)."""
    curve = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    openssl("req", "-x509", *curve, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=fitrun-test-ca")
    for name, extension in (("server", "subjectAltName=IP:127.0.0.1,DNS:localhost"), ("alice", "extendedKeyUsage=clientAuth")):
        openssl("req", *curve, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={'localhost' if name == 'server' else name}")
        with open(os.path.join(WORK, f"{name}.ext"), "w") as f:
            f.write(extension + "\n")
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                "-out", f"{name}.pem", "-days", "2", "-extfile", f"{name}.ext")


def path(name):
    return os.path.join(WORK, name)


def token_line(user, role, token):
    import hashlib

    return f"{user} {role} {hashlib.sha256(token.encode()).hexdigest()}\n"


def tiny_job(name, steps=3):
    return {
        "name": name,
        "model": {"builtin": "mlp"},
        "data": {"kind": "fashion_mnist", "path": "/usr/share/datasets/fashion-mnist"},
        "optimizer": {"kind": "sgd", "lr": 0.05},
        "global_batch_size": 64,
        "max_steps": steps,
        "resources": {"min_devices": 2, "max_devices": 2},
    }


def https_context(cert=None):
    """An HTTPS client's context trusting the test CA, presenting `cert` (a name: <cert>.pem/.key) if given."""
    context = ssl.create_default_context(cafile=path("ca.pem"))
    if cert:
        context.load_cert_chain(path(f"{cert}.pem"), path(f"{cert}.key"))
    return context


def http(address, path, token=None, cookie=None, method="GET", json_body=None, tls=None):
    """(status, headers, body) of one request to fitrund's metrics port at `address`; over HTTPS with
    the ssl.SSLContext `tls`."""
    data = json.dumps(json_body).encode() if json_body is not None else None
    request = urllib.request.Request(f"{'https' if tls else 'http'}://{address}{path}", data=data, method=method)
    if data is not None:
        request.add_header("Content-Type", "application/json")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    if cookie:
        request.add_header("Cookie", cookie)
    try:
        with urllib.request.urlopen(request, timeout=10, context=tls) as reply:
            return reply.status, reply.headers, reply.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read().decode()


def metrics_address(daemon):
    with open(os.path.join(daemon.state_dir, "fitrund.metrics_address")) as f:
        return f.read().strip()


DAEMON = ["--devices=cpu:2x1GiB", "--memory_probe=false"]
# Users whose jobs run as fitrund's own user: what this file checks is who sees and stops which job,
# whatever fitrund runs as (owners_test runs jobs as their owners' accounts).
AS_FITRUND = ["--unix_accounts=none"]
TLS = [f"--tls_cert={path('server.pem')}", f"--tls_key={path('server.key')}", f"--tls_ca={path('ca.pem')}"]


class TlsTest(unittest.TestCase):
    def test_a_tls_fitrund_refuses_plain_text_and_its_ranks_report_over_tls(self):
        with Fitrund(path("tls"), DAEMON + TLS) as daemon:
            self.assertIsNotNone(daemon.address, daemon.log())
            with self.assertRaises(ClientError) as plain:
                Client(daemon.address, timeout=5).list()
            self.assertEqual(plain.exception.code, "UNAVAILABLE")
            client = Client(daemon.address, ca=path("ca.pem"))
            job, events = run_to_end(client, tiny_job("over-tls"))
            self.assertEqual(state_name(job), "SUCCEEDED", job.failure_reason)
            # Progress came from both ranks: they dialled back over TLS with the CA they were given.
            self.assertEqual({e.progress.rank for e in events if e.WhichOneof("event") == "progress"}, {0, 1})

    def test_a_non_loopback_address_needs_tls_or_insecure(self):
        refused = Fitrund(path("open"), DAEMON, listen="0.0.0.0:0")
        self.assertIsNone(refused.address)
        self.assertNotEqual(refused.process.wait(timeout=10), 0)
        self.assertIn("--listen: 0.0.0.0 is not a loopback address", refused.log())
        self.assertIn("--insecure", refused.log())
        refused.stop()
        with Fitrund(path("open-insecure"), DAEMON + ["--insecure"], listen="0.0.0.0:0") as daemon:
            self.assertIsNotNone(daemon.address, daemon.log())
        with Fitrund(path("open-tls"), DAEMON + TLS, listen="0.0.0.0:0") as daemon:
            self.assertIsNotNone(daemon.address, daemon.log())

    def test_a_non_loopback_metrics_port_needs_tls_or_insecure(self):
        refused = Fitrund(path("metrics-open"), DAEMON + ["--metrics_listen=0.0.0.0:0"])
        self.assertIsNone(refused.address)
        self.assertNotEqual(refused.process.wait(timeout=10), 0)
        self.assertIn("--metrics_listen: 0.0.0.0 is not a loopback address", refused.log())
        self.assertIn("give --tls_cert and --tls_key", refused.log())
        self.assertIn("--insecure", refused.log())
        refused.stop()
        with Fitrund(path("metrics-open-insecure"), DAEMON + ["--metrics_listen=0.0.0.0:0", "--insecure"]) as daemon:
            self.assertIsNotNone(daemon.address, daemon.log())
            port = metrics_address(daemon).rsplit(":", 1)[1]
            self.assertEqual(http(f"127.0.0.1:{port}", "/api/session")[0], 200)
        with Fitrund(path("metrics-open-tls"), DAEMON + TLS + ["--metrics_listen=0.0.0.0:0"]) as daemon:
            self.assertIsNotNone(daemon.address, daemon.log())
            port = metrics_address(daemon).rsplit(":", 1)[1]
            self.assertEqual(http(f"127.0.0.1:{port}", "/api/session", tls=https_context())[0], 200)


class MetricsTlsTest(unittest.TestCase):
    """The metrics port over HTTPS with the gRPC port's certificate flags: no plain HTTP, the users'
    tokens and cookies over TLS only. (A client certificate naming its holder there: MutualTlsTest.)"""

    def test_with_tls_cert_the_metrics_port_speaks_https_only_and_its_cookie_is_secure(self):
        tokens = path("tls-web-tokens")
        with open(tokens, "w") as f:
            f.write(token_line("bob", "user", "bob-tls"))
        with Fitrund(path("metrics-tls"), DAEMON + AS_FITRUND + TLS + [f"--tls_client_ca={path('ca.pem')}",
                                                                      f"--auth_tokens={tokens}"]) as daemon:
            self.assertIsNotNone(daemon.address, daemon.log())
            self.assertIn(f"web page on https://{metrics_address(daemon)}/", daemon.log())
            address = metrics_address(daemon)
            status, _, body = http(address, "/api/session", tls=https_context())
            self.assertEqual(status, 401, body)
            status, _, body = http(address, "/api/session", token="bob-tls", tls=https_context())
            self.assertEqual((status, json.loads(body)["user"]), (200, "bob"), body)
            status, headers, body = http(address, "/api/session", method="POST", json_body={"token": "bob-tls"},
                                         tls=https_context())
            self.assertEqual(status, 200, body)
            self.assertIn("; Secure", headers["Set-Cookie"])
            # Plain HTTP on the TLS port is no answer at all, so nothing crosses it in the clear.
            with self.assertRaises((urllib.error.URLError, ConnectionError, HTTPException)):
                http(address, "/api/session", token="bob-tls")
            # fitrund is still serving after that, and after handshakes with and without a certificate.
            self.assertEqual(http(address, "/metrics", token="bob-tls", tls=https_context())[0], 200)


class UsersTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tokens = path("tokens")
        with open(cls.tokens, "w") as f:
            f.write("# user role sha256(token)\n" + token_line("alice", "user", "alice-token") +
                    token_line("bob", "user", "bob-token") + token_line("root", "admin", "root-token"))
        cls.daemon = Fitrund(path("users"), DAEMON + AS_FITRUND + [f"--auth_tokens={cls.tokens}"])
        assert cls.daemon.address, cls.daemon.log()

    @classmethod
    def tearDownClass(cls):
        cls.daemon.stop()

    def client(self, token=None):
        return Client(self.daemon.address, token=token)

    def test_without_a_known_token_nothing_is_answered(self):
        for token in (None, "guess"):
            with self.assertRaises(ClientError) as raised:
                self.client(token).list()
            self.assertEqual(raised.exception.code, "UNAUTHENTICATED")

    def test_users_see_and_stop_only_their_own_jobs_and_an_admin_every_job(self):
        alice, bob, root = self.client("alice-token"), self.client("bob-token"), self.client("root-token")
        done, _ = run_to_end(alice, tiny_job("alices"))
        self.assertEqual(done.owner, "alice")
        running = alice.submit(tiny_job("alices-long", steps=100000))
        wait_for(lambda: state_name(alice.get(running)) == "RUNNING", 60, "the long job to run")
        self.assertIn(running, [j.id for j in alice.list()])
        self.assertNotIn(running, [j.id for j in bob.list()])
        # ListDevices: the devices alice's job holds are shown to bob as another user's, never by id.
        held = {d.id: d.job_id for d in alice.devices() if d.job_id}
        self.assertEqual(set(held.values()), {running})
        seen_by_bob = {d.id: d for d in bob.devices()}
        for device in held:
            self.assertEqual((seen_by_bob[device].job_id, seen_by_bob[device].held_by_another_user), ("", True))
        self.assertEqual({d.id: d.job_id for d in root.devices() if d.job_id}, held)
        for call in (lambda: bob.get(running), lambda: bob.cancel(running), lambda: list(bob.watch(running)),
                     lambda: list(bob.logs(running))):
            with self.assertRaises(ClientError) as raised:
                call()
            self.assertEqual(raised.exception.code, "NOT_FOUND")  # not PERMISSION_DENIED: not even revealed
        # Word for word what a job that does not exist gets.
        with self.assertRaises(ClientError) as someone_elses:
            bob.get(running)
        with self.assertRaises(ClientError) as nobodys:
            bob.get("j-999999")
        self.assertEqual(str(someone_elses.exception).replace(running, "ID"),
                         str(nobodys.exception).replace("j-999999", "ID"))
        self.assertEqual(state_name(alice.get(running)), "RUNNING")
        self.assertIn(running, [j.id for j in root.list()])
        root.cancel(running, "an admin stops it")
        wait_for(lambda: state_name(alice.get(running)) == "CANCELLED", 30, "the admin's cancel")

    def test_a_new_token_works_after_sighup(self):
        with self.assertRaises(ClientError):
            self.client("carol-token").list()
        with open(self.tokens, "a") as f:
            f.write(token_line("carol", "user", "carol-token"))
        self.daemon.process.send_signal(signal.SIGHUP)
        wait_for(lambda: "reloaded --auth_tokens" in self.daemon.log(), 10, "the reload")
        self.assertEqual(self.client("carol-token").list(), [])


class MetricsPortTest(unittest.TestCase):
    """The page's API and /metrics of a fitrund with users: the gRPC API's users, over real HTTP.

    The job they look at ran before fitrund had users, so it is the user `local`'s; fitrund then starts
    again on the same state with users, `local` among them. (As root, a fitrund with users runs each job
    as its owner's Unix account, which these users do not have; tests/owners_test covers that.)"""

    @classmethod
    def setUpClass(cls):
        cls.tokens = path("web-tokens")
        cls.users = {"local": ("user", "local-web"), "bob": ("user", "bob-web"), "dave": ("user", "dave-web"),
                     "prometheus": ("user", "prometheus-web"), "root": ("admin", "root-web")}
        cls.write_tokens(cls.users)
        with Fitrund(path("web"), DAEMON) as before_users:
            assert before_users.address, before_users.log()
            cls.job, _ = run_to_end(Client(before_users.address), tiny_job("before-users"))
        cls.daemon = Fitrund(path("web"), DAEMON + [f"--auth_tokens={cls.tokens}"])
        assert cls.daemon.address, cls.daemon.log()
        cls.metrics = metrics_address(cls.daemon)

    @classmethod
    def tearDownClass(cls):
        cls.daemon.stop()

    @classmethod
    def write_tokens(cls, users):
        with open(cls.tokens, "w") as f:
            f.write("".join(token_line(user, role, token) for user, (role, token) in users.items()))

    def test_the_api_and_metrics_answer_users_only_and_each_sees_their_own_jobs(self):
        for where in ("/api/jobs", "/api/devices", "/api/session", "/metrics"):
            for token in (None, "guess"):
                status, headers, body = http(self.metrics, where, token=token)
                self.assertEqual(status, 401, f"{where}: {body}")
                self.assertIn("Authorization: Bearer <token>" if token is None else "not one fitrund knows", body)
                self.assertEqual(headers["WWW-Authenticate"], 'Bearer realm="fitrund"')
        status, _, page = http(self.metrics, "/")
        self.assertEqual(status, 200)
        self.assertIn("Sign in to fitrund", page)

        job = self.job
        self.assertEqual(state_name(job), "SUCCEEDED", job.failure_reason)
        self.assertEqual(job.owner, "local")
        listed = {user: [j["id"] for j in json.loads(http(self.metrics, "/api/jobs", token=f"{user}-web")[2])["jobs"]]
                  for user in ("local", "bob", "root")}
        self.assertEqual(listed, {"local": [job.id], "bob": [], "root": [job.id]})
        hidden = http(self.metrics, f"/api/jobs/{job.id}", token="bob-web")
        missing = http(self.metrics, "/api/jobs/j-999999", token="bob-web")
        self.assertEqual((hidden[0], missing[0]), (404, 404))
        self.assertEqual(json.loads(hidden[2])["error"].replace(job.id, "ID"),
                         json.loads(missing[2])["error"].replace("j-999999", "ID"))
        self.assertEqual(http(self.metrics, f"/api/jobs/{job.id}/events", token="bob-web")[0], 404)
        self.assertEqual(http(self.metrics, f"/api/jobs/{job.id}", token="local-web")[0], 200)

        status, _, text = http(self.metrics, "/metrics", token="prometheus-web")
        self.assertEqual(status, 200)
        self.assertIn('fitrun_build_info{version="v1"} 1', text)

    def test_a_web_session_ends_when_a_reload_removes_its_token(self):
        status, headers, body = http(self.metrics, "/api/session", method="POST", json_body={"token": "dave-web"})
        self.assertEqual(status, 200, body)
        self.assertEqual(json.loads(body)["user"], "dave")
        set_cookie = headers["Set-Cookie"]
        self.assertRegex(set_cookie, r"^fitrun_session=[0-9a-f]{64}; Path=/; Max-Age=43200; HttpOnly; SameSite=Strict$")
        cookie = set_cookie.split(";")[0]
        self.assertEqual(http(self.metrics, "/api/jobs", cookie=cookie)[0], 200)
        self.assertEqual(http(self.metrics, "/metrics", cookie=cookie)[0], 200)
        self.assertIn("window.fitrunPage", http(self.metrics, "/", cookie=cookie)[2])

        reloads = self.daemon.log().count("reloaded --auth_tokens")
        self.write_tokens({user: entry for user, entry in self.users.items() if user != "dave"})
        self.addCleanup(self.write_tokens, self.users)
        self.daemon.process.send_signal(signal.SIGHUP)
        wait_for(lambda: self.daemon.log().count("reloaded --auth_tokens") > reloads, 10, "the reload")
        status, _, body = http(self.metrics, "/api/jobs", cookie=cookie)
        self.assertEqual(status, 401)
        self.assertIn("sign in again", body)
        self.assertEqual(http(self.metrics, "/api/session", method="POST", json_body={"token": "dave-web"})[0], 401)

    def test_metrics_public_opens_metrics_alone(self):
        with Fitrund(path("web-public"), DAEMON + [f"--auth_tokens={self.tokens}", "--metrics_public"]) as daemon:
            self.assertIsNotNone(daemon.address, daemon.log())
            status, _, text = http(metrics_address(daemon), "/metrics")
            self.assertEqual(status, 200)
            self.assertIn("fitrun_build_info", text)
            self.assertEqual(http(metrics_address(daemon), "/api/jobs")[0], 401)


class DataRootsTest(unittest.TestCase):
    def test_files_outside_the_data_roots_are_refused_naming_the_field_and_nothing_is_stored(self):
        escape = path("escape.pt")
        if not os.path.islink(escape):
            os.symlink("/etc/passwd", escape)
        outside = [
            ("spec.data.path", {"kind": "fashion_mnist", "path": "/etc"}),
            ("spec.data.path", {"kind": "tensors", "path": "/etc/shadow"}),
            ("spec.data.path", {"kind": "tensors", "path": escape}),
            ("spec.data.path", {"kind": "tensors", "path": os.path.join(WORK, "..", "..", "..", "etc", "shadow")}),
        ]
        with Fitrund(path("roots"), DAEMON) as daemon:
            client = Client(daemon.address)
            for field, data in outside:
                spec = tiny_job("outside")
                spec["data"] = data
                if data["kind"] == "tensors":
                    spec["model"] = {"torchscript": path("model.pt")}
                for call in (client.submit, client.plan):
                    with self.assertRaises(ClientError) as raised:
                        call(spec)
                    self.assertEqual(raised.exception.code, "INVALID_ARGUMENT")
                    self.assertIn(f"{field}: ", raised.exception.message)
                    self.assertIn("is outside the folders fitrund may read", raised.exception.message)
            spec = tiny_job("model-outside")
            spec["model"] = {"torchscript": "/etc/passwd"}
            spec["data"] = {"kind": "tensors", "path": path("data.pt")}
            with self.assertRaises(ClientError) as raised:
                client.submit(spec)
            self.assertIn("spec.model.torchscript: '/etc/passwd' is outside", raised.exception.message)
            self.assertEqual(client.list(), [])


class MutualTlsTest(unittest.TestCase):
    def test_a_client_certificate_names_the_jobs_owner_on_both_ports(self):
        flags = DAEMON + AS_FITRUND + TLS + [f"--tls_client_ca={path('ca.pem')}"]
        with Fitrund(path("mtls"), flags) as daemon:
            self.assertIsNotNone(daemon.address, daemon.log())
            alice = Client(daemon.address, ca=path("ca.pem"), cert=path("alice.pem"), key=path("alice.key"))
            job, _ = run_to_end(alice, tiny_job("by-certificate"))
            self.assertEqual(state_name(job), "SUCCEEDED", job.failure_reason)
            self.assertEqual(job.owner, "alice")
            with self.assertRaises(ClientError) as anonymous:
                Client(daemon.address, ca=path("ca.pem")).list()
            self.assertEqual(anonymous.exception.code, "UNAUTHENTICATED")

            # The metrics port over HTTPS: the same certificate names alice there, who sees her job.
            address = metrics_address(daemon)
            status, _, body = http(address, "/api/jobs", tls=https_context("alice"))
            self.assertEqual(status, 200, body)
            self.assertEqual([j["id"] for j in json.loads(body)["jobs"]], [job.id])
            self.assertEqual(http(address, "/api/session", tls=https_context("alice"))[2],
                             '{"user":"alice","admin":false,"secured":true}')
            # Without a certificate (or a token) the page's API refuses.
            self.assertEqual(http(address, "/api/jobs", tls=https_context())[0], 401)
            # A certificate for "alice" that the CA did not sign ends the handshake.
            openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                    "-keyout", "mallory.key", "-out", "mallory.pem", "-days", "2", "-subj", "/CN=alice")
            with self.assertRaises((urllib.error.URLError, ssl.SSLError, ConnectionError)):
                http(address, "/api/jobs", tls=https_context("mallory"))
            self.assertEqual(http(address, "/api/jobs", tls=https_context("alice"))[0], 200)


if __name__ == "__main__":
    make_certificates()
    junit_main.main(argv=[sys.argv[0]])
