"""The audit of a pack: takes a pack of an image kind (any backend, local or at a URL), gives its samples'
hashes, digests and sources (`Samples`) for report.audit, a sample's pixels for the contact sheet, and the
leak mask of one split (what `exclude="leaks"` serves without).

The stored fields (`phash`, `digest`: images/field.py) are read a shard at a time; a pack built before
them, or hashed by another hash than this dataprep's (the manifest's "audit" entry names it), is hashed
on the fly: every image decoded once at the smallest stored size, each digest taken of the sample as
stored at the largest. --flips always decodes (packs store no mirrored hash). A stored JPEG is decoded
only once its frame header agrees with its recorded shape, its bytes and the pack's caps (the image
field's `pixels`, as serving checks it): a forged pack cannot make the audit decode gigabytes. The caller
gives the pack's fields (`fields_of(manifest, where)`: the CLI asks kinds.py, an image dataset its own
kind), so this stays kind-free; any pack whose fields hold an image field of role "image" can be audited.
Shards are read one at a time with their checksums checked: memory is one shard's arrays.
"""
from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from ..errors import DataprepError, PackError
from .hashes import HASH_NAME, hash_and_flipped, perceptual_hash, pixel_digest
from .samples import Samples


@contextlib.contextmanager
def opened(pack: str | os.PathLike, arrays: Callable[[dict], set[str]] | None = None, progress=None) -> Iterator[tuple[Path, str]]:
    """(a local pack path, the name to show) for a pack argument: a local pack as it is; a URL as a
    temporary local copy of the shard files holding `arrays(manifest)` [all], removed afterwards."""
    from ..remote.urls import is_url

    if not is_url(pack):
        yield Path(pack), str(pack)
        return
    from ..remote.packs import RemotePack, local_copy

    want = None if arrays is None else arrays(RemotePack(str(pack)).manifest)
    which = None if want is None else (lambda rel: rel.rsplit("/", 1)[-1][:-4] in want)
    with local_copy(str(pack), which=which, progress=progress) as (rp, d, _):
        yield d, rp.shown


class PackSamples:
    """A pack opened for its audit: its manifest, reader and fields, the image fields it can be hashed from."""

    def __init__(self, pack: str | os.PathLike, fields_of: Callable[[dict, str], dict[str, Any]], shown: str | None = None):
        from ..pack.backends import open_reader

        self.pack, self.shown = Path(pack), shown or str(pack)
        self.reader = open_reader(self.pack)
        try:
            self.manifest = m = self.reader.manifest
            self.fields = fields_of(m, self.shown)
            images = {k: f for k, f in self.fields.items() if getattr(f, "role", None) == "image" and k.split("@")[0] == "image"}
            if not images:
                raise DataprepError(f"{self.shown}: a {m.get('kind')!r} pack holds no images to audit")
            sizes = {k: (int(k.split("@")[1]) if "@" in k else 0) for k in images}
            self.smallest = images[min(sizes, key=sizes.get)]  # the hash's size (images/process.py)
            self.largest = images[max(sizes, key=sizes.get)]  # the digest's
            self.stored = "phash" in self.fields and "digest" in self.fields and (m.get("audit") or {}).get("hash") == HASH_NAME
        except BaseException:
            self.reader.close()
            raise

    def close(self) -> None:
        self.reader.close()

    def __enter__(self) -> "PackSamples":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def splits(self) -> list[str]:
        return list(self.manifest["splits"])

    def count(self, splits=None) -> int:
        return sum(int(self.manifest["splits"][s]["count"]) for s in (splits or self.splits))

    def _shard(self, split: str, shard: dict, fields: list) -> dict[str, Any]:
        from ..pack.arrays import LoadContext

        # verify=True: read shard by shard with checksums (HDF5 and Zarr read a split's arrays whole otherwise)
        arrays: dict[str, Any] = {}
        for f in fields:
            arrays.update(f.load(self.pack / split, [shard], LoadContext(verify=True, reader=self.reader)))
        return arrays

    def split_samples(self, split: str, flips: bool = False, progress: Callable[[int], None] | None = None) -> dict[str, Any]:
        """One split's {"hashes", "digests", "sources"[, "flipped"]}, read or computed a shard at a time."""
        decode = flips or not self.stored
        source = self.fields["source"]
        want = [source] + ([self.fields["phash"], self.fields["digest"]] if self.stored else [])
        hs, ds, fl, src = [], [], [], []
        for shard in self.manifest["splits"][split]["shards"]:
            a = self._shard(split, shard, want)
            n = source.count(a)
            if decode:  # each resolution's arrays under the same generic keys: loaded apart
                small = self._shard(split, shard, [self.smallest])
                large = small if self.largest is self.smallest or self.stored else self._shard(split, shard, [self.largest])
            src += list(source.strings(a))
            if self.stored:
                hs.append(np.asarray(a["phashes"], np.uint64))
                ds.append(np.asarray(a["digests"], np.uint8))
            if decode:
                h = np.zeros(n, np.uint64)
                f = np.zeros(n, np.uint64)
                d = np.zeros((n, 16), np.uint8)
                base = len(src) - n  # the shard's first sample in the split
                for i in range(n):
                    px = self.pixels(self.smallest, small, i, f"{self.shown}/{split}: sample {base + i} ({src[base + i]})")
                    h[i], f[i] = hash_and_flipped(px) if flips else (perceptual_hash(px), 0)
                    if not self.stored:
                        d[i] = np.frombuffer(pixel_digest(self.largest.sample(large, i)), np.uint8)
                    if progress:
                        progress(1)
                if not self.stored:
                    hs.append(h)
                    ds.append(d)
                fl.append(f)
            elif progress:
                progress(n)
        cat = (lambda xs, dt, *shape: np.concatenate(xs) if xs else np.zeros((0, *shape), dt))
        out = {"hashes": cat(hs, np.uint64), "digests": cat(ds, np.uint8, 16), "sources": src}
        if flips:
            out["flipped"] = cat(fl, np.uint64)
        return out

    def samples(self, flips: bool = False, progress: Callable[[int], None] | None = None, splits=None) -> Samples:
        return Samples.from_splits({s: self.split_samples(s, flips, progress) for s in (splits or self.splits)})

    def pixels(self, field, arrays: dict[str, Any], i: int, what: str) -> np.ndarray:
        """Sample i of an image field's loaded arrays (one shard's) as pixels (HWC): `field.pixels` decodes a JPEG
        once its header agrees with the recorded shape, its bytes and the pack's caps (a PackError naming `what`
        otherwise), so a forged pack cannot make the audit decode more than its build made."""
        return field.pixels(field.sample(arrays, i), arrays[field.keys[2]][i], self.manifest, what)

    def image(self, split: str, index: int) -> np.ndarray:
        """Sample `index` of `split` as served at the largest size, decoded (a contact sheet's picture)."""
        return self.decode(self.stored_images([(split, index)])[split, index], f"{split} sample {index}")

    def stored_images(self, wanted) -> dict[tuple[str, int], tuple[np.ndarray, tuple[int, ...]]]:
        """The stored samples of every (split, index) in `wanted`, each with its recorded shape (copies: JPEG
        bytes or pixels, at the largest size), each shard holding one read once (its checksums checked once)."""
        by_shard: dict[tuple[str, int], list[int]] = {}
        bounds = {}
        for split, index in set((str(a), int(b)) for a, b in wanted):
            if split not in bounds:
                if split not in self.manifest["splits"]:
                    raise PackError(f"{self.shown}: no split {split!r}")
                counts = [int(sh["count"]) for sh in self.manifest["splits"][split]["shards"]]
                bounds[split] = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
            b = bounds[split]
            if not 0 <= index < b[-1]:
                raise IndexError(f"{self.shown}/{split}: no sample {index}")
            by_shard.setdefault((split, int(np.searchsorted(b, index, side="right")) - 1), []).append(index)
        out = {}
        for (split, k), indices in sorted(by_shard.items()):
            arrays = self._shard(split, self.manifest["splits"][split]["shards"][k], [self.largest])
            shapes = arrays[self.largest.keys[2]]
            for index in indices:
                at = index - int(bounds[split][k])
                out[split, index] = np.array(self.largest.sample(arrays, at)), tuple(int(v) for v in shapes[at])
        return out

    def decode(self, stored: tuple[np.ndarray, tuple[int, ...]], what: str) -> np.ndarray:
        """A stored sample of the largest size and its shape (`stored_images`) as pixels (HWC), checked as
        `pixels` checks one."""
        return self.largest.pixels(*stored, self.manifest, f"{self.shown}: {what}")


