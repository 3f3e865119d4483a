"""What one batch request carries from the Loader to the process that fills it.

Everything a sample's served value depends on (the epoch, the seed of its random draws, the resolution
of a multi-resolution pack, the crop, the flip) travels with each request. Workers forked at the first
epoch never read it from the dataset object they inherited, so changing any of it between epochs (a
new epoch, `ds.use(256)`, a schedule's next size) reaches every worker.

What a dataset gives the Loader in return (`__len__`, `batch_layout(request)`, `fill_batch(idx, out,
request)` and the optional hooks) is the serving contract, serve/contract.py.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any


@dataclass(frozen=True)
class Request:
    """epoch, seed: the key of every per-sample random draw (window starts, crops, flips), with the
    sample's index. resolution: which size of a multi-resolution pack (None: the dataset's own).
    crop: None, (H, W) for a center crop padded where smaller, or a crop plan (images/crops.py).
    flip: a random horizontal flip, p = 0.5, per sample."""

    epoch: int = 0
    seed: int = 0
    resolution: int | None = None
    crop: Any = None
    flip: bool = False

    def but(self, **changes) -> "Request":
        return replace(self, **changes)


def refuse_augmentation(request: Request, what: str) -> None:
    """For datasets that are not images: a crop or flip is a usage error, not silently ignored."""
    if request.crop is not None or request.flip:
        from ..errors import DataprepError

        raise DataprepError(f"crop and flip apply to image datasets; {what} serves no images (pass crop=None, flip=False)")


def split(idx, workers: int, runs: bool) -> list[tuple[int, int, int, Any]]:
    """A batch's parts, one per worker that gets rows (both backends split a batch so: the first batch comes
    quickly and an epoch's last keeps every worker busy): (worker, first row, end row, the part's sample
    indices, `as_run` where the order is the identity's)."""
    n = len(idx)
    bounds = [w * n // workers for w in range(workers + 1)]  # as even as whole rows allow, first parts smaller
    return [(w, a, b, as_run(idx[a:b]) if runs else idx[a:b])
            for w, (a, b) in enumerate(zip(bounds[:-1], bounds[1:])) if b > a]


def as_run(idx):
    """A batch of the identity order as range(lo, hi) where it is one (see Loader._runs), else as it is."""
    lo, n = int(idx[0]), len(idx)
    return range(lo, lo + n) if int(idx[-1]) - lo == n - 1 else idx
