"""The fitrun package installed the usual way: pip builds it from a checkout with the in-tree backend
and no package index, into a fresh virtual environment over Debian's Python, and what imports there
is the environment's own copy. Also the wheel's files and RECORD, an sdist carrying the protos, an
editable install, and the backend's TOML reader for Pythons without tomllib."""

import base64
import csv
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import tomllib
import unittest
import zipfile

RUNFILES = os.path.join(os.environ.get("TEST_SRCDIR", ""), os.environ.get("TEST_WORKSPACE", "fitrun"))
TMP = os.environ.get("TEST_TMPDIR") or tempfile.mkdtemp()
PROTOS = sorted(name[:-len(".proto")] for name in os.listdir(os.path.join(RUNFILES, "proto/fitrun/v1")))

sys.path.insert(0, os.path.join(RUNFILES, "client/python/build_backend"))
import fitrun_build  # noqa: E402
import junit_main  # noqa: E402

# pip with no index and no user configuration, so nothing can come from anywhere but this machine;
# and without the test's PYTHONPATH (the runfiles), so only what is installed can be imported.
ENV = {key: value for key, value in os.environ.items() if not key.startswith(("PIP_", "PYTHON"))}
ENV.update(PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_CACHE_DIR="1",
           PIP_CONFIG_FILE=os.devnull, PYTHONDONTWRITEBYTECODE="1")

IMPORTS = """
import json, grpc, fitrun, fitrun.client
from fitrun.v1 import coordinator_pb2_grpc, job_pb2
assert fitrun.Client is fitrun.client.Client, fitrun.Client
stub = coordinator_pb2_grpc.CoordinatorStub(grpc.insecure_channel("127.0.0.1:1"))
spec = job_pb2.JobSpec.FromString(job_pb2.JobSpec(name="mlp").SerializeToString())
print(json.dumps({"fitrun": fitrun.__file__, "stubs": coordinator_pb2_grpc.__file__, "spec": spec.name}))
"""


