"""URLs of packs: takes a pack argument, says whether it is a URL (never a local path named `s3:`), gives
the object store behind it (fsspec, imported only here) with errors that name the missing extra and never
a credential.

Credentials come from the backend's usual chains (environment variables, config files, instance roles;
`AWS_ENDPOINT_URL` for an S3-compatible server); `storage_options` passes fsspec options through for
callers who need them. No option, key or signed query string is ever written to a manifest, a log line
or an error: messages carry `redact(url)`.
"""
from __future__ import annotations

import os
import re
from typing import Any

from ..errors import DataprepError

# a scheme, or fsspec's chains of them ("simplecache::s3://bucket/x": the last one is the store's)
URL = re.compile(r"^(?:[A-Za-z][A-Za-z0-9+.\-]*::)*([A-Za-z][A-Za-z0-9+.\-]*)://")
# what pathlib makes of a URL ("s3://b/x" -> "s3:/b/x"): refused, never taken for a local directory "s3:"
COLLAPSED = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*):/(?!/)")
EXTRAS = {"s3": "s3", "s3a": "s3", "gs": "gcs", "gcs": "gcs", "az": "azure", "abfs": "azure", "abfss": "azure",
          "adl": "azure"}
BUILTIN = ("file", "memory")  # fsspec alone serves these


class RemoteError(DataprepError):
    """An object store could not be reached, or an object is missing or damaged. What went wrong is its
    type where that decides what a caller does: `RemoteNotFound`, `RemoteDenied`, `RemoteTimeout`; any other
    failure (a dropped connection, a store that answered with an error) is a RemoteError, worth a retry."""


class RemoteNotFound(RemoteError, FileNotFoundError):
    """The store holds no such object: it is not coming back, so it is not retried."""


class RemoteDenied(RemoteError, PermissionError):
    """The store refused the request (the credentials it was given do not allow it)."""


class RemoteTimeout(RemoteError, TimeoutError):
    """No complete answer within the deadline (remote/store.py): its time is spent, so it is not retried."""


def remote_error(e: BaseException, message: str) -> RemoteError:
    """The RemoteError carrying `message` for a backend's exception `e`: RemoteDenied when `e` is a
    PermissionError (as s3fs raises for AccessDenied, InvalidAccessKeyId, ExpiredToken, ...), else a
    RemoteError."""
    return (RemoteDenied if isinstance(e, PermissionError) else RemoteError)(message)


def is_url(path: Any) -> bool:
    """Whether a pack argument is a URL (scheme://...). A URL that went through pathlib.Path (which folds
    `//`) is an error, so it never becomes a local directory named after its scheme."""
    if not isinstance(path, (str, os.PathLike)):
        return False
    s = os.fspath(path)
    if isinstance(s, bytes):
        return False
    if URL.match(s):
        return True
    m = COLLAPSED.match(s)
    if m and (m.group(1).lower() in EXTRAS or m.group(1).lower() in BUILTIN) and not os.path.exists(s.split("/")[0]):
        rest = s[len(m.group(0)):]
        again = f"file:///{rest}" if m.group(1).lower() == "file" else f"{m.group(1)}://{rest}"
        raise DataprepError(f"{redact(again)}: a URL that lost its '//' (pathlib.Path folds it): pass the URL as a "
                            f"string, {redact(again)}")
    return False


def redact(url: str) -> str:
    """The URL without user information or query string (keys, SAS tokens, signatures)."""
    m = URL.match(url)
    if not m:
        return url
    if "::" in url:  # each link of a chain redacted alike
        return "::".join(redact(part) for part in url.split("::"))
    rest = url[len(m.group(0)):]
    host, sep, path = rest.partition("/")
    if "@" in host:
        host = "***@" + host.rsplit("@", 1)[1]
    path = path.split("?", 1)[0].split("#", 1)[0]
    return f"{m.group(0)}{host}{sep}{path}"


def scheme(url: str) -> str:
    return URL.match(url).group(1).lower()


def extra_for(url: str) -> str | None:
    """The dataprep extra that installs the backend, None for backends dataprep has no extra for."""
    return EXTRAS.get(scheme(url))


def _install(url: str) -> str:
    extra = extra_for(url)
    return f"pip install 'dataprep[{extra}]'" if extra else f"install the fsspec backend for {scheme(url)}://"


def open_store(url: str, storage_options: dict | None = None):
    """(fsspec filesystem, root path inside it) for a URL; an error naming the extra when its backend (or
    fsspec) is not installed, and naming the URL (redacted) when the store cannot be set up."""
    try:
        import fsspec
    except ImportError:
        raise DataprepError(f"{redact(url)}: packs at URLs need fsspec and the store's backend: "
                            + (_install(url) if scheme(url) not in BUILTIN else "pip install fsspec")) from None
    try:
        fs, root = fsspec.core.url_to_fs(url, **(storage_options or {}))
    except ImportError:
        raise DataprepError(f"{redact(url)}: {scheme(url)}:// needs its fsspec backend: {_install(url)}") from None
    except ValueError as e:
        if "Protocol not known" in str(e):
            raise DataprepError(f"{redact(url)}: no fsspec backend knows {scheme(url)}://") from None
        raise RemoteError(f"{redact(url)}: {safe(e, url)}") from None
    except Exception as e:  # a backend that fails to start (hdfs without its JVM, ...)
        raise remote_error(e, f"{redact(url)}: cannot open the store ({safe(e, url)})") from None
    return fs, root.rstrip("/")


def run_on_loop(fs, coro, *args, timeout: float, late: BaseException, **kw):
    """An async filesystem's coroutine `coro(*args, **kw)` run on its event loop (fsspec's `sync`), `late`
    raised when it has not finished within `timeout` seconds: its task is cancelled, so no thread is left
    waiting on a store that hangs.

    Args:
        fs: the fsspec filesystem `open_store` gave (`async_impl` true).
        coro: one of its coroutine methods (`fs._cat_file`, ...).
        timeout: seconds the call may take.
        late: the error raised when they pass (a RemoteTimeout naming the object).

    Returns:
        What the coroutine returns.
    """
    from fsspec.asyn import sync
    from fsspec.exceptions import FSTimeoutError

    try:
        return sync(fs.loop, coro, *args, timeout=timeout, **kw)
    except FSTimeoutError:
        raise late from None


def safe(e: BaseException, *urls: str) -> str:
    """An exception's message with the URLs' secrets taken out (user info, query strings)."""
    text = f"{type(e).__name__}: {e}"
    for u in urls:
        if u != redact(u):
            text = text.replace(u, redact(u))
        m = URL.match(u)
        host = u[len(m.group(0)):].split("/", 1)[0] if m else ""
        if "@" in host:  # a backend may quote the user info on its own (s3fs: 'Invalid bucket name "KEY:SECRET@b"')
            info = host.rsplit("@", 1)[0]
            for secret in sorted({info, *info.split(":")}, key=len, reverse=True):
                if len(secret) >= 3:
                    text = text.replace(secret, "***")
        query = u.split("?", 1)[1] if "?" in u else ""
        for pair in query.split("&") if query else ():
            value = pair.split("=", 1)[-1]
            if len(value) >= 3:
                text = text.replace(value, "***")
    return re.sub(r"(?i)((?:secret|key|token|signature|sig|credential|password)[\w-]*=)[^&\s'\"]+", r"\1***", text)
