"""Duplicates and leakage: takes per-sample pixels (or their stored hashes) and each sample's split, index
and source, gives the pairs of exact and near copies within and across splits, their groups, the leaks
(val or test samples with a near twin in train), what --drop-duplicates leaves out, and a contact sheet.

hashes.py (pixels -> 64-bit perceptual hash, flipped hash, pixel digest) -> index.py (hashes -> every
pair within a distance, multi-index hashing; folds.py what its edges fold into in bounded memory,
pairing.py the arithmetic that lists pairs in chunks) -> report.py (pairs -> JSON, in one pass of the
search; samples.py its input checked, leaks.py leak masks and drops, mirrors.py pairs through a mirror)
-> printout.py (JSON -> text) and sheet.py (pairs -> PNG). The pack side, still kind-free (the caller names a pack's fields): pack.py (a
pack's stored or recomputed hashes as Samples, a split's leak mask) and drop.py (--drop-duplicates: a
build's shards rewritten without the samples the drop rule names).
"""
from .folds import Pairs
from .hashes import HASH_NAME, flipped_hash, hash_and_flipped, perceptual_hash, perceptual_hashes, pixel_digest
from .index import Matches, brute_force_pairs, cross_pairs, find_matches, near_pairs
from .leaks import drop_indices, leak_mask, twin_splits
from .printout import text_report
from .report import DEFAULT_MAX_DISTANCE, audit
from .samples import Samples
from .sheet import contact_sheet, layout

__all__ = ["HASH_NAME", "DEFAULT_MAX_DISTANCE", "Matches", "Pairs", "Samples", "audit", "brute_force_pairs", "contact_sheet",
           "cross_pairs", "drop_indices", "find_matches", "flipped_hash", "hash_and_flipped", "layout", "leak_mask", "near_pairs",
           "perceptual_hash", "perceptual_hashes", "pixel_digest", "text_report", "twin_splits"]
