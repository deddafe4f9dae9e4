"""Runs a command as one rank of a torch.distributed job launched by `srun`:

    srun python3 rank_shim.py [--] COMMAND [ARGS...]

It turns Slurm's per-task variables into the ones torch.distributed's env:// rendezvous (and
torchrun-style scripts) read, then execs COMMAND:

    RANK              = SLURM_PROCID      the task's rank in the step
    LOCAL_RANK        = SLURM_LOCALID     its rank on its node
    GROUP_RANK        = SLURM_NODEID      its node's index in the step
    WORLD_SIZE        = SLURM_NTASKS      tasks in the step
    LOCAL_WORLD_SIZE  = this node's count in SLURM_TASKS_PER_NODE ("2(x2),1": 2, 2, 1)
    MASTER_ADDR       = NodeAddr of the step's first node (rank 0's under the default block
                        distribution), read with `scontrol show node --oneliner`: node names need
                        not resolve (tests/slurm/cluster.py's n1.. do not)
    MASTER_PORT       = 20000 + SLURM_JOB_ID % 10000, unique to the job among those running, below
                        Linux's ephemeral ports so no outgoing connection holds it

MASTER_ADDR and MASTER_PORT are left alone when the environment already has them. The test-side copy
of the mapping; fitrund ships its own with its Slurm launcher.
"""

import os
import re
import subprocess
import sys


def tasks_on_node(tasks_per_node, node_id):
    """This node's entry in SLURM_TASKS_PER_NODE, whose runs are compressed: "2(x2),1" is 2, 2, 1."""
    counts = []
    for part in tasks_per_node.split(","):
        m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if not m:
            raise ValueError(f"SLURM_TASKS_PER_NODE: cannot read {tasks_per_node!r}")
        counts += [int(m.group(1))] * int(m.group(2) or 1)
    return counts[node_id]


def first_node_addr(nodelist):
    """The address of the first node of a Slurm node list ("n[1-2]"), from slurmctld."""
    names = subprocess.run(["scontrol", "show", "hostnames", nodelist], check=True, text=True,
                           stdout=subprocess.PIPE).stdout.split()
    node = subprocess.run(["scontrol", "show", "node", "--oneliner", names[0]], check=True, text=True,
                          stdout=subprocess.PIPE).stdout
    m = re.search(r"\bNodeAddr=(\S+)", node)
    if not m:
        raise RuntimeError(f"scontrol show node {names[0]}: no NodeAddr in {node!r}")
    return m.group(1)


def rank_env(env):
    """The torch.distributed variables for the Slurm task whose environment is `env`."""
    node_id = int(env["SLURM_NODEID"])
    out = {
        "RANK": env["SLURM_PROCID"],
        "LOCAL_RANK": env["SLURM_LOCALID"],
        "GROUP_RANK": str(node_id),
        "WORLD_SIZE": env["SLURM_NTASKS"],
        "LOCAL_WORLD_SIZE": str(tasks_on_node(env["SLURM_TASKS_PER_NODE"], node_id)),
    }
    if "MASTER_ADDR" not in env:
        out["MASTER_ADDR"] = first_node_addr(env.get("SLURM_STEP_NODELIST") or env["SLURM_JOB_NODELIST"])
    if "MASTER_PORT" not in env:
        out["MASTER_PORT"] = str(20000 + int(env["SLURM_JOB_ID"]) % 10000)
    return out


def main(argv):
    command = argv[1:]
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        sys.exit("usage: srun python3 rank_shim.py [--] COMMAND [ARGS...]")
    os.environ.update(rank_env(os.environ))
    os.execvp(command[0], command)


if __name__ == "__main__":
    main(sys.argv)
