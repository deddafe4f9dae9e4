"""A script rank that attacks the fitrund running it, as a job's owner could, then (unless the attack
ends it) trains as toy_train.py does.   hostile.py --attack NAME [--target PATH] [toy_train.py's flags]

Attacks, on the job's first attempt and never in the memory probe:
  symlink-checkpoints   replace the job's checkpoints directory with a symlink to --target, exit 1
  plant-assignment      make attempt-2/assignment.textproto a symlink to --target, exit 1
  symlink-attempt       make attempt-2 a symlink to the directory --target, exit 1
  log-symlink           replace this rank's log with a symlink to --target, exit 1
  log-fifo              replace this rank's log with a FIFO, exit 1
  forge-peak            report a peak of 60 GB for this rank, then train
  steal-token           look for the job token in this process's environment, try to open its
                        supervisor's /proc/<ppid>/environ and /proc/<ppid>/mem, say what worked, then train
"""

import os
import runpy
import shutil
import sys

args = sys.argv[1:]
attack = target = None
while args[:1] in (["--attack"], ["--target"]):
    if args[0] == "--attack":
        attack = args[1]
    else:
        target = args[1]
    args = args[2:]

probe = os.environ.get("FITRUN_PROBE") == "1"
attempt = int(os.environ.get("FITRUN_ATTEMPT", "1"))
checkpoints = os.environ.get("FITRUN_CHECKPOINT_DIR", "")
job_dir = os.path.dirname(checkpoints)
rank = os.environ.get("RANK", "0")
log = os.path.join(job_dir, f"attempt-{attempt}", f"rank-{rank}.log")


def done(what):
    print(f"hostile: {what}", flush=True)
    sys.exit(1)


if not probe and attempt == 1:
    if attack == "symlink-checkpoints":
        shutil.rmtree(checkpoints)
        os.symlink(target, checkpoints)
        done("checkpoints is now a symlink")
    elif attack == "plant-assignment":
        os.makedirs(os.path.join(job_dir, "attempt-2"), exist_ok=True)
        os.symlink(target, os.path.join(job_dir, "attempt-2", "assignment.textproto"))
        done("attempt-2/assignment.textproto is now a symlink")
    elif attack == "symlink-attempt":
        os.symlink(target, os.path.join(job_dir, "attempt-2"))
        done("attempt-2 is now a symlink")
    elif attack == "log-symlink":
        print("hostile: replacing the log", flush=True)
        os.unlink(log)
        os.symlink(target, log)
        sys.exit(1)
    elif attack == "log-fifo":
        print("hostile: replacing the log", flush=True)
        os.unlink(log)
        os.mkfifo(log)
        sys.exit(1)
    elif attack == "forge-peak":
        forged = '{"progress": {"rank": %s, "step": 1, "peakBytes": %d, "liveBytes": 1}}\n' % (rank, 60 << 30)
        os.write(int(os.environ["FITRUN_REPORT_FD"]), forged.encode())
    elif attack == "steal-token":
        found = [name for name in os.environ if name.startswith("FITRUN_JOB_TOKEN")]
        print(f"hostile: token in own environment: {found or 'none'}", flush=True)
        # Its memory holds the token: opening it is all it takes (then seek to the heap and read).
        for what in ("environ", "mem"):
            try:
                with open(f"/proc/{os.getppid()}/{what}", "rb"):
                    print(f"hostile: supervisor's {what}: opened", flush=True)
            except OSError as error:
                print(f"hostile: supervisor's {what}: denied ({error.strerror})", flush=True)

toy_train = os.path.join(os.path.dirname(os.path.abspath(__file__)), "toy_train.py")
sys.argv = [toy_train] + args
runpy.run_path(toy_train, run_name="__main__")
