"""The report for people: takes what report.audit gives, gives its text (leaks first, then pair counts,
groups, drops and the pairs shown), every file and split name escaped so a terminal shows it (`printable`).
"""
from __future__ import annotations

import unicodedata
from typing import Any, Mapping


def text_report(report: Mapping[str, Any], show: int | None = None) -> str:
    """The report for people: leaks first, then pair counts, groups, drops, and the pairs shown (the
    report's "shown": every leaking sample's closest twin first, then one pair a group in turn).

    Args:
        report: what `audit` gives.
        show: at most this many of the shown pairs (None: every one).

    Returns:
        The text, lines joined by newlines.
    """
    s = report["summary"]
    out = []
    for name, lk in s["leaks"].items():
        pct = 100.0 * lk["fraction"]
        out.append(f"LEAK: {lk['samples']} of {lk['of']} {printable(name)} samples ({pct:.2f} %) have a near twin in "
                   f"{printable(lk['with_twin_in'])} "
                   f"(distance <= {s['max_distance']}{', mirrors too' if s['flips'] else ''})")
    if not s["leaks"]:
        out.append("one split: no leaks to look for")
    across = ", ".join(f"{printable(k)} {v}" for k, v in s["pairs_across"].items()) or "none"
    within = ", ".join(f"{printable(k)} {v}" for k, v in s["pairs_within"].items()) or "none"
    out.append(f"pairs across splits: {across}")
    out.append(f"pairs within splits: {within}")
    if s["flips"]:
        out.append(f"pairs only as mirror images: {s['mirror_pairs']}")
    if s["exact_pairs_listed"] is not None:
        out.append(f"exact copies (identical pixels) among the listed pairs: {s['exact_pairs_listed']}")
    out.append(f"groups of near copies: {s['groups']} ({s['samples_in_groups']} samples; the largest has {s['largest_group']})")
    drops = ", ".join(f"{printable(k)} {v}" for k, v in s["drop_duplicates"].items()) or "nothing"
    out.append(f"--drop-duplicates would leave out: {drops}")
    if not s["complete"]:
        out.append(f"note: {s['pairs']} pairs, {s['pairs_listed']} listed (the cap); the counts above are exact")
    shown = report["shown"] if show is None else report["shown"][:show]
    if shown:
        out.append("pairs shown (each leaking sample's closest twin first, then one pair a group in turn):")
    for p in shown:
        tag = "exact" if p["exact"] else ("mirror" if p.get("flip") else f"d={p['distance']}")
        out.append(f"  {tag:>6}  {_where(p['a'])}  ~  {_where(p['b'])}")
    if len(shown) < len(report["shown"]):
        out.append(f"  ... {len(report['shown']) - len(shown)} more of the pairs shown on the sheet")
    left = s["shown"]
    off = [(left["leaking_samples"]["left_off"], "leaking samples"), (left["leak_pairs"]["left_off"], "pairs across splits"),
           (left["pairs_within"]["left_off"], "pairs within splits")]
    if any(k for k, _ in off):
        out.append("  not shown: " + ", ".join(f"{k} {what}" for k, what in off if k)
                   + " (more with --panels N; --json lists the pairs)")
    return "\n".join(out)


def _where(x: Mapping[str, Any], width: int = 60) -> str:
    src = x["source"] if len(x["source"]) <= width else "..." + x["source"][-(width - 3):]
    return f"{printable(x['split'])}:{x['index']} {printable(src)}".rstrip()


# a terminal acts on these instead of showing them: bidi marks, embeddings, overrides and isolates
_BIDI = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")
_SHORT = {"\n": "\\n", "\r": "\\r", "\t": "\\t", "\\": "\\\\"}


def printable(text: str) -> str:
    """`text` safe to print to a terminal: C0 and C1 controls, DEL, line and paragraph separators, bidi
    controls and lone surrogates (a file name that is not UTF-8) written as escapes (`\\n`, `\\x1b`,
    `\\u202e`), and a backslash doubled so that no name can forge an escape. A file name with a newline
    or a terminal escape sequence would otherwise add lines to the report or drive the terminal.

    Args:
        text: a file name, a split's name.

    Returns:
        The text, escaped where it must be; unchanged when nothing in it needs escaping.
    """
    if text.isprintable() and "\\" not in text:
        return text
    return "".join(_escape(c) for c in text)


def _escape(c: str) -> str:
    if c in _SHORT:
        return _SHORT[c]
    if c not in _BIDI and unicodedata.category(c) not in ("Cc", "Cs", "Zl", "Zp"):
        return c
    k = ord(c)
    return f"\\x{k:02x}" if k < 0x100 else f"\\u{k:04x}" if k < 0x10000 else f"\\U{k:08x}"
