"""Segmentation packs: image/mask pairs (pairs), masks decoded, remapped and resized nearest (masks), built in shards (build)."""
