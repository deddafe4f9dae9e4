"""A real Slurm cluster on this one machine, for tests of fitrund's Slurm launcher.

    with SlurmCluster(workdir, nodes=3) as cluster:
        job_id = cluster.run(["sbatch", "--parsable", "--nodes=2", "job.sh"]).stdout.strip()

Debian's slurm-wlm and munge: one munged, one slurmctld and one slurmd per node, all children of the
test in process groups of their own, everything they write under `workdir`. Nodes n1..nN are told
apart by address, not by host: NodeAddr=127.0.0.2.. (Linux routes all of 127/8 to lo), each slurmd on a
port of its own (NodeName ... Port=, `slurmd -N nX`), every NodeHostname this host's short name. Node
names do not resolve, so a job that needs an address (MASTER_ADDR) reads NodeAddr from
`scontrol show node --oneliner`.

What this machine shapes:
- Authentication is munge with a private key and socket. Slurm ignores MUNGE_SOCKET: its daemons, its
  clients and slurmstepd all read the socket from slurm.conf's AuthInfo=socket=..., so pointing
  SLURM_CONF (in `cluster.env`) at the workdir's slurm.conf is all a client needs.
- Unix socket paths are limited to 107 bytes: the munge socket and slurmstepd's per-step sockets live
  under `workdir`, so it must be short (a directory under /tmp, not Bazel's TEST_TMPDIR).
- Nodes are declared, not measured: SlurmdParameters=config_overrides keeps the declared CPUs and
  RealMemory, so three 2-CPU nodes fit on a 2-core machine without being drained.
- No cgroups: ProctrackType=proctrack/linuxproc finds a job's processes through their parents and
  TaskPlugin=task/none confines nothing, so no cgroup.conf and no delegated hierarchy are needed (slurmd
  still loads its autodetected cgroup plugin, only to read).
- Simulated GPUs (gpus_per_node > 0): gres.conf names character devices made in the workdir with
  `mknod c 1 3` (what /dev/null is), so Slurm's placement and CUDA_VISIBLE_DEVICES are real, the
  devices are not.

Stopping (leaving the `with` block, SIGTERM, or the test dying outright) cancels every job, asks for
`scontrol shutdown`, then SIGKILLs whatever is left: each daemon's process group, then every process
whose environment carries this cluster's SLURM_CONF (slurmstepd and job tasks, which slurmd does not
keep in its group). start() first does the same sweep, for a crashed earlier run in the same workdir.
Nothing outside `workdir` is written or removed.
"""

import ctypes
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import time

# Where Debian puts the daemons; a test's PATH may leave out the sbin directories.
SEARCH_PATH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/usr/bin", "/sbin", "/bin"])
DAEMONS = ("munged", "slurmctld", "slurmd")
# The sun_path of a Unix socket holds 108 bytes with its terminating NUL.
MAX_SOCKET_PATH = 107
# Room slurmd needs under its spool directory for a step's socket: "/n12_4294967291.4294967291".
STEP_SOCKET_NAME = 32

_PR_SET_PDEATHSIG = 1


def missing_daemons():
    """The daemons this fixture needs that are not installed (tests skip when there are any)."""
    return [name for name in DAEMONS if shutil.which(name, path=SEARCH_PATH) is None]


def skip_unless_installed():
    """Skips the calling test (unittest) when the daemons are not installed, saying how to get them."""
    import unittest

    missing = missing_daemons()
    if missing:
        raise unittest.SkipTest(f"Slurm is not installed (no {', '.join(missing)} on PATH or in /usr/sbin): "
                                "apt-get install slurm-wlm munge, as tools/install-deps.sh does")


def short_directory(prefix="slurm-"):
    """A new directory under /tmp: TEST_TMPDIR is too long for the Unix sockets Slurm makes in it."""
    import tempfile

    return tempfile.mkdtemp(prefix=prefix, dir="/tmp")


