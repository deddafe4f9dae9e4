"""Throwaway Unix accounts for the tests where fitrund (as root) runs jobs as their owners, and the
binaries their ranks run copied where those accounts can reach them (Bazel's output lies under /root,
0700), as an installed fitrun would lie under /usr or /opt."""

import hashlib
import os
import shutil
import subprocess

RUNFILES = os.path.join(os.environ.get("TEST_SRCDIR", ""), os.environ.get("TEST_WORKSPACE", "fitrun"))


def useradd(name):
    """Makes account `name` (no home, no login shell, a group of its own); returns its uid. Tests name
    accounts <prefix><pid>: accounts of the same prefix whose process is gone (a test killed before
    its teardown) are removed first, so none outlives the next run."""
    prefix = name.rstrip("0123456789")
    with open("/etc/passwd") as f:
        for line in f:
            other = line.split(":", 1)[0]
            pid = other[len(prefix):]
            if other.startswith(prefix) and pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
                userdel(other)
    subprocess.run(["/usr/sbin/useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", "--user-group", name],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return int(subprocess.run(["id", "-u", name], check=True, capture_output=True, text=True).stdout)


def userdel(name):
    subprocess.run(["/usr/sbin/userdel", name], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def world_readable(top):
    for directory, dirs, files in os.walk(top):
        os.chmod(directory, 0o755)
        for name in files:
            path = os.path.join(directory, name)
            os.chmod(path, 0o755 if os.access(path, os.X_OK) else 0o644)


def token_line(user, token, account=None):
    """A --auth_tokens line for `user` (role user) with `token`, and its Unix account if given."""
    return f"{user} user {hashlib.sha256(token.encode()).hexdigest()}{' ' + account if account else ''}\n"


def install_for_accounts(install):
    """Copies fitrun-worker, fitrun-supervisor, the memory library and the Python module under
    `install` (worker/, client/python/), readable by everyone; returns the worker's path."""
    os.makedirs(os.path.join(install, "worker", "memory"))
    for binary in ("fitrun-worker", "fitrun-supervisor"):
        source = os.path.join(RUNFILES, "worker", binary)
        if os.path.exists(source):
            shutil.copy(source, os.path.join(install, "worker", binary))
    memory_library = os.path.join(RUNFILES, "worker", "memory", "libfitrun_memory.so")
    if os.path.exists(memory_library):
        shutil.copy(memory_library, os.path.join(install, "worker", "memory"))
    python_module = os.path.join(RUNFILES, "client", "python", "fitrun")
    if os.path.exists(python_module):
        shutil.copytree(python_module, os.path.join(install, "client", "python", "fitrun"))
    world_readable(install)
    return os.path.join(install, "worker", "fitrun-worker")
