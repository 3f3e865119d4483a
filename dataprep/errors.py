"""One error hierarchy for dataprep; the CLI maps every DataprepError to exit code 1.

Messages name the file and the reason, so a user can act on them without a traceback.
"""
from __future__ import annotations

import contextlib
import contextvars
from typing import Any, Iterator

# How a message names an option: as the keyword a Python caller passes (the default), or as the command
# line's flag inside `spelled_as_flags()` (the CLI runs every command in one).
_AS_FLAGS: contextvars.ContextVar[bool] = contextvars.ContextVar("dataprep_options_as_flags", default=False)


def option(name: str, value: object = True) -> str:
    """Option `name` as the caller gives it, for a message that says what to pass: `overwrite=True` from
    Python, `--overwrite` from the command line; a `value` of None gives the bare name (`out`, `--out`)."""
    if _AS_FLAGS.get():
        return "--" + name.replace("_", "-")
    return name if value is None else f"{name}={value!r}"


@contextlib.contextmanager
def spelled_as_flags() -> Iterator[None]:
    """Messages made inside the block name options as the command line spells them (`option`)."""
    token = _AS_FLAGS.set(True)
    try:
        yield
    finally:
        _AS_FLAGS.reset(token)


def brief(value: object, width: int = 40) -> str:
    """`value` as a message shows it: its repr, cut short past `width` characters with their count (a
    400-digit number or a long string given for an option stays one readable line)."""
    r = repr(value)
    if len(r) <= width:
        return r
    return f"{r[:width - 12]}...{r[-6:]} ({len(r)} characters)"


class DataprepError(Exception):
    """Base class of every error dataprep raises on purpose."""


class UsageError(DataprepError, ValueError):
    """A caller passed an argument dataprep cannot take (an unknown option value, a size out of range); a
    ValueError too, as Python's own functions raise for a bad value."""


class SourceError(DataprepError):
    """The input tree is missing, empty or laid out in a way dataprep cannot read."""


class NothingStored(SourceError):
    """A build whose inputs gave nothing to store: every sample listed was skipped (or none was listed). No
    manifest is written, so no pack that looks complete is left; the build's shards are removed. `summary`
    holds what the build did (each split's planned count and skips by reason; `lines()` as a summary prints
    them), where the build has one (None: a token build, which skips no input)."""

    def __init__(self, message: str, summary: Any = None):  # a driver.BuildSummary (errors imports no stage)
        super().__init__(message)
        self.summary = summary

    def __reduce__(self):
        return (type(self), (str(self), self.summary))


class ImageDecodeError(DataprepError):
    """One source image cannot be turned into pixels; `reason` is a short, countable tag."""

    def __init__(self, path: str, reason: str, detail: str = ""):
        self.path = path
        self.reason = reason
        self.detail = detail
        super().__init__(f"{path}: {reason}" + (f" ({detail})" if detail else ""))

    def __reduce__(self):  # crosses process boundaries intact (the default would lose path and reason)
        return (type(self), (self.path, self.reason, self.detail))


class VideoDecodeError(ImageDecodeError):
    """One source video cannot be turned into frames (empty, not a video, truncated, no video stream, over a
    cap); `reason` is a short, countable tag. An ImageDecodeError, so builds skip and count it as they do
    an unusable image (or stop on it with --strict)."""


class PackExistsError(DataprepError, FileExistsError):
    """The output directory already holds a pack or an unfinished build."""


class PackError(DataprepError):
    """A pack on disk is missing, damaged, or of a format this version cannot read."""


class FormatVersionError(PackError):
    """The manifest declares a format version this dataprep does not read."""


class WorkerError(DataprepError):
    """A build worker died or raised; carries what it was working on."""
