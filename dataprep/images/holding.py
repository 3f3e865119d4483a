"""Holding an image pack's split: takes the pack, the split and how it is cached (a resolution or "all", a
partition's part, exclude=), gives the arrays InMemoryImageDataset serves from, one store a resolution (the
least recent let go past `keep_resolutions`), served rows by position, the recipe a spawned worker reloads
from. A mixin of InMemoryImageDataset (images/dataset.py), as batches.py's BatchFilling is.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import DataprepError, PackError
from ..serve.cache import open_split
from .codec import decode_variant
from .field import ImageField, fields_of


class SplitHolding:
    """What InMemoryImageDataset holds: its split's stores by resolution, a partition's part, the rows
    exclude= keeps, and the per-sample facts read by position. A mixin rather than a member object, as
    BatchFilling: the methods set and read the dataset's own attributes, which subclasses extend through
    `_fields` and by overriding them."""

    # -- loading -------------------------------------------------------------------------------
    def _load(self) -> None:
        try:
            self._read()
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:
            # The manifest parsed as JSON but its structure is not what the format says.
            raise PackError(f"{self.pack}/manifest.json: malformed ({type(e).__name__}: {e})") from None

    def _read(self) -> None:
        self._stores: dict[int | None, Any] = {}
        self._all = self.resolution == "all"
        if not self._all:
            self._switch(self.resolution)
            return
        from ..pack.backends import read_manifest

        sizes = sorted(read_manifest(self.pack).get("resolutions") or [None])
        self.keep_resolutions = max(self.keep_resolutions, len(sizes))
        for r in sizes:  # the largest last: it is served, the others are there for crops to pick from
            self._switch(r)

    def use(self, resolution: int | None) -> None:
        """Serve `resolution` of a multi-resolution pack from now on, loading it if needed.

        Beyond `keep_resolutions` loaded ones, the least recently used is let go (its memory freed or
        unmapped).

        Args:
            resolution: One of the pack's sizes; None is the largest.
        """
        if resolution != self.resolution or resolution not in self._stores:
            try:
                self._switch(resolution)
            except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:
                raise PackError(f"{self.pack}/manifest.json: malformed ({type(e).__name__}: {e})") from None

    def _switch(self, resolution: int | None) -> None:
        c = self._stores.pop(resolution, None) if resolution is not None else None
        if c is None:
            part = None if self.partition is None else (lambda counts: self.partition.shards(counts, self._part_epoch))
            c = open_split(self.pack, self.split, lambda m: self._fields(m, resolution), self.cache, self.verify,
                           self.progress, self.kinds, part=part)
        if resolution is None:  # the largest
            resolution = max(c.manifest.get("resolutions") or [c.manifest["settings"]["image"]["size"]])
            self._stores.pop(resolution, None)
        self._stores[resolution] = c  # most recently used last
        while len(self._stores) > self.keep_resolutions:
            self._stores.pop(next(iter(self._stores)))
        self.resolution = resolution
        self.field: ImageField = next(iter(c.fields.values()))
        self._arrays = c.arrays
        self._pixels = c.arrays["images"] if self.field.fixed else None
        self._blob = None if self.field.fixed else c.arrays["images"]
        self._offsets = c.arrays.get("offsets")
        self._shapes = c.arrays["shapes"]
        self._labels = c.arrays.get("labels")
        self._sources = c.fields["source"].strings(c.arrays)  # by held row; `sources`: by position
        self._global = None  # a partitioned cache: the split index of each held sample (what draws are keyed by)
        if self.partition is not None:
            counts = [int(s["count"]) for s in c.manifest["splits"][self.split]["shards"]]
            starts = np.concatenate([[0], np.cumsum(counts)])
            self._global = np.concatenate([np.arange(starts[k], starts[k + 1]) for k in c.shards]).astype(np.int64)
            self._length = self.partition.length(counts)
        self._kept = None  # exclude: the held rows served, in order (position i serves row _kept[i])
        self._by_position: dict[str, Any] = {}  # exclude= without a partition: labels, shapes, ... of the served rows
        self.excluded = np.zeros(0, np.int64)
        if self.exclude is not None:
            self._exclude(c)
        self._captions = c.fields["caption"].strings(c.arrays) if "caption" in c.fields else None
        self.classes: list[str] = list(c.manifest.get("classes") or [])
        self.labelled = bool(self.classes) and self._labels is not None  # unlabelled: `classes` empty, no labels stored
        tokens = c.fields.get("caption_tokens")
        self.caption_pad_id: int | None = tokens.pad_id if tokens is not None else None
        self._caption_ids = c.arrays[tokens.tokens] if tokens is not None else None
        self._caption_offsets = c.arrays[tokens.offsets] if tokens is not None else None
        if self.caption_length is not None and tokens is None:
            raise DataprepError(f"{self.pack}: caption_length={self.caption_length} serves tokenized captions, but the pack "
                                + ("has no captions" if self._captions is None else "holds its captions as text only")
                                + "; build it with --tokenize TOKENIZER (from captions), or leave caption_length out")
        self.class_names: list[str] | None = c.manifest.get("class_names")
        self.manifest = c.manifest
        self.resolutions: list[int] = sorted(c.manifest.get("resolutions") or [c.manifest["settings"]["image"]["size"]])

    def _exclude(self, c) -> None:
        """Serve the held rows without the excluded samples: through the mapping a partition uses (`_global`,
        the split index of each held row; `_held_row`, position -> row), the rows restricted to those kept.
        The leak mask is the whole pack's audit, made once (here, or in the process that pickled this
        dataset: it travels in the state) from the pack as it was asked for (a URL: every split's hashes
        fetched)."""
        if self._leaks is None:
            from ..audit.pack import leak_mask

            try:  # the image fields and hashes of any image kind
                self._leaks = leak_mask(self._origin, self.split, fields_of)
            except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:  # not the manifest _load blames
                raise PackError(f"{self._origin}: exclude='leaks' cannot audit the pack ({type(e).__name__}: {e})") from None
        total = int(c.manifest["splits"][self.split]["count"])
        if len(self._leaks) != total:
            raise PackError(f"{self.pack}: the leak mask covers {len(self._leaks)} samples of {self.split!r}, the pack holds "
                            f"{total}; the pack changed since the dataset was made")
        held = self._global if self._global is not None else np.arange(len(self._shapes), dtype=np.int64)
        self._kept = np.flatnonzero(~self._leaks[held]).astype(np.int64)
        self.excluded = np.flatnonzero(self._leaks).astype(np.int64)
        if self._global is None:
            self._global, self._length = held, len(self._kept)
            self._by_position = {"rows": self._kept}
        else:  # every node serves as many as the largest part keeps
            counts = [int(s["count"]) for s in c.manifest["splits"][self.split]["shards"]]
            starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
            kept = [int((~self._leaks[starts[k]:starts[k + 1]]).sum()) for k in range(len(counts))]
            self._length = max(sum(kept[k] for k in p) for p in self.partition.parts(counts))

    def _positional(self, name: str, rows_of):
        """A per-sample attribute read by position: as held, or (exclude= without a partition) restricted
        to the rows served, position i being sample i as served (made once, read-only)."""
        rows = self._by_position.get("rows")
        if rows is None:
            return rows_of
        if name not in self._by_position:
            if rows_of is None:
                out = None
            elif isinstance(rows_of, np.ndarray):
                out = rows_of[rows]
                out.flags.writeable = False
            else:
                out = _Rows(rows_of, rows)
            self._by_position[name] = out
        return self._by_position[name]

    @property
    def sources(self):
        """Every served sample's source path relative to the build's source root, by position (a `Strings`)."""
        return self._positional("sources", self._sources)

    @property
    def captions(self):
        """Every served sample's caption, by position (None for a pack without captions)."""
        return self._positional("captions", self._captions)

    def __getstate__(self) -> dict[str, Any]:
        # Spawned workers get the recipe, not the cache: a few hundred bytes through the pipe.
        keys = ("pack", "split", "decode", "transform", "as_numpy", "verify", "cache", "progress", "resolution", "keep_resolutions",
                "caption_length", "partition", "_part_epoch", "exclude", "_origin")
        state = {k: self.__dict__[k] for k in keys}
        if self._all:
            state["resolution"] = "all"
        # exclude=: the leak mask made here, a bit a sample, so that no worker audits the pack again
        state["_leaks"] = None if self._leaks is None else (np.packbits(self._leaks), len(self._leaks))
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        state = dict(state)
        packed = state.pop("_leaks", None)
        self.__dict__.update(state)
        self.variant = decode_variant(self.decode)
        self._leaks = None if packed is None else np.unpackbits(packed[0], count=packed[1]).astype(bool)
        self.decode_paths = {}
        self._asked = None
        self._load()

    def set_epoch(self, epoch: int) -> None:
        """With a partition that rotates, hold the part of `epoch`; the Loader's workers follow its requests.

        Args:
            epoch: The epoch.
        """
        self._hold_part(int(epoch))

    def _hold_part(self, epoch: int) -> None:
        p = self.partition
        if p is not None and p.rotate_every and p.part_of(epoch) != p.part_of(self._part_epoch):
            self._part_epoch = epoch
            self._stores = {}
            self._read()
        elif p is not None:
            self._part_epoch = epoch

    @property
    def labels(self) -> np.ndarray | None:
        """Every served sample's label by position, read-only, in the pack's (smallest) dtype (None for an
        unlabelled pack)."""
        return self._positional("labels", self._labels)

    @property
    def shapes(self) -> np.ndarray:
        """(N, 3) array of every served sample's (H, W, C) once decoded, by position."""
        return self._positional("shapes", self._shapes)

    @property
    def _cached(self):
        """The split as currently served (its store also keeps a shared-memory segment attached)."""
        return self._stores[self.resolution]

    @property
    def nbytes(self) -> int:
        """Bytes of this split's arrays (in RAM, shared memory or mapped files, by cache mode)."""
        return self._cached.nbytes

    @property
    def segment(self) -> str | None:
        """The shared-memory segment's path with cache="shm"."""
        return str(self._cached.segment.path) if self._cached.segment else None


class _Rows:
    """A read-only sequence over some items of another (`Strings`), in the order `rows` gives."""

    def __init__(self, items, rows: np.ndarray):
        self._items, self._rows = items, rows

    def __len__(self) -> int:
        return len(self._rows)

    def __getitem__(self, i):
        n = len(self._rows)
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(n))]
        if not -n <= i < n:
            raise IndexError(f"index {i} out of range for {n} items")
        return self._items[int(self._rows[i % n])]

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    def __eq__(self, other) -> bool:
        if isinstance(other, (list, tuple, _Rows)) or hasattr(other, "_offsets"):
            return len(self) == len(other) and all(x == y for x, y in zip(self, other))
        return NotImplemented

    __hash__ = None
