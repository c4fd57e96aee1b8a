"""One rank of a torchrun job for test_elastic.py: an epoch of dlframe.batches over Parquet
files (shard="auto", 64 rows a global step), an all-reduce per batch as DDP makes one; it stops
after `stop` steps with rank 0 saving the state, or continues from the saved state. Writes the
row ids of its batches to <out>/<phase>-<rank>.json.

Usage: torchrun --standalone --nproc-per-node=W elastic_job.py DATA OUT PHASE STOP STATE"""

import json
import sys

import numpy as np
import torch
import torch.distributed as dist

import dlframe

data, out, phase, stop, state = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
try:
    b = dlframe.batches(data, 64 // world, shard="auto", columns="dict", shuffle=True, seed=5)
    b.set_epoch(1)
    if phase == "rest":
        with open(state) as f:
            b.load_state_dict(json.load(f))
    got = []
    for x in b:
        got.append(np.from_dlpack(x["id"]).tolist())
        dist.all_reduce(torch.ones(1))
        if len(got) == stop:
            if rank == 0:
                with open(state, "w") as f:
                    json.dump(b.state_dict(), f)
            break
    with open(f"{out}/{phase}-{rank}.json", "w") as f:
        json.dump(got, f)
finally:
    dist.destroy_process_group()
