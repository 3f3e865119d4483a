"""Run by tests/test_ddp.py under torchrun: each rank serves its DistributedSampler share of a pack."""
import json
import os
import sys

import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler

from dataprep.images.dataset import InMemoryImageDataset
from dataprep.synthetic import decode_index

pack, mode, out = sys.argv[1], sys.argv[2], sys.argv[3]
dist.init_process_group("gloo")
rank = dist.get_rank()
ds = InMemoryImageDataset(pack, cache=mode)
sampler = DistributedSampler(ds, shuffle=True, seed=7)
epochs = []
for epoch in range(2):
    sampler.set_epoch(epoch)
    seen = []
    for images, _ in DataLoader(ds, batch_size=4, sampler=sampler, num_workers=2):
        seen += [decode_index(im.permute(1, 2, 0).numpy()) for im in images]
    epochs.append(seen)
mine = {"rank": rank, "epochs": epochs, "segment": ds.segment, "pid": os.getpid()}
everyone = [None] * dist.get_world_size()
dist.all_gather_object(everyone, mine)
dist.barrier()
if rank == 0:
    with open(out, "w") as f:
        json.dump(everyone, f)
del ds
dist.destroy_process_group()
