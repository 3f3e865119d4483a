"""An object store under one URL prefix: takes relative object names, gives their bytes (whole or a byte
range), sizes and listings, and writes objects; every failure is a RemoteError naming the object by its
redacted URL, a missing object said to be missing (RemoteNotFound), a refused request a RemoteDenied.

Every call to a store that is not local has a deadline (DATAPREP_REMOTE_DEADLINE seconds, default 300; 0
turns it off): an endpoint that accepts a connection and never answers, or trickles a byte at a time
(which no socket timeout catches), is an error naming the object within it (RemoteTimeout), never a hang.
Retries of one request share its deadline (`deadline_for`). Async backends (s3fs, gcsfs, adlfs, http) cancel
the request on their event loop; a synchronous backend's call is left to finish in a daemon thread.
"""
from __future__ import annotations

import contextlib
import inspect
import math
import os
import threading
import time
from pathlib import Path

from .urls import RemoteError, RemoteNotFound, RemoteTimeout, open_store, redact, remote_error, run_on_loop, safe

DEADLINE_ENV = "DATAPREP_REMOTE_DEADLINE"
DEADLINE = 300.0  # seconds one request (with its retries) may take, unless DATAPREP_REMOTE_DEADLINE says
UPLOAD_RATE = 1 << 20  # bytes per second an upload is allowed at least, on top of the deadline
LATE = "no complete answer within"  # in a RemoteTimeout's message
_LOCAL = threading.local()


def deadline() -> float | None:
    """Seconds one request may take (None: no deadline: 0, or inf)."""
    raw = os.environ.get(DEADLINE_ENV, "")
    try:
        t = float(raw) if raw.strip() else DEADLINE
    except ValueError:
        t = math.nan
    if math.isnan(t):  # nan compares false with everything: it would have turned the deadline off unsaid
        from ..errors import DataprepError

        raise DataprepError(f"{DEADLINE_ENV}={raw!r}: not a number of seconds (0 or inf: no deadline)") from None
    return t if 0 < t < math.inf else None


@contextlib.contextmanager
def deadline_for(seconds: float | None = None):
    """Store calls this thread makes inside the block share one deadline (`seconds`, default `deadline()`):
    the retries of one request together take no longer than it."""
    t = deadline() if seconds is None else seconds
    prev = getattr(_LOCAL, "until", None)
    until = None if t is None else time.monotonic() + t
    if prev is not None and (until is None or prev < until):
        until = prev
    _LOCAL.until = until
    try:
        yield
    finally:
        _LOCAL.until = prev


def time_left() -> float | None:
    """Seconds the next store call of this thread may take (None: no limit)."""
    t = deadline()
    until = getattr(_LOCAL, "until", None)
    if until is None:
        return t
    left = max(0.0, until - time.monotonic())
    return left if t is None else min(t, left)


