"""Numbers as a command line or a --config file gives them (text; YAML's ints and floats), checked against the
ranges the front door checks (options.py): a float where an integer belongs, inf, nan, 1e400 or a 400-digit
number is a usage error naming the option and its range (exit 2), never a raw OverflowError."""
from __future__ import annotations

import math
from typing import Any

import click

from ..errors import brief
from ..options import bounds, out_of_range


class Ranged(click.ParamType):
    """An integer from `lo` to `hi`: the range of a front-door option by its name (`Ranged("workers")`), or
    one given (`Ranged(lo=1, hi=4096)`)."""

    name = "integer"

    def __init__(self, key: str | None = None, lo: int | None = None, hi: int | None = None):
        self.lo, self.hi = bounds(key) if key else (lo, hi)
        assert self.lo is not None and self.hi is not None, "Ranged: a key, or lo and hi"

    def convert(self, value: Any, param, ctx) -> int:
        if isinstance(value, str):
            try:
                value = int(value.strip())
            except ValueError:  # '1e400', 'inf', '1.5', or past Python's digit limit: said as given
                pass
        why = out_of_range(value, self.lo, self.hi)
        if why:
            self.fail(why, param, ctx)
        return int(value)

    def __repr__(self) -> str:
        return f"Ranged({self.lo}, {self.hi})"


class Finite(click.ParamType):
    """A finite float from `lo` to `hi`, or below `hi` with `below=True` (nan refused: click's FloatRange takes it)."""

    name = "float"

    def __init__(self, lo: float, hi: float, below: bool = False):
        self.lo, self.hi, self.below = lo, hi, below

    def convert(self, value: Any, param, ctx) -> float:
        try:
            v = float(value.strip() if isinstance(value, str) else value)
        except (TypeError, ValueError, OverflowError):  # OverflowError: an int past a float's range
            v = math.nan
        if not (math.isfinite(v) and self.lo <= v and (v < self.hi if self.below else v <= self.hi)):
            top = f"up to (not including) {self.hi:g}" if self.below else f"to {self.hi:g}"
            span = f" from {self.lo:g} {top}" if math.isfinite(self.lo) or math.isfinite(self.hi) else ""
            self.fail(f"{brief(value)}: must be a finite number{span}", param, ctx)
        return v
