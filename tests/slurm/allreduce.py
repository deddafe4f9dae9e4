"""One rank of a Gloo all_reduce over torch.distributed's env:// rendezvous (RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT, as worker/slurm/rank_shim.sh and the batch script set them). Rank r contributes r + 1; it prints one JSON line
with what it was told and the reduced value, which every rank must see as WORLD_SIZE*(WORLD_SIZE+1)/2.
"""

import datetime
import json
import os

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo", init_method="env://", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    value = torch.tensor([float(rank + 1)])
    dist.all_reduce(value)
    print(json.dumps({
        "rank": rank,
        "world_size": dist.get_world_size(),
        "local_rank": int(os.environ["LOCAL_RANK"]),
        "group_rank": int(os.environ["GROUP_RANK"]),
        "local_world_size": int(os.environ["LOCAL_WORLD_SIZE"]),
        "slurm_node_id": int(os.environ["SLURM_NODEID"]),
        "node": os.environ["SLURMD_NODENAME"],
        "master": f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}",
        "value": value.item(),
    }), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
