"""Build settings, the same for every pack kind: how a build is cut into shards, how much of the source it
takes, and how strict it is. Each kind keeps its own settings beside it (images/settings.py, ...)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from .errors import DataprepError, brief, option
from .limits import IMAGE_MAX_BYTES, MAX_BYTES, VOLUME_MAX_BYTES, over_cap  # noqa: F401 (the caps' defaults, for the kinds: layering)


@dataclass(frozen=True)
class BuildSettings:
    """How a build is laid out in shards and how strict it is; `workers` alone does not change the output."""

    workers: int = 1
    limit: int | None = None
    shard_size: int | None = None
    strict: bool = False
    overwrite: bool = False
    resume: bool = False
    max_bytes: int | None = None  # the cap on one sample's source bytes (limits.py); None: the kind's default


    def __post_init__(self) -> None:
        if self.workers < 1:
            raise DataprepError(f"workers must be at least 1, got {self.workers}")
        if self.limit is not None and self.limit < 1:
            raise DataprepError(f"limit must be at least 1, got {self.limit}")
        if self.overwrite and self.resume:
            raise DataprepError(f"{option('overwrite')} and {option('resume')} contradict each other: choose one")
        if self.shard_size is not None and self.shard_size < 1:
            raise DataprepError(f"shard_size must be at least 1, got {self.shard_size}")
        if self.max_bytes is not None and (isinstance(self.max_bytes, bool) or not isinstance(self.max_bytes, int)
                                           or not 1 <= self.max_bytes <= MAX_BYTES):
            raise DataprepError(f"max_bytes must be a byte count from 1 to {MAX_BYTES:,} (1024TiB), got {brief(self.max_bytes)} "
                                "(limits.parse_bytes reads '256MiB')")

    def shard_size_for(self, count: int) -> int:
        """Samples per shard: the user's choice, else a size that depends on the split's length only.

        Depending on nothing else (not on `workers`) keeps shard boundaries, and so the bytes of the
        pack, the same however many processes build it.
        """
        if self.shard_size is not None:
            return self.shard_size
        return max(16, min(1024, -(-count // 64)))

    def to_dict(self) -> dict[str, Any]:
        """What the manifest records: what changes the pack's bytes (not workers, overwrite or resume);
        `max_bytes` among them (None: the kind's default, limits.IMAGE_MAX_BYTES or VOLUME_MAX_BYTES)."""
        return {k: v for k, v in dataclasses.asdict(self).items() if k not in ("workers", "overwrite", "resume")}