def pid_alive(pid):
    """Whether `pid` runs (a zombie does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def free_port():
    """A TCP port the OS has just handed out on every address (and taken back): slurmd binds 0.0.0.0."""
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        return s.getsockname()[1]


def parse_oneliner(line):
    """`scontrol show ... --oneliner` as a dict. Values may hold spaces (OS=Linux 6.1 #1 SMP) or '='
    (TRES=cpu=4,node=2): a value ends where " Key=" starts."""
    key = r"[A-Za-z][\w:/]*"
    return {m.group(1): m.group(2)
            for m in re.finditer(rf"(?:^|\s)({key})=(.*?)(?=\s+{key}=|\s*$)", line.strip())}


def wait_for(condition, timeout, what, interval=0.1):
    """Polls `condition` until it returns something true, and returns that; fails after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


def _command_and_environment(pid):
    """A process's command line (raw) and environment (a list of b"NAME=value"), or None once it is gone."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read()
        with open(f"/proc/{pid}/environ", "rb") as f:
            environ = f.read().split(b"\0")
    except OSError:
        return None
    return cmdline, environ


def _die_with_parent():
    """In a daemon between fork and exec: SIGKILL it if the test process dies without stopping it."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


class SlurmError(RuntimeError):
    """A Slurm command or daemon failed; the message carries its output or its log's tail."""


class SlurmCluster:
    """A Slurm cluster of `nodes` nodes (n1..nN) with `cpus_per_node` CPUs, `real_memory_mib` MiB and
    `gpus_per_node` simulated GPUs each, in `workdir`. start() (or entering a `with` block) returns once
    every node is idle; stop() is idempotent. Not thread-safe: one thread starts, uses and stops it, and
    must outlive it (the daemons die with the thread that started them)."""

    def __init__(self, workdir, nodes=3, cpus_per_node=2, real_memory_mib=4096, gpus_per_node=0,
                 start_timeout=60):
        if not 1 <= nodes <= 250:
            raise ValueError(f"nodes: must be in 1..250 (NodeAddr 127.0.0.2..), got {nodes}")
        self.workdir = os.path.abspath(workdir)
        self.node_names = [f"n{i}" for i in range(1, nodes + 1)]
        self.cpus_per_node = cpus_per_node
        self.real_memory_mib = real_memory_mib
        self.gpus_per_node = gpus_per_node
        self.start_timeout = start_timeout
        self.hostname = socket.gethostname().split(".")[0]
        self.conf_path = os.path.join(self.workdir, "slurm.conf")
        self.log_dir = os.path.join(self.workdir, "log")
        self.munge_socket = os.path.join(self.workdir, "munge", "munge.socket")
        spool = os.path.join(self.workdir, "spool", "n" + "9" * len(str(nodes)))
        for path, room in ((self.munge_socket, 0), (spool, STEP_SOCKET_NAME)):
            if len(path) + room > MAX_SOCKET_PATH:
                raise ValueError(
                    f"workdir: {self.workdir!r} is too long for the Unix sockets under it "
                    f"({path!r} needs {len(path) + room} of {MAX_SOCKET_PATH} bytes); use a short "
                    "directory such as tempfile.mkdtemp(dir='/tmp')")
        self.ctld_port = None
        self.node_ports = {}
        self.env = None
        self._binaries = {}
        self._processes = {}  # name ("munged", "slurmctld", "slurmd-n1") -> Popen
        self._logs = []
        self._previous_sigterm = None

    # --- Public helpers -------------------------------------------------------------------------

    def node_addr(self, name):
        """The address slurmctld reaches node `name` at (n1 -> 127.0.0.2)."""
        return f"127.0.0.{self.node_names.index(name) + 2}"

    def daemon_pids(self):
        """The running daemons' pids: name ("munged", "slurmctld", "slurmd-n1") -> pid."""
        return {name: p.pid for name, p in self._processes.items() if p.poll() is None}

    def binary(self, name):
        """The absolute path of a Slurm or munge program."""
        if name not in self._binaries:
            path = shutil.which(name, path=SEARCH_PATH)
            if path is None:
                raise SlurmError(f"{name}: not installed (apt-get install slurm-wlm munge)")
            self._binaries[name] = path
        return self._binaries[name]

    def run(self, args, check=True, timeout=30, **kwargs):
        """Runs a Slurm client (`args[0]` a name such as "sbatch") with `env`; returns the
        CompletedProcess, text output captured. With `check`, a non-zero exit raises SlurmError."""
        result = subprocess.run([self.binary(args[0]), *args[1:]], env=self.env, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout, **kwargs)
        if check and result.returncode != 0:
            raise SlurmError(f"{' '.join(args)}: exit {result.returncode}: {result.stderr.strip()}")
        return result

    def nodes(self):
        """Every node as `scontrol show node --oneliner` tells it: name -> {field: value}."""
        lines = self.run(["scontrol", "show", "node", "--oneliner"]).stdout.splitlines()
        return {fields["NodeName"]: fields for fields in map(parse_oneliner, lines) if "NodeName" in fields}

    def job(self, job_id):
        """`scontrol show job --oneliner JOB_ID` as a dict, or None once slurmctld has forgotten the job."""
        result = self.run(["scontrol", "show", "job", "--oneliner", str(job_id)], check=False)
        if result.returncode != 0:
            if "Invalid job id" in result.stderr:
                return None
            raise SlurmError(f"scontrol show job {job_id}: {result.stderr.strip()}")
        return parse_oneliner(result.stdout.splitlines()[0])

    def job_processes(self, job_id):
        """Live pids of job `job_id` in this cluster: its slurmstepds ("slurmstepd: [ID.batch]") and
        every process whose environment has SLURM_JOB_ID=ID and this cluster's SLURM_CONF."""
        marker, job = f"SLURM_CONF={self.conf_path}".encode(), f"SLURM_JOB_ID={job_id}".encode()
        pids = []
        for pid in _pids():
            seen = _command_and_environment(pid)
            if seen is None:
                continue
            cmdline, environ = seen
            stepd = cmdline.startswith(f"slurmstepd: [{job_id}.".encode())
            if (stepd and marker in environ or marker in environ and job in environ) and not _zombie(pid):
                pids.append(pid)
        return pids

    def wait_idle(self, timeout=30):
        """Waits until every node is IDLE and nothing else (no job, not completing, not down)."""
        def all_idle():
            self._check_daemons()
            nodes = self.nodes()
            return sorted(nodes) == sorted(self.node_names) and all(
                n.get("State") == "IDLE" for n in nodes.values())
        try:
            wait_for(all_idle, timeout, "every node to be IDLE")
        except TimeoutError:
            states = {name: n.get("State") for name, n in self.nodes().items()}
            raise SlurmError(f"nodes not idle after {timeout} s: {states}\n{self.log_tails()}") from None

    def log_tails(self, lines=15):
        """The last lines of every daemon's logs, for failure messages."""
        out = []
        for path in sorted(os.listdir(self.log_dir)) if os.path.isdir(self.log_dir) else []:
            with open(os.path.join(self.log_dir, path), errors="replace") as f:
                tail = f.read().splitlines()[-lines:]
            out.append(f"--- {path}\n" + "\n".join(tail))
        return "\n".join(out)

    # --- Lifecycle ------------------------------------------------------------------------------

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop()

    def start(self):
        """Writes the configuration, starts munged, slurmctld and every slurmd, and returns once
        every node is idle. A port taken between being picked and being bound is picked again."""
        for attempt in range(3):
            try:
                self._start_once()
                return self
            except BaseException as e:
                self.stop()
                if attempt == 2 or not (isinstance(e, SlurmError) and "Address already in use" in str(e)):
                    raise

    def stop(self):
        """Cancels every job, shuts the cluster down, and kills whatever it leaves. Idempotent."""
        ctld = self._processes.get("slurmctld")
        if ctld is not None and ctld.poll() is None:
            try:
                self.run(["scancel", "--user", str(os.getuid())], check=False, timeout=10)
                wait_for(lambda: not self.run(["squeue", "--noheader", "--format=%i"], check=False,
                                              timeout=10).stdout.strip(), 10, "jobs to end")
            except (TimeoutError, subprocess.TimeoutExpired):
                pass  # The kills below end them.
            self.run(["scontrol", "shutdown"], check=False, timeout=10)
        slurm = [p for name, p in self._processes.items() if name != "munged"]
        try:
            wait_for(lambda: all(p.poll() is not None for p in slurm), 15, "slurmctld and slurmd to exit")
        except TimeoutError:
            pass
        for name, process in self._processes.items():
            if name != "munged":
                self._kill_group(process)
        self._kill_strays()  # slurmstepd and job tasks: not in slurmd's group.
        munged = self._processes.get("munged")
        if munged is not None and munged.poll() is None:
            munged.terminate()
            try:
                munged.wait(5)
            except subprocess.TimeoutExpired:
                pass
            self._kill_group(munged)
        for process in self._processes.values():
            process.wait()
        self._processes = {}
        for log in self._logs:
            log.close()
        self._logs = []
        if self._previous_sigterm is not None:
            signal.signal(signal.SIGTERM, self._previous_sigterm)
            self._previous_sigterm = None

    # --- Starting -------------------------------------------------------------------------------

    def _start_once(self):
        for name in DAEMONS:
            self.binary(name)
        self._kill_strays()
        self._catch_sigterm()
        self._prepare_dirs()
        self.ctld_port = free_port()
        self.node_ports = {name: free_port() for name in self.node_names}
        self._write_configs()
        self.env = self._client_env()
        daemon_env = dict(self.env)

        self._make_munge_key()
        self._spawn("munged", [self.binary("munged"), "--foreground",
                               f"--socket={self.munge_socket}",
                               f"--key-file={self._munge_path('munge.key')}",
                               f"--pid-file={self._munge_path('munged.pid')}",
                               f"--log-file={os.path.join(self.log_dir, 'munged.log')}",
                               f"--seed-file={self._munge_path('munged.seed')}"], daemon_env)
        self._wait(self._munge_ready, "munged to answer on its socket")

        # -c: no state from an earlier run in this workdir; -D: stay our child.
        self._spawn("slurmctld", [self.binary("slurmctld"), "-D", "-c", "-f", self.conf_path], daemon_env)
        self._wait(self._ctld_up, "slurmctld to answer scontrol ping")

        for name in self.node_names:
            self._spawn(f"slurmd-{name}", [self.binary("slurmd"), "-D", "-N", name, "-f", self.conf_path],
                        daemon_env)
        self.wait_idle(self.start_timeout)

    def _prepare_dirs(self):
        """The workdir's layout, minus whatever an earlier run left in it."""
        os.makedirs(self.workdir, exist_ok=True)
        # munged wants every directory above its socket searchable by all (mkdtemp makes 0700).
        os.chmod(self.workdir, stat.S_IMODE(os.stat(self.workdir).st_mode) | 0o111)
        path = os.path.dirname(self.workdir)
        while path != os.path.dirname(path):
            if not os.stat(path).st_mode & stat.S_IXOTH:
                raise SlurmError(f"workdir: munged needs {path!r} searchable by all (chmod o+x), or a "
                                 "workdir elsewhere")
            path = os.path.dirname(path)
        for sub in ("munge", "state", "spool", "log", "run", "dev"):
            shutil.rmtree(os.path.join(self.workdir, sub), ignore_errors=True)
        # munged wants its socket's directory searchable by all and writable by no one else.
        os.makedirs(os.path.join(self.workdir, "munge"))
        os.chmod(os.path.join(self.workdir, "munge"), 0o755)
        for sub in ("state", "log", "run", "dev"):
            os.makedirs(os.path.join(self.workdir, sub))
        for name in self.node_names:
            os.makedirs(os.path.join(self.workdir, "spool", name))

    def _munge_path(self, name):
        return os.path.join(self.workdir, "munge", name)

    def _make_munge_key(self):
        key = self._munge_path("munge.key")
        mungekey = shutil.which("mungekey", path=SEARCH_PATH)
        if mungekey:
            subprocess.run([mungekey, "--create", f"--keyfile={key}"], check=True, capture_output=True)
        else:  # munge before 0.5.14 has no mungekey.
            with open(key, "wb") as f:
                f.write(os.urandom(128))
        os.chmod(key, 0o400)

    def _fake_gpus(self, name):
        """Node `name`'s simulated GPU device files (made once, in the workdir)."""
        first = self.node_names.index(name) * self.gpus_per_node
        paths = [os.path.join(self.workdir, "dev", f"fakegpu{first + i}") for i in range(self.gpus_per_node)]
        for path in paths:
            if not os.path.exists(path):
                os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        return paths

    def _write_configs(self):
        w = self.workdir
        gres = f" Gres=gpu:fake:{self.gpus_per_node}" if self.gpus_per_node else ""
        node_lines = [
            f"NodeName={name} NodeAddr={self.node_addr(name)} NodeHostname={self.hostname} "
            f"Port={self.node_ports[name]} CPUs={self.cpus_per_node} Boards=1 SocketsPerBoard=1 "
            f"CoresPerSocket={self.cpus_per_node} ThreadsPerCore=1 RealMemory={self.real_memory_mib}{gres} "
            "State=UNKNOWN"
            for name in self.node_names]
        conf = [
            "# Written by tests/slurm/cluster.py: a cluster on one machine, every file in this directory.",
            f"ClusterName=fitrun{os.getpid()}",
            f"SlurmctldHost={self.hostname}(127.0.0.1)",
            f"SlurmctldPort={self.ctld_port}",
            f"SlurmUser={_user_name()}",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.munge_socket}",
            f"StateSaveLocation={w}/state",
            f"SlurmdSpoolDir={w}/spool/%n",
            f"SlurmctldPidFile={w}/run/slurmctld.pid",
            f"SlurmdPidFile={w}/run/slurmd-%n.pid",
            f"SlurmctldLogFile={w}/log/slurmctld.log",
            f"SlurmdLogFile={w}/log/slurmd-%n.log",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
            "SlurmdParameters=config_overrides",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "AccountingStorageType=accounting_storage/none",
            "JobAcctGatherType=jobacct_gather/none",
            "JobCompType=jobcomp/filetxt",
            f"JobCompLoc={w}/log/jobcomp.txt",
            "MpiDefault=none",
            "MailProg=/bin/true",
            "ReturnToService=2",
            "KillWait=2",
            "MinJobAge=30",
            "InactiveLimit=0",
            *(["GresTypes=gpu"] if self.gpus_per_node else []),
            *node_lines,
            "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
        ]
        with open(self.conf_path, "w") as f:
            f.write("\n".join(conf) + "\n")
        if self.gpus_per_node:
            with open(os.path.join(w, "gres.conf"), "w") as f:
                for name in self.node_names:
                    for path in self._fake_gpus(name):
                        f.write(f"NodeName={name} Name=gpu Type=fake File={path}\n")

    def _client_env(self):
        """This process's environment, minus any Slurm job's variables, plus SLURM_CONF."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_", "SRUN_"))}
        env["SLURM_CONF"] = self.conf_path
        env["PATH"] = SEARCH_PATH
        return env

    def _spawn(self, name, argv, env):
        log = open(os.path.join(self.log_dir, f"{name}.out"), "ab")
        self._logs.append(log)
        self._processes[name] = subprocess.Popen(
            argv, env=env, cwd=self.workdir, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True, preexec_fn=_die_with_parent)

    def _check_daemons(self):
        for name, process in self._processes.items():
            if process.poll() is not None:
                raise SlurmError(f"{name} exited with {process.returncode}\n{self.log_tails()}")

    def _wait(self, condition, what):
        def ready():
            self._check_daemons()
            return condition()
        try:
            wait_for(ready, self.start_timeout, what)
        except TimeoutError as e:
            raise SlurmError(f"{e}\n{self.log_tails()}") from None

    def _munge_ready(self):
        with socket.socket(socket.AF_UNIX) as s:
            try:
                s.connect(self.munge_socket)
                return True
            except OSError:
                return False

    def _ctld_up(self):
        result = self.run(["scontrol", "ping"], check=False, timeout=10)
        return result.returncode == 0 and " is UP" in result.stdout

    def _catch_sigterm(self):
        """Turns SIGTERM (a test runner's timeout) into SystemExit, so `with` blocks stop the cluster."""
        if self._previous_sigterm is not None or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
            return
        try:
            self._previous_sigterm = signal.signal(signal.SIGTERM, _exit_on_sigterm)
        except ValueError:
            pass  # Not the main thread: the daemons still die with this thread (PDEATHSIG).

    # --- Stopping -------------------------------------------------------------------------------

    @staticmethod
    def _kill_group(process):
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def _kill_strays(self):
        """SIGKILLs every process of this cluster, this process and its ancestors aside: those whose
        environment carries its SLURM_CONF (its daemons, slurmstepd, job tasks) and those whose command
        line names its slurm.conf or munge socket (daemons of a crashed run in this workdir, however
        they were started)."""
        marker = f"SLURM_CONF={self.conf_path}".encode()
        names = (self.conf_path.encode(), self.munge_socket.encode())
        spared = _ancestors()
        for _ in range(10):  # Tasks may fork while being killed.
            found = []
            for pid in _pids():
                if pid in spared:
                    continue
                seen = _command_and_environment(pid)
                if seen is None:
                    continue
                cmdline, environ = seen
                if marker in environ or any(name in cmdline for name in names):
                    found.append(pid)
            if not found:
                return
            for pid in found:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            try:
                wait_for(lambda: not any(os.path.exists(f"/proc/{pid}") and not _zombie(pid) for pid in found),
                         5, "killed processes to go")
            except TimeoutError:
                pass  # Looked for again on the next round.


def _exit_on_sigterm(signum, frame):
    raise SystemExit(128 + signum)


def _user_name():
    import pwd
    return pwd.getpwuid(os.getuid()).pw_name


def _pids():
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def _zombie(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return False


def _ancestors():
    """This process and its ancestors' pids."""
    pids, pid = set(), os.getpid()
    while pid > 0 and pid not in pids:
        pids.add(pid)
        try:
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        except OSError:
            break
    return pids
