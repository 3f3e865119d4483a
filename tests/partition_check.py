"""Run by tests/test_partition.py under two torchruns of 2 ranks each (2 "nodes", gloo): every rank holds its
node's part of an image pack in shared memory (partition="node") and serves its share for two epochs; it
reports the samples it served, its node, and what of the node's segment it maps (PSS, from smaps)."""
import json
import os
import sys

import torch.distributed as dist

import dataprep
from dataprep.synthetic import decode_index


def segment_pss_kb(path: str) -> int:
    """Proportional set size of this process's mappings of `path` (kB): shared pages split among mappers."""
    total, inside = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()
            if head and "-" in head[0] and len(head) >= 5:  # a mapping's header line
                inside = line.rstrip().endswith(path)
            elif inside and line.startswith("Pss:"):
                total += int(head[1])
    return total


pack, out = sys.argv[1], sys.argv[2]
dist.init_process_group("gloo")
ds = dataprep.InMemoryImageDataset(pack, cache="shm", partition="node")
loader = dataprep.Loader(ds, 2, shuffle=True, seed=5)
mine = {"rank": dist.get_rank(), "node": ds.partition.node, "local_world": loader.world_size, "epochs": [],
        "held": len(ds.shapes), "nbytes": ds.nbytes}
for _ in range(2):
    mine["epochs"].append([decode_index(im.permute(1, 2, 0).numpy()) for x, _ in loader for im in x])
dist.barrier()  # every rank of the node has its segment mapped and touched
mine["pss_kb"] = segment_pss_kb(ds.segment)
mine["segment_bytes"] = os.path.getsize(ds.segment)
everyone = [None] * dist.get_world_size()
dist.all_gather_object(everyone, mine)
if dist.get_rank() == 0:
    with open(out, "w") as f:
        json.dump(everyone, f)
dist.barrier()
dist.destroy_process_group()
