"""Run by tests/test_resume.py under torchrun: each rank serves its Loader share of an image and a token
pack for two epochs, ranks taken from torch.distributed, no sampler and no set_epoch."""
import json
import sys

import torch.distributed as dist

import dataprep
from dataprep.synthetic import decode_index

images, tokens, out = sys.argv[1], sys.argv[2], sys.argv[3]
dist.init_process_group("gloo")
rank = dist.get_rank()
img = dataprep.Loader(dataprep.InMemoryImageDataset(images), 4, shuffle=True, seed=3, num_workers=2)
tok_ds = dataprep.TokenDataset(tokens, context=8, samples=40, mode="sequential")
tok = dataprep.Loader(tok_ds, 4, shuffle=True, seed=3)
whole = dataprep.Loader(tok_ds, 4, shuffle=True, seed=3, rank=0, world_size=1)  # the whole epoch, for reference
mine = {"rank": rank, "images": [], "tokens": [], "whole": []}
for _ in range(2):
    mine["images"].append([decode_index(im.permute(1, 2, 0).numpy()) for x, _ in img for im in x])
    mine["tokens"].append([w.tolist() for x, _ in tok for w in x])
    mine["whole"].append([w.tolist() for x, _ in whole for w in x])
img.close()
everyone = [None] * dist.get_world_size()
dist.all_gather_object(everyone, mine)
if rank == 0:
    with open(out, "w") as f:
        json.dump(everyone, f)
dist.destroy_process_group()
