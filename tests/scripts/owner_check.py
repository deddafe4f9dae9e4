"""A script rank that says who it runs as and which of the paths it is given it may read, then trains
as toy_train.py does.   owner_check.py [--try PATH,PATH,...] [toy_train.py's flags]

Prints `uid N`, then per path `read PATH`, `denied PATH` (permission denied) or `error PATH ...`.
"""

import os
import runpy
import sys

args = sys.argv[1:]
paths = []
if args[:1] == ["--try"]:
    paths = [p for p in args[1].split(",") if p]
    args = args[2:]
print(f"uid {os.getuid()}", flush=True)
for path in paths:
    try:
        if os.path.isdir(path):
            os.listdir(path)
        else:
            with open(path, "rb"):
                pass
        print(f"read {path}", flush=True)
    except PermissionError:
        print(f"denied {path}", flush=True)
    except OSError as error:
        print(f"error {path} {error}", flush=True)

toy_train = os.path.join(os.path.dirname(os.path.abspath(__file__)), "toy_train.py")
sys.argv = [toy_train] + args
runpy.run_path(toy_train, run_name="__main__")
