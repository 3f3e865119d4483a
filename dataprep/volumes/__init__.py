"""Volume packs: 3-D arrays read from .npy files or multi-page TIFF stacks (read), brought to a stored dtype
and optionally a target shape (resample), built in shards (build)."""
