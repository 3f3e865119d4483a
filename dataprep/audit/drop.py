"""--drop-duplicates: takes a build's finished npy shards (before its manifest) and their split entries, gives
the same shards without the samples the audit's drop rule names (report.drop_indices: a val or test sample
with a near twin in train, and within a split every copy after the first of its group), the entries and
summaries counted again, and what was dropped for the manifest.

Build, then rewrite: the shards are built as usual (each sample's hash is computed from pixels the build
holds anyway), then the hashes of every shard (8 bytes a sample) are read back, the rule applied once over
the whole pack, and each shard that loses a sample is read and written again without it, one shard at a
time, with no decoding. Its cost is one read and one write of the shards that lose samples; memory is the
hashes plus one shard. A drop decided before the build would need a pass that decodes every image first.

--resume stays correct: a rewritten shard's record carries a fingerprint no task has, so a resumed build
rebuilds it (a whole shard again, from its sources) and the rule is applied anew over whole shards; a shard
that lost nothing is the task's own output and is reused as any other.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from ..pack.fields import offsets_in
from ..pack.shard import SHARD_RECORD, read_npy_into, write_shard
from .index import find_matches
from .leaks import drop_indices
from .report import DEFAULT_MAX_DISTANCE
from .samples import Samples

REWRITTEN = "dropped-duplicates:"  # a rewritten shard's fingerprint starts so: never a task's (hex digits)
PHASHES, SOURCES, SOURCE_OFFSETS = "phashes", "sources", "source_offsets"


def split_hashes(out: Path, entries: dict[str, dict]) -> Samples:
    """Every split's stored hashes, shard by shard, in the splits' order."""
    parts = {}
    for name, entry in entries.items():
        hs = [read_npy_into(out / name / s["name"] / f"{PHASHES}.npy", s["files"][f"{PHASHES}.npy"]) for s in entry["shards"]]
        parts[name] = {"hashes": np.concatenate(hs) if hs else np.zeros(0, np.uint64)}
    return Samples.from_splits(parts)


def drop_duplicates(out: str | Path, summaries: list, entries: dict[str, dict], fields: dict[str, Any],
                    max_distance: int = DEFAULT_MAX_DISTANCE) -> dict[str, Any]:
    """Rewrite the shards of `entries` (build_shards' split entries, updated in place, as are `summaries`)
    without the samples the drop rule names; `fields`: the manifest's field descriptions (which arrays are
    blobs and offsets). Gives the manifest's record: {"max_distance", "splits": {split: {"count", "sources"}}}."""
    out = Path(out)
    samples = split_hashes(out, entries)
    drops = drop_indices(samples, find_matches(samples.hashes, max_distance))
    offsets = offsets_in({"fields": fields})
    record: dict[str, Any] = {"max_distance": int(max_distance), "rule": "a sample with a near twin in an earlier split "
                              "(train first) leaves its split; within a split, of each group of near copies the first stays",
                              "splits": {}}
    by_name = {s.name: s for s in summaries}
    for name, entry in entries.items():
        gone = np.asarray(drops.get(name, []), np.int64)
        dropped_sources: list[str] = []
        start = 0
        for shard in entry["shards"]:
            n = int(shard["count"])
            local = gone[(gone >= start) & (gone < start + n)] - start
            start += n
            if len(local):
                dropped_sources += _rewrite(out / name, shard, local, offsets)
        entry["count"] = sum(int(s["count"]) for s in entry["shards"])
        entry["bytes"] = sum(f["bytes"] for s in entry["shards"] for f in s["files"].values())
        entry["duplicates_dropped"] = len(dropped_sources)
        record["splits"][name] = {"count": len(dropped_sources), "sources": dropped_sources}
        summ = by_name.get(name)
        if summ is not None:
            summ.written, summ.bytes = entry["count"], entry["bytes"]
            summ.notes.append(f"{len(dropped_sources)} duplicates dropped (--drop-duplicates, distance <= {max_distance}: "
                              "a near twin in an earlier split, or a later copy within this one)")
    return record


def _rewrite(split_dir: Path, shard: dict[str, Any], rows: np.ndarray, offsets: dict[str, str]) -> list[str]:
    """Shard `shard` of `split_dir` written again without `rows` (its record updated in place); the dropped
    samples' sources."""
    d = split_dir / shard["name"]
    n = int(shard["count"])
    keep = np.ones(n, bool)
    keep[rows] = False
    arrays = {f[:-4]: read_npy_into(d / f, rec) for f, rec in shard["files"].items() if f.endswith(".npy")}
    blobs = {blob: off for off, blob in offsets.items() if off in arrays and blob in arrays}
    dropped = [_text(arrays[SOURCES], arrays[SOURCE_OFFSETS], int(i)) for i in rows] if SOURCES in arrays else []
    new: dict[str, np.ndarray] = {}
    for name, a in arrays.items():
        if name in blobs.values():
            continue  # offsets: made beside their blob
        if name in blobs:
            off = arrays[blobs[name]].astype(np.int64)
            lengths = np.diff(off)[keep]
            pieces = [a[off[i]:off[i + 1]] for i in np.flatnonzero(keep)]
            new[name] = np.concatenate(pieces) if pieces else a[:0].copy()
            o = np.zeros(len(lengths) + 1, arrays[blobs[name]].dtype)
            np.cumsum(lengths, out=o[1:])
            new[blobs[name]] = o
        elif a.shape[:1] == (n,):
            new[name] = a[keep]
        else:
            raise ValueError(f"{d / name}.npy: {a.shape[0]} rows in a shard of {n} samples, and no offsets name it")
    with open(d / SHARD_RECORD, encoding="utf-8") as f:
        meta = {k: v for k, v in json.load(f).items() if k != "files"}
    meta.update(fingerprint=REWRITTEN + str(meta.get("fingerprint")), count=int(keep.sum()), duplicates_dropped=len(rows))
    files = write_shard(split_dir, shard["name"], new, meta)
    shard["files"], shard["count"] = files, int(keep.sum())
    return dropped


def _text(blob: np.ndarray, offsets: np.ndarray, i: int) -> str:
    return blob[offsets[i]:offsets[i + 1]].tobytes().decode("utf-8", "surrogateescape")
