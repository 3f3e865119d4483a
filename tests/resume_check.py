"""The loaders of tests/test_resume.py, made the same way in the test and in a fresh process.

Run as `python -m tests.resume_check KIND PACK WORKERS STATE_JSON EPOCHS`: restores the state into a new
Loader and prints the digest of every batch it then serves over EPOCHS iterations, as JSON.
"""
from __future__ import annotations

import hashlib
import json
import sys


def make(kind: str, pack: str, workers: int):
    import dataprep
    from dataprep.serve.loader import Loader

    if kind == "images":
        ds = dataprep.InMemoryImageDataset(pack)
        return Loader(ds, 5, shuffle=True, seed=11, num_workers=workers, crop=dataprep.RandomResizedCrop(24), flip=True)
    if kind == "tokens":
        ds = dataprep.TokenDataset(pack, context=8, samples=60, seed=4)
        return Loader(ds, 7, shuffle=True, seed=11, num_workers=workers)
    if kind == "tables":
        ds = dataprep.TabularDataset(pack)
        return Loader(ds, 6, shuffle=True, seed=11, num_workers=workers)
    raise ValueError(kind)


def digests(batches) -> list[str]:
    out = []
    for batch in batches:
        h = hashlib.sha1()
        for t in batch:
            h.update(str(tuple(t.shape)).encode())
            h.update(t.contiguous().numpy().tobytes())
        out.append(h.hexdigest()[:16])
    return out


def main() -> None:
    kind, pack, workers, state, epochs = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], int(sys.argv[5])
    loader = make(kind, pack, workers)
    loader.load_state_dict(json.loads(state))
    got = [digests(loader) for _ in range(epochs)]
    loader.close()
    print(json.dumps(got))


if __name__ == "__main__":
    main()