def run(*command, cwd=None):
    result = subprocess.run(command, cwd=cwd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if result.returncode != 0:
        raise AssertionError(f"{' '.join(command)} exited {result.returncode}:\n{result.stdout}")
    return result.stdout


class PackageTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        # A checkout as a user has one: real files (runfiles are links into the workspace, whose
        # ../../proto would be found through them), client/python and proto/ where the repository has them.
        cls.checkout = os.path.join(TMP, "checkout")
        cls.project = os.path.join(cls.checkout, "client/python")
        files = ["client/python/pyproject.toml", "client/python/README.md",
                 "client/python/build_backend/fitrun_build.py"]
        files += [os.path.join("client/python/fitrun", name)
                  for name in os.listdir(os.path.join(RUNFILES, "client/python/fitrun")) if name.endswith(".py")]
        files += [f"proto/fitrun/v1/{name}.proto" for name in PROTOS]
        for name in files:
            os.makedirs(os.path.dirname(os.path.join(cls.checkout, name)), exist_ok=True)
            shutil.copyfile(os.path.join(RUNFILES, name), os.path.join(cls.checkout, name))
        cls.sources = sorted(name for name in os.listdir(os.path.join(cls.project, "fitrun")))

        # Debian's python3-venv; its pip is the venv's own (ensurepip), and python3-grpcio,
        # python3-protobuf and python3-torch are seen through --system-site-packages.
        cls.venv = os.path.join(TMP, "venv")
        run("/usr/bin/python3", "-m", "venv", "--system-site-packages", cls.venv)
        cls.python = os.path.join(cls.venv, "bin/python")
        cls.site_packages = run(cls.python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").strip()
        # Imports run from here: neither the checkout nor the runfiles.
        cls.elsewhere = tempfile.mkdtemp(dir=TMP, prefix="elsewhere.")

    def pip(self, *args, cwd=None):
        return run(self.python, "-m", "pip", *args, cwd=cwd)

    def imported(self):
        return json.loads(run(self.python, "-c", IMPORTS, cwd=self.elsewhere))

    def build_wheel(self, source, name):
        out = tempfile.mkdtemp(dir=TMP, prefix=f"{name}.")
        self.pip("wheel", "--no-deps", "-w", out, source, cwd=self.elsewhere)
        (wheel,) = os.listdir(out)
        self.assertEqual(wheel, "fitrun-0.1.0-py3-none-any.whl")
        return os.path.join(out, wheel)

    def test_pip_installs_the_checkout_offline_and_the_venv_imports_its_own_copy(self):
        self.pip("uninstall", "-y", "fitrun")
        # With its dependencies: grpcio and protobuf are found installed (Debian's), not fetched.
        self.pip("install", self.project)
        found = self.imported()
        package = os.path.join(self.site_packages, "fitrun") + os.sep
        self.assertTrue(found["fitrun"].startswith(package), found)
        self.assertTrue(found["stubs"].startswith(package + "v1" + os.sep), found)
        self.assertEqual(found["spec"], "mlp")
        show = self.pip("show", "-f", "fitrun")
        self.assertIn("Requires: grpcio, protobuf", show)
        self.assertIn("fitrun/v1/coordinator_pb2_grpc.py", show)
        self.pip("uninstall", "-y", "fitrun")
        self.assertNotIn("fitrun", os.listdir(self.site_packages))

    def test_the_wheel_holds_the_package_and_its_stubs_and_records_each_file_hash(self):
        with zipfile.ZipFile(self.build_wheel(self.project, "wheel")) as wheel:
            names = wheel.namelist()
            dist_info = "fitrun-0.1.0.dist-info/"
            expected = [f"fitrun/{name}" for name in self.sources]
            expected += ["fitrun/v1/__init__.py"] + [f"fitrun/v1/{p}_pb2{g}.py" for p in PROTOS for g in ("", "_grpc")]
            expected += [dist_info + name for name in ("METADATA", "WHEEL", "RECORD")]
            self.assertEqual(sorted(names), sorted(expected))
            self.assertEqual(names[-1], dist_info + "RECORD")

            rows = list(csv.reader(io.StringIO(wheel.read(dist_info + "RECORD").decode())))
            self.assertEqual(rows[-1], [dist_info + "RECORD", "", ""])
            self.assertEqual(sorted(row[0] for row in rows), sorted(names))
            for name, digest, size in rows[:-1]:
                data = wheel.read(name)
                sha256 = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
                self.assertEqual((digest, int(size)), (f"sha256={sha256}", len(data)), name)

            metadata = wheel.read(dist_info + "METADATA").decode()
            headers = metadata.split("\n\n", 1)[0].splitlines()
            for line in ("Metadata-Version: 2.1", "Name: fitrun", "Version: 0.1.0", "Requires-Python: >=3.8",
                         "Requires-Dist: grpcio", "Requires-Dist: protobuf>=3.20"):
                self.assertIn(line, headers)
            self.assertIn("pip install ./client/python", metadata)  # the README as the description
            self.assertEqual(wheel.read(dist_info + "WHEEL").decode().splitlines(),
                             ["Wheel-Version: 1.0", "Generator: fitrun_build", "Root-Is-Purelib: true",
                              "Tag: py3-none-any"])

    def test_an_sdist_carries_the_protos_and_builds_the_same_wheel_away_from_the_repository(self):
        out = tempfile.mkdtemp(dir=TMP, prefix="sdist.")
        name = run(self.python, "-c", "import sys; sys.path.insert(0, 'build_backend'); import fitrun_build; "
                   "print(fitrun_build.build_sdist(sys.argv[1]))", out, cwd=self.project).strip()
        self.assertEqual(name, "fitrun-0.1.0.tar.gz")
        sdist = os.path.join(out, name)
        with tarfile.open(sdist) as tar:
            members = tar.getnames()
        for member in ["PKG-INFO", "pyproject.toml", "README.md", "build_backend/fitrun_build.py"] + \
                [f"fitrun/{name}" for name in self.sources] + [f"proto/fitrun/v1/{p}.proto" for p in PROTOS]:
            self.assertIn(f"fitrun-0.1.0/{member}", members)
        # pip unpacks the sdist into a directory of its own, where ../../proto is not the checkout's.
        from_sdist = self.build_wheel(sdist, "from-sdist")
        from_tree = self.build_wheel(self.project, "from-tree")
        with open(from_sdist, "rb") as a, open(from_tree, "rb") as b:
            self.assertEqual(a.read(), b.read())

    def test_an_editable_install_imports_the_checkout_with_stubs_generated_in_it(self):
        self.pip("uninstall", "-y", "fitrun")
        self.pip("install", "-e", self.project)
        try:
            found = self.imported()
            package = os.path.join(self.project, "fitrun") + os.sep
            self.assertTrue(found["fitrun"].startswith(package), found)
            self.assertTrue(found["stubs"].startswith(package + "v1" + os.sep), found)
        finally:
            self.pip("uninstall", "-y", "fitrun")
            shutil.rmtree(os.path.join(self.project, "fitrun/v1"), ignore_errors=True)

    def test_the_backend_reads_pyproject_without_tomllib_as_tomllib_does(self):
        with open(os.path.join(RUNFILES, "client/python/pyproject.toml")) as f:
            text = f.read()
        self.assertEqual(fitrun_build._parse_simple_toml(text), tomllib.loads(text))
        self.assertEqual(fitrun_build._parse_simple_toml('[a.b]\nc = [ # one\n  "x#y",\n  \'z\',  # two\n]\n'),
                         {"a": {"b": {"c": ["x#y", "z"]}}})
        with self.assertRaises(fitrun_build.BuildError):
            fitrun_build._parse_simple_toml("flag = true\n")


if __name__ == "__main__":
    junit_main.main(argv=[sys.argv[0]])