class Store:
    """The objects under `url` (an npy pack's directory, as a prefix)."""

    def __init__(self, url: str, storage_options: dict | None = None):
        self.url = url.rstrip("/")
        self.shown = redact(self.url)
        self.fs, self.root = open_store(self.url, storage_options)
        proto = self.fs.protocol if isinstance(self.fs.protocol, (tuple, list)) else (self.fs.protocol,)
        self.directories = "file" in proto or "local" in proto  # a filesystem whose objects need their folders
        self.local = self.directories or "memory" in proto  # no network: no deadline

    def path(self, rel: str) -> str:
        return f"{self.root}/{rel}" if rel else self.root

    def where(self, rel: str) -> str:
        """The object's URL as messages show it (no credentials)."""
        return f"{self.shown}/{rel}"

    def _timed(self, rel: str, name: str, *args, extra: float = 0.0, **kw):
        """self.fs.<name>(*args, **kw) within the deadline (plus `extra` seconds); a RemoteTimeout naming the
        object when it passes."""
        fn = getattr(self.fs, name)
        t = None if self.local else time_left()
        if t is None:
            return fn(*args, **kw)
        t += extra
        late = RemoteTimeout(f"{self.where(rel)}: {LATE} {t:.1f} s (a store that hangs, or trickles its answer; "
                             f"{DEADLINE_ENV} sets this deadline in seconds)")
        if t <= 0:
            raise late
        coro = getattr(self.fs, "_" + name, None)
        if getattr(self.fs, "async_impl", False) and coro is not None and inspect.iscoroutinefunction(coro):
            return run_on_loop(self.fs, coro, *args, timeout=t, late=late, **kw)
        box: list = []

        def run():
            try:
                box.append((True, fn(*args, **kw)))
            except BaseException as e:  # noqa: BLE001 - handed to the caller's thread
                box.append((False, e))

        th = threading.Thread(target=run, name="dataprep-store-call", daemon=True)
        th.start()
        th.join(t)
        if not box:
            raise late
        ok, value = box[0]
        if ok:
            return value
        raise value

    def _call(self, rel: str, what: str, name: str, *args, extra: float = 0.0, **kw):
        try:
            return self._timed(rel, name, *args, extra=extra, **kw)
        except RemoteError:
            raise
        except FileNotFoundError:
            raise RemoteNotFound(f"{self.where(rel)}: missing (no such object)") from None
        except Exception as e:  # s3fs, gcsfs and adlfs raise their own types; the message says what they said
            raise remote_error(e, f"{self.where(rel)}: cannot {what} ({safe(e, self.url)})") from None

    def read(self, rel: str, start: int | None = None, end: int | None = None) -> bytes:
        """The object's bytes [start, end); empty past its end (S3 answers such a range 416, not data)."""
        try:
            return self._call(rel, "read it", "cat_file", self.path(rel), start=start, end=end)
        except RemoteError as e:
            if start and any(w in str(e).lower() for w in ("invalidrange", "not satisfiable")):
                return b""
            raise

    def size(self, rel: str) -> int | None:
        """The object's size, or None when there is none."""
        try:
            return int(self._timed(rel, "info", self.path(rel))["size"])
        except RemoteError:
            raise
        except FileNotFoundError:
            return None
        except Exception as e:
            raise remote_error(e, f"{self.where(rel)}: cannot look it up ({safe(e, self.url)})") from None

    def write(self, rel: str, data: bytes) -> None:
        self._folder(rel)
        self._call(rel, "write it", "pipe_file", self.path(rel), data, extra=len(data) / UPLOAD_RATE)

    def upload(self, local: Path, rel: str) -> None:
        self._folder(rel)
        size = os.path.getsize(local) if os.path.exists(local) else 0
        self._call(rel, "upload it", "put_file", str(local), self.path(rel), extra=size / UPLOAD_RATE)

    def _folder(self, rel: str) -> None:
        if self.directories and "/" in rel:
            self._call(rel, "make its folder", "makedirs", self.path(rel.rsplit("/", 1)[0]), exist_ok=True)

    def remove(self, rel: str) -> None:
        try:
            self._timed(rel, "rm_file", self.path(rel))
        except RemoteError:
            raise
        except FileNotFoundError:
            pass
        except Exception as e:
            raise remote_error(e, f"{self.where(rel)}: cannot remove it ({safe(e, self.url)})") from None

    def listing(self) -> list[str]:
        """Every object under the prefix, relative to it."""
        try:
            found = self._timed("", "find", self.root)
        except RemoteError:
            raise
        except FileNotFoundError:
            return []
        except Exception as e:
            raise remote_error(e, f"{self.shown}: cannot list it ({safe(e, self.url)})") from None
        root = self.root.rstrip("/") + "/"
        return sorted(p[len(root):] for p in found if p.startswith(root))

    def prepare(self) -> None:
        """Make the prefix itself where the store has folders (file://)."""
        if self.directories:
            self._call("", "make it", "makedirs", self.root, exist_ok=True)
