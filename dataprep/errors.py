"""One error hierarchy for dataprep; the CLI maps every DataprepError to exit code 1.

Messages name the file and the reason, so a user can act on them without a traceback.
"""
from __future__ import annotations


class DataprepError(Exception):
    """Base class of every error dataprep raises on purpose."""


class UsageError(DataprepError, ValueError):
    """A caller passed an argument dataprep cannot take (an unknown option value, a size out of range); a
    ValueError too, as Python's own functions raise for a bad value."""


class SourceError(DataprepError):
    """The input tree is missing, empty or laid out in a way dataprep cannot read."""


class ImageDecodeError(DataprepError):
    """One source image cannot be turned into pixels; `reason` is a short, countable tag."""

    def __init__(self, path: str, reason: str, detail: str = ""):
        self.path = path
        self.reason = reason
        self.detail = detail
        super().__init__(f"{path}: {reason}" + (f" ({detail})" if detail else ""))

    def __reduce__(self):  # crosses process boundaries intact (the default would lose path and reason)
        return (type(self), (self.path, self.reason, self.detail))


class PackExistsError(DataprepError, FileExistsError):
    """The output directory already holds a pack or an unfinished build."""


class PackError(DataprepError):
    """A pack on disk is missing, damaged, or of a format this version cannot read."""


class FormatVersionError(PackError):
    """The manifest declares a format version this dataprep does not read."""


class WorkerError(DataprepError):
    """A build worker died or raised; carries what it was working on."""
