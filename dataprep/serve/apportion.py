"""A Mixture's apportionment: takes its members' weights, gives how many of the first c positions each
member holds (a balanced binary tree of roundings, each floor(c * q + 1/2): every count grows by at most one
a position and exactly one grows at each; serve/mixture.py says why).
"""
from __future__ import annotations

import numpy as np


def _tree(members: list[int], weights: np.ndarray):
    """A balanced binary tree over the members: (left, right, left's share of the node's weight)."""
    if len(members) == 1:
        return members[0]
    half = len(members) // 2
    left, right = members[:half], members[half:]
    wl = float(weights[left].sum())
    return (_tree(left, weights), _tree(right, weights), wl / (wl + float(weights[right].sum())))


def _shares(node, c: np.ndarray, out: list) -> None:
    """Each member's count of the first c positions into out[member]: the tree's roundings, one per node
    (a list of arrays, so a plan's counts are arrays under 128 KiB each)."""
    if isinstance(node, int):
        out[node] = c
        return
    left, right, share = node
    cl = np.floor(c * share + 0.5).astype(np.int64)
    _shares(left, cl, out)
    _shares(right, c - cl, out)
