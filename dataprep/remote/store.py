"""An object store under one URL prefix: takes relative object names, gives their bytes (whole or a byte
range), sizes and listings, and writes objects; every failure is a RemoteError naming the object by its
redacted URL, a missing object said to be missing.
"""
from __future__ import annotations

from pathlib import Path

from .urls import RemoteError, open_store, redact, safe


class Store:
    """The objects under `url` (an npy pack's directory, as a prefix)."""

    def __init__(self, url: str, storage_options: dict | None = None):
        self.url = url.rstrip("/")
        self.shown = redact(self.url)
        self.fs, self.root = open_store(self.url, storage_options)
        proto = self.fs.protocol if isinstance(self.fs.protocol, (tuple, list)) else (self.fs.protocol,)
        self.directories = "file" in proto or "local" in proto  # a filesystem whose objects need their folders

    def path(self, rel: str) -> str:
        return f"{self.root}/{rel}" if rel else self.root

    def where(self, rel: str) -> str:
        """The object's URL as messages show it (no credentials)."""
        return f"{self.shown}/{rel}"

    def _call(self, rel: str, what: str, fn, *args, **kw):
        try:
            return fn(*args, **kw)
        except FileNotFoundError:
            raise RemoteError(f"{self.where(rel)}: missing (no such object)") from None
        except RemoteError:
            raise
        except Exception as e:  # s3fs, gcsfs and adlfs raise their own types; the message is what matters
            raise RemoteError(f"{self.where(rel)}: cannot {what} ({safe(e, self.url)})") from None

    def read(self, rel: str, start: int | None = None, end: int | None = None) -> bytes:
        """The object's bytes [start, end); empty past its end (S3 answers such a range 416, not data)."""
        try:
            return self._call(rel, "read it", self.fs.cat_file, self.path(rel), start=start, end=end)
        except RemoteError as e:
            if start and any(w in str(e).lower() for w in ("invalidrange", "not satisfiable")):
                return b""
            raise

    def size(self, rel: str) -> int | None:
        """The object's size, or None when there is none."""
        try:
            return int(self.fs.info(self.path(rel))["size"])
        except FileNotFoundError:
            return None
        except Exception as e:
            raise RemoteError(f"{self.where(rel)}: cannot look it up ({safe(e, self.url)})") from None

    def write(self, rel: str, data: bytes) -> None:
        self._folder(rel)
        self._call(rel, "write it", self.fs.pipe_file, self.path(rel), data)

    def upload(self, local: Path, rel: str) -> None:
        self._folder(rel)
        self._call(rel, "upload it", self.fs.put_file, str(local), self.path(rel))

    def _folder(self, rel: str) -> None:
        if self.directories and "/" in rel:
            self._call(rel, "make its folder", self.fs.makedirs, self.path(rel.rsplit("/", 1)[0]), exist_ok=True)

    def remove(self, rel: str) -> None:
        try:
            self.fs.rm_file(self.path(rel))
        except FileNotFoundError:
            pass
        except Exception as e:
            raise RemoteError(f"{self.where(rel)}: cannot remove it ({safe(e, self.url)})") from None

    def listing(self) -> list[str]:
        """Every object under the prefix, relative to it."""
        try:
            found = self.fs.find(self.root)
        except FileNotFoundError:
            return []
        except Exception as e:
            raise RemoteError(f"{self.shown}: cannot list it ({safe(e, self.url)})") from None
        root = self.root.rstrip("/") + "/"
        return sorted(p[len(root):] for p in found if p.startswith(root))

    def prepare(self) -> None:
        """Make the prefix itself where the store has folders (file://)."""
        if self.directories:
            self._call("", "make it", self.fs.makedirs, self.root, exist_ok=True)
