"""A WebDataset sample's label and caption: takes its metadata members (`.cls`, `.txt`, `.json`) and the
fields the user names, gives its label (an integer, or a class name from a JSON field) and caption, each
checked (`_label_caption`: a bad one a ValueError the listing skips the sample with); where a named field
and `.cls` disagree, how often, under the split's summary (`_note_disagreements`); and what the first
`.json` holds, for an error about a field none has (`_json_keys`). sources/webdataset.py labels its
samples through these.
"""
from __future__ import annotations

import json
from typing import Any

from .listing import Source


def _value(doc: Any, field: str) -> Any:
    """A JSON document's value at a dotted path (`meta.label`), or None."""
    for part in field.split("."):
        if not isinstance(doc, dict) or part not in doc:
            return None
        doc = doc[part]
    return doc


def _note_disagreements(source: Source, label_field: str, cls_of: dict[str, int]) -> None:
    """Where a sample has both a `.cls` and the named `label_field`, and the class `.cls` names is not the
    one the field gave: say how many, and an example, under the split's summary (and in the manifest)."""
    split = source.splits[0]
    both = wrong = 0
    first = None
    for ref, label in zip(split.paths, split.labels.tolist()):
        if ref in cls_of:
            both += 1
            if cls_of[ref] != label:
                wrong += 1
                first = first or (ref, label, cls_of[ref])
    source.details["label_disagreements"] = wrong
    if wrong:
        ref, label, cls = first
        name = f"{source.classes[label]!r} (class {label})" if source.classes and source.classes[label] != str(label) else str(label)
        split.notes.append(f"--label-field {label_field} and .cls disagree on {wrong:,} of {both:,} samples that have both "
                           f"(the first: {ref}: {label_field} {name}, .cls {cls}); labels follow --label-field")


def _json_keys(first: tuple[str, bytes] | None) -> str:
    """What the first sample's .json holds, for an error about a field none has."""
    if first is None:
        return "no sample has a .json member"
    try:
        doc = json.loads(first[1].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        return f"the first .json ({first[0]}) does not parse"
    if not isinstance(doc, dict):
        return f"the first .json ({first[0]}) is a {type(doc).__name__}, not an object"
    return f"the first .json ({first[0]}) has keys: " + (", ".join(map(str, doc)) or "none")


def _label_caption(meta: dict[str, bytes], label_field: str | None, caption_field: str | None):
    label = caption = None
    doc = None
    if "json" in meta and (label_field or caption_field):
        try:
            doc = json.loads(meta["json"].decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ValueError(f".json does not parse ({e})") from None
    cls = None
    if "cls" in meta:
        text = meta["cls"].decode("utf-8", "replace").strip()
        try:
            cls = int(text)
        except ValueError:
            if not label_field:  # with a named field, .cls is only compared, never used
                raise ValueError(f".cls holds {text[:40]!r}, not an integer") from None
    if label_field:
        if doc is not None:
            label = _value(doc, label_field)
            if label is not None and not isinstance(label, (int, str)) or isinstance(label, bool):
                raise ValueError(f"{label_field} is {label!r}, not an integer or a class name")
    else:
        label = cls
    if caption_field and doc is not None:
        caption = _value(doc, caption_field)
        if caption is not None and not isinstance(caption, str):
            raise ValueError(f"{caption_field} is {type(caption).__name__}, not text")
    elif "txt" in meta:
        try:
            caption = meta["txt"].decode("utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(f".txt is not UTF-8 ({e})") from None
    return label, caption, cls
