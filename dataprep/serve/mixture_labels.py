"""A Mixture's label space: takes its members and how their labels mix (`labels=`), gives the mixture's class
names, the batch key its labels are served under and each member's lookup table into them; and how an error
names a member.
"""
from __future__ import annotations

import numpy as np

from ..errors import DataprepError, UsageError
from . import contract


class ClassListsDiffer(DataprepError, ValueError):
    """A Mixture's members name their labels differently, and the Mixture was not told how to mix them."""


def _name(d, m: int) -> str:
    """A member as an error names it: its pack (and split), else its kind."""
    pack = getattr(d, "pack", None)
    if pack is None:
        return type(d).__name__
    split = getattr(d, "split", None)
    return f"{pack}" + (f", {split}" if split else "")


def _labels_of(d) -> tuple[str | None, list | None]:
    """(the batch key a member serves its class labels under, or None where it serves none; their names,
    or None where it has none)."""
    if hasattr(d, "label_key"):  # a Mixture among the members: the key and names it serves
        return d.label_key, d.classes
    kinds = getattr(d, "kinds", None) or ()
    if "segmentation" in kinds:  # class labels are mask values
        return "masks", list(d.classes) if getattr(d, "classes", None) else None
    if "detection" in kinds:  # one label a box, under "labels" (padding -1), named by the pack's classes
        return "labels", list(contract.attribute(d, "classes") or []) or None
    target = getattr(d, "target_info", None)
    if isinstance(target, dict):  # a table pack: a classification target
        return ("target", list(target.get("classes") or []) or None) if target.get("task") == "classification" else (None, None)
    classes = list(contract.attribute(d, "classes") or []) or None
    if hasattr(d, "labelled"):  # image and volume packs: unlabelled ones serve no labels
        return ("labels", classes) if d.labelled else (None, None)
    return ("labels", classes) if classes else (None, None)


def _label_space(datasets: list, how: str | None) -> tuple[list | None, str | None, list | None]:
    """The mixture's (classes, label key, per-member int64 lookup tables from a member's labels to the
    mixture's, None each where a member's are the mixture's, or None for all) under labels=`how`."""
    if how not in (None, "by_name", "offset", "as_is"):
        raise UsageError(f"Mixture: labels is 'by_name', 'offset' or 'as_is' (or left out), not {how!r}")
    specs = [_labels_of(d) for d in datasets]
    keys = {k for k, _ in specs if k is not None}
    if not keys:  # nothing labelled: nothing to name
        return None, None, None
    key = keys.pop() if len(keys) == 1 else None
    lists = [c for _, c in specs]
    same = key is not None and all(k is not None for k, _ in specs) and all(c == lists[0] for c in lists[1:])
    if same and how != "offset":  # one list (or labels without names everywhere: no list says they differ)
        return (None if lists[0] is None else list(lists[0])), key, None
    if how is None:
        def line(m, d, k, c):
            if k is None:
                return f"  member {m} ({_name(d, m)}): no labels"
            if c is None:
                return f"  member {m} ({_name(d, m)}): labels without class names"
            return f"  member {m} ({_name(d, m)}): {len(c)} classes: " + ", ".join(map(str, c[:5])) + (", ..." if len(c) > 5 else "")

        raise ClassListsDiffer(
            "a Mixture's members have different class lists, so one label number would mean different classes; "
            "say how to mix them:\n" + "\n".join(line(m, d, k, c) for m, (d, (k, c)) in enumerate(zip(datasets, specs)))
            + "\nMixture(..., labels=\"by_name\") (one list of every name; each member's labels renumbered to it), "
              "labels=\"offset\" (member k's labels shifted past the classes of the members before it; the lists "
              "concatenated) or labels=\"as_is\" (the numbers as stored; Mixture.classes is None)")
    if how == "as_is":
        return (list(lists[0]) if same and lists[0] is not None else None), key, None
    missing = [m for m, (k, c) in enumerate(specs) if k is None or c is None]
    if missing:
        raise DataprepError(f"labels={how!r} renumbers each member's labels by its class names; member(s) "
                            + ", ".join(f"{m} ({_name(datasets[m], m)})" for m in missing)
                            + " have no labels or no names for them (mix them with labels='as_is', or serve them alone)")
    if key == "masks":
        raise DataprepError(f"labels={how!r}: segmentation masks are served as stored, never renumbered; "
                            "remap the masks' values when building, or use labels='as_is'")
    if how == "offset":
        starts = np.cumsum([0] + [len(c) for c in lists[:-1]])
        return [n for c in lists for n in c], key, [np.arange(len(c), dtype=np.int64) + int(s) for c, s in zip(lists, starts)]
    union: dict = {}
    for c in lists:
        for n in c:
            union.setdefault(n, len(union))
    luts = [np.array([union[n] for n in c], np.int64) for c in lists]
    luts = [None if np.array_equal(t, np.arange(len(t))) else t for t in luts]
    return list(union), key, (luts if any(t is not None for t in luts) else None)