def hash_note(ps: PackSamples, flips: bool) -> str | None:
    """What an audit says on stderr before it decodes: why, and how much."""
    if not ps.stored:
        had = (ps.manifest.get("audit") or {}).get("hash")
        why = f"its hashes are {had!r}, not {HASH_NAME!r}" if had and had != HASH_NAME else "it was built without the audit's hashes"
        return (f"note: {ps.shown}: {why}; hashing its {ps.count():,} images on the fly (each decoded once; "
                "a rebuild stores the hashes)")
    if flips:
        return f"note: {ps.shown}: --flips decodes each of its {ps.count():,} images once (packs store no mirrored hash)"
    return None


def audit_arrays(manifest: dict, decode: bool = False) -> set[str] | None:
    """The arrays of a pack at a URL an audit fetches: the stored hashes, digests and sources when they serve
    (and nothing asks for pixels: `decode`, for --flips or a sheet), else None (every file)."""
    stored = "phash" in (manifest.get("fields") or {}) and (manifest.get("audit") or {}).get("hash") == HASH_NAME
    return {"phashes", "digests", "sources", "source_offsets"} if stored and not decode else None


def leak_mask(pack: str | os.PathLike, split: str, fields_of: Callable[[dict, str], dict[str, Any]], max_distance: int | None = None,
              say: Callable[[str], None] | None = None) -> np.ndarray:
    """For every sample of `split` (in its order): whether it has a near twin (within `max_distance`
    [report.DEFAULT_MAX_DISTANCE]) in another split of the pack. `pack`: local, or a URL (every split's
    hashes fetched into a temporary copy). `say`: told the note when the pack is hashed on the fly (stderr
    by default)."""
    from .index import find_matches
    from .leaks import leak_mask as mask_of
    from .report import DEFAULT_MAX_DISTANCE

    D = DEFAULT_MAX_DISTANCE if max_distance is None else max_distance
    with opened(pack, audit_arrays) as (local, shown), PackSamples(local, fields_of, shown) as ps:
        if split not in ps.splits:
            raise PackError(f"{shown}: no split {split!r}; the pack has {sorted(ps.splits)}")
        note = hash_note(ps, False)
        if note:
            (say or (lambda line: print(line, file=sys.stderr, flush=True)))(note)
        s = ps.samples()
    return mask_of(s, find_matches(s.hashes, D), split)
