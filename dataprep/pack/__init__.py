"""The pack on disk: a manifest (written last, atomically) over shards of little-endian numpy arrays."""
