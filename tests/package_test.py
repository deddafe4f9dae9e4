"""The Debian package on this machine, as an operator uses it (root only; skipped otherwise, and where
a fitrun package is installed already): lintian finds no errors, `apt-get install ./fitrun_*.deb`,
`systemd-analyze verify` of the installed unit, fitrund started exactly as the unit's ExecStart (its
User, Group and WorkingDirectory; on ports the OS picks, given after the flag file), a built-in job and
a script job (the memory probe first, the fitrun module from /usr/lib/fitrun) to SUCCEEDED through
/usr/bin/fitrun; then an upgrade to a newer build keeps the jobs in /var/lib/fitrun and an edited
conffile, `apt-get remove` keeps the state and `apt-get purge` deletes it. Whatever happens, it
purges the package and kills what it started on the way out.

    package_test.py OLDER.deb NEWER.deb
"""

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

from jobs import wait_for
import junit_main

OLDER = NEWER = None
RUNFILES = os.path.join(os.environ.get("TEST_SRCDIR", ""), os.environ.get("TEST_WORKSPACE", "fitrun"))
UNIT = "/lib/systemd/system/fitrund.service"
FLAGS = "/etc/fitrun/fitrund.flags"
STATE = "/var/lib/fitrun"
# The folder the script job's files go in: one of the shipped flag file's --data_roots.
DATA_ROOT = "/srv/fitrun"
APT = ["apt-get", "-y", "-q", "-o", "DPkg::Lock::Timeout=300",
       "-o", "Dpkg::Options::=--force-confdef", "-o", "Dpkg::Options::=--force-confold"]


def run(argv, timeout=600, check=True):
    """Runs argv, returns its output (stdout and stderr together); fails the test on a non-zero exit."""
    done = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout,
                          env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
    if check and done.returncode != 0:
        raise AssertionError(f"{shlex.join(argv)} exited {done.returncode}:\n{done.stdout[-4000:]}")
    return done.stdout


def installed_version():
    done = subprocess.run(["dpkg-query", "-W", "-f=${Status} ${Version}", "fitrun"], stdout=subprocess.PIPE,
                          stderr=subprocess.DEVNULL, text=True)
    status = done.stdout.split()
    return status[3] if done.returncode == 0 and status[:3] == ["install", "ok", "installed"] else None


def unit_service_section(path):
    """The [Service] settings of a systemd unit: {key: [values]}, continuation lines joined."""
    settings, section, pending = {}, None, ""
    with open(path) as f:
        for raw in f:
            line = pending + raw.rstrip("\n")
            pending = ""
            if line.endswith("\\"):
                pending = line[:-1] + " "
                continue
            stripped = line.strip()
            if not stripped or stripped[0] in "#;":
                continue
            if stripped.startswith("["):
                section = stripped
                continue
            if section == "[Service]" and "=" in stripped:
                key, value = stripped.split("=", 1)
                settings.setdefault(key.strip(), []).append(value.strip())
    return settings


def processes_under_state():
    """Pids of fitrund's ranks and probes: their environment names an assignment under the state."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if any(v.startswith(f"FITRUN_ASSIGNMENT={STATE}/".encode()) for v in f.read().split(b"\0")):
                    found.append(int(entry))
        except OSError:
            pass
    return found


class ServiceAsTheUnitStartsIt:
    """fitrund as systemd would start fitrund.service: ExecStart's argv, as User/Group, in
    WorkingDirectory, with the unit's Environment/EnvironmentFile and systemd's PATH; its output (the
    journal's, under systemd) to a log file. Stopped with SIGTERM to the daemon only (KillMode=process)."""

    def __init__(self, log_path):
        service = unit_service_section(UNIT)
        self.settings = service
        argv = shlex.split(service["ExecStart"][-1])
        argv[0] = argv[0].lstrip("-@+!:")
        env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}
        for path in service.get("EnvironmentFile", []):
            optional = path.startswith("-")
            path = path.lstrip("-")
            if optional and not os.path.exists(path):
                continue
            with open(path) as f:
                for line in f:
                    if line.strip() and not line.lstrip().startswith("#") and "=" in line:
                        key, value = line.strip().split("=", 1)
                        env[key] = value.strip('"')
        for assignment in service.get("Environment", []):
            for word in shlex.split(assignment):
                key, value = word.split("=", 1)
                env[key] = value
        self.cwd = service["WorkingDirectory"][-1].lstrip("-")
        user = service.get("User", ["root"])[-1]
        group = service.get("Group", [user])[-1]
        # The unit's flags let a later flag override the flag file's: ports the OS picks.
        self.argv = ["setpriv", f"--reuid={user}", f"--regid={group}", "--init-groups", "--",
                     *argv, "--listen=127.0.0.1:0", "--metrics_listen=127.0.0.1:0"]
        for name in ("fitrund.address", "fitrund.metrics_address"):
            if os.path.exists(os.path.join(STATE, name)):
                os.remove(os.path.join(STATE, name))
        self._log = open(log_path, "a")
        self.process = subprocess.Popen(self.argv, cwd=self.cwd, env=env, stdout=self._log, stderr=subprocess.STDOUT)
        metrics = os.path.join(STATE, "fitrund.metrics_address")
        wait_for(lambda: (os.path.exists(metrics) and os.path.getsize(metrics) > 0) or self.process.poll() is not None,
                 60, "fitrund to serve")
        if self.process.poll() is not None:
            with open(log_path) as f:
                raise AssertionError(f"fitrund exited {self.process.returncode}:\n{f.read()[-4000:]}")
        with open(os.path.join(STATE, "fitrund.address")) as f:
            self.address = f.read().strip()

    def stop(self):
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()


class PackageTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        if os.geteuid() != 0:
            raise unittest.SkipTest("installs a package: needs root")
        if installed_version() is not None:
            raise unittest.SkipTest(f"fitrun {installed_version()} is installed on this machine: not touching it")
        if os.path.exists(STATE):
            raise unittest.SkipTest(f"{STATE} exists without the package: not touching it")
        cls.work = tempfile.mkdtemp(prefix="package-test-", dir=os.environ.get("TEST_TMPDIR"))
        cls.log_path = os.path.join(os.environ.get("TEST_UNDECLARED_OUTPUTS_DIR", cls.work), "fitrund.log")
        cls.daemon = None
        cls.made_data_root = not os.path.exists(DATA_ROOT)
        cls.scripts = None

    @classmethod
    def tearDownClass(cls):
        # Always: the daemon, any rank it left, the package and its state, the script folder.
        if cls.daemon is not None:
            cls.daemon.stop()
        for pid in processes_under_state():
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        if installed_version() is not None or os.path.exists(FLAGS):
            run(APT + ["purge", "fitrun"], check=False)
        shutil.rmtree(STATE, ignore_errors=True)
        if cls.scripts:
            shutil.rmtree(cls.scripts, ignore_errors=True)
        if cls.made_data_root:
            shutil.rmtree(DATA_ROOT, ignore_errors=True)
        shutil.rmtree(cls.work, ignore_errors=True)

    def start(self):
        type(self).daemon = ServiceAsTheUnitStartsIt(self.log_path)
        return self.daemon

    def stop(self):
        self.daemon.stop()
        type(self).daemon = None
        wait_for(lambda: not processes_under_state(), 30, "fitrund's ranks to end")

    def fitrun(self, *args, timeout=600, check=True):
        return run(["/usr/bin/fitrun", f"--coordinator={self.daemon.address}", *args], timeout=timeout, check=check)

    def submit_and_watch(self, spec_text, name):
        path = os.path.join(self.work, f"{name}.yaml")
        with open(path, "w") as f:
            f.write(spec_text)
        out = self.fitrun("submit", path, "--watch", check=False)
        job_id = re.search(r"submitted job (\S+)", out)
        self.assertIsNotNone(job_id, out[-3000:])
        self.assertIn(f"job {job_id.group(1)} SUCCEEDED", out, out[-3000:])
        return job_id.group(1), out

    def test_install_run_upgrade_remove_purge(self):
        older, newer = OLDER, NEWER
        fields = run(["dpkg-deb", "-f", older, "Package", "Version", "Depends"])
        self.assertIn("Package: fitrun", fields)
        for library in ("libtorch", "libgrpc++", "libprotobuf", "libabsl", "libsqlite3", "python3-grpcio"):
            self.assertIn(library, fields, "Depends comes from the libraries the programs load")
        older_version = run(["dpkg-deb", "-f", older, "Version"]).strip()
        newer_version = run(["dpkg-deb", "-f", newer, "Version"]).strip()
        run(["dpkg", "--compare-versions", newer_version, "gt", older_version])

        if shutil.which("lintian"):
            report = run(["lintian", "--tag-display-limit", "0", older], check=False)
            print(report)
            self.assertFalse([line for line in report.splitlines() if line.startswith("E:")], report)

        # Install, as an operator would (apt resolves Depends).
        run(APT + ["install", os.path.abspath(older)])
        self.assertEqual(installed_version(), older_version)
        for path in ("/usr/bin/fitrund", "/usr/bin/fitrun", "/usr/lib/fitrun/worker/fitrun-worker",
                     "/usr/lib/fitrun/worker/fitrun-supervisor", "/usr/lib/fitrun/worker/memory/libfitrun_memory.so",
                     "/usr/lib/fitrun/client/python/fitrun/__init__.py",
                     "/usr/lib/fitrun/client/python/fitrun/v1/coordinator_pb2_grpc.py",
                     "/usr/lib/fitrun/server/web/libfitrun-civetweb-ssl.so", UNIT, FLAGS):
            self.assertTrue(os.path.isfile(path), path)
        # A rank's programs start undumpable: executable, not readable, by the accounts that run them.
        for program in ("/usr/lib/fitrun/worker/fitrun-worker", "/usr/lib/fitrun/worker/fitrun-supervisor"):
            self.assertEqual(os.stat(program).st_mode & 0o777, 0o711, program)
        self.assertIn(FLAGS, run(["dpkg-query", "-W", "-f=${Conffiles}", "fitrun"]))
        self.assertTrue(os.path.isdir(STATE))
        self.assertEqual(os.stat(STATE).st_uid, int(run(["id", "-u", "fitrun"]).strip()))
        if shutil.which("systemd-analyze"):
            run(["systemd-analyze", "verify", UNIT])

        service = unit_service_section(UNIT)
        self.assertEqual(service["WorkingDirectory"], [STATE])
        with open(FLAGS) as f:
            self.assertIn(f"--state_dir={STATE}\n", f.read())

        # A built-in job and a script job, run as the unit runs fitrund.
        self.start()
        self.assertIn("cpu:0", self.fitrun("devices"))
        with open(os.path.join(RUNFILES, "deploy/examples/fashion-mnist-mlp.yaml")) as f:
            builtin_spec = f.read().replace("epochs: 1", "max_steps: 20")
        builtin_id, _ = self.submit_and_watch(builtin_spec, "builtin")

        os.makedirs(DATA_ROOT, exist_ok=True)
        type(self).scripts = tempfile.mkdtemp(prefix="package-test-", dir=DATA_ROOT)
        os.chmod(self.scripts, 0o755)
        shutil.copy(os.path.join(RUNFILES, "tests/scripts/toy_train.py"), self.scripts)
        os.chmod(os.path.join(self.scripts, "toy_train.py"), 0o644)
        script_spec = "\n".join([
            "name: package-script",
            "script:",
            "  command: [/usr/bin/python3, toy_train.py, --steps, '3']",
            f"  working_dir: {self.scripts}",
            "  env: {OMP_NUM_THREADS: '1'}",
            "global_batch_size: 16",
            "optimizer: {lr: 0.001}",
            "resources: {min_devices: 2, max_devices: 2}",
            ""])
        script_id, _ = self.submit_and_watch(script_spec, "script")
        events = self.fitrun("events", script_id)
        # Its first run measured it, through the preloaded allocator the package installs.
        self.assertIn("first steps peaked at", events, "the run measured its memory")
        logs = self.fitrun("logs", script_id)
        self.assertNotIn("libfitrun_memory.so is not", logs)
        self.stop()
        self.assertTrue(os.path.exists(os.path.join(STATE, "fitrun.db")))

        # Upgrade to the newer build: the edited conffile and the jobs are kept.
        with open(FLAGS, "a") as f:
            f.write("# kept across upgrades by the package test\n")
        run(APT + ["install", os.path.abspath(newer)])
        self.assertEqual(installed_version(), newer_version)
        with open(FLAGS) as f:
            self.assertIn("# kept across upgrades by the package test", f.read())
        self.start()
        listed = self.fitrun("list")
        for job_id in (builtin_id, script_id):
            self.assertRegex(listed, rf"{job_id}\s.*SUCCEEDED", listed)
        self.stop()

        # Remove keeps the state (and the conffile); purge deletes both.
        run(APT + ["remove", "fitrun"])
        self.assertIsNone(installed_version())
        self.assertFalse(os.path.exists("/usr/bin/fitrund"))
        self.assertTrue(os.path.exists(os.path.join(STATE, "fitrun.db")), "remove keeps the state")
        self.assertTrue(os.path.exists(FLAGS), "remove keeps the conffile")
        run(APT + ["purge", "fitrun"])
        self.assertFalse(os.path.exists(STATE), "purge deletes the state")
        self.assertFalse(os.path.exists(FLAGS), "purge deletes the conffile")
        self.assertFalse(os.path.exists("/usr/lib/fitrun"))


if __name__ == "__main__":
    OLDER, NEWER = (os.path.join(RUNFILES, p) for p in sys.argv[1:3])  # rootpaths, or absolute
    junit_main.main(argv=[sys.argv[0]] + sys.argv[3:])
