"""What went wrong at a store is the error's type (dataprep/remote/urls.py), not words in its message: a
missing object is a RemoteNotFound (a FileNotFoundError), a refused request a RemoteDenied (a
PermissionError), a passed deadline a RemoteTimeout (a TimeoutError); retries and the manifest's "missing"
follow the type. Over memory:// stores (fsspec alone), each test under a prefix of its own."""
from __future__ import annotations

import pickle
import time
import uuid

import pytest

pytest.importorskip("fsspec", reason="packs at URLs need fsspec")

from dataprep.errors import DataprepError, PackError, UsageError
from dataprep.remote import fetch
from dataprep.remote.store import LATE, Store
from dataprep.remote.urls import RemoteDenied, RemoteError, RemoteNotFound, RemoteTimeout


@pytest.fixture
def url():
    u = f"memory://dataprep-errors-{uuid.uuid4().hex}/missing-pack"  # "missing" in the URL: words must not decide
    yield u
    import fsspec

    fs = fsspec.filesystem("memory")
    root = u[len("memory://"):].split("/", 1)[0]
    if fs.exists(f"/{root}"):
        fs.rm(f"/{root}", recursive=True)


def test_each_error_is_a_remote_error_and_the_os_error_it_stands_for():
    for cls, also in ((RemoteNotFound, FileNotFoundError), (RemoteDenied, PermissionError), (RemoteTimeout, TimeoutError)):
        e = cls("s3://b/p/x.npy: the message")
        assert isinstance(e, RemoteError) and isinstance(e, DataprepError) and isinstance(e, also), cls
        assert str(e) == "s3://b/p/x.npy: the message"
        back = pickle.loads(pickle.dumps(e))  # crosses threads and processes intact
        assert type(back) is cls and str(back) == str(e)
    assert issubclass(UsageError, DataprepError) and issubclass(UsageError, ValueError)


def test_a_missing_object_is_a_remote_not_found(url):
    st = Store(url)
    with pytest.raises(RemoteNotFound) as e:
        st.read("train/00000/images.npy")
    assert str(e.value) == f"{url}/train/00000/images.npy: missing (no such object)"
    st.write("there.npy", b"x")
    assert st.read("there.npy") == b"x" and st.size("gone.npy") is None  # the negative control: what is there is read


def test_a_refused_request_is_a_remote_denied_with_the_same_message(url, monkeypatch):
    st = Store(url)
    st.write("x.npy", b"data")

    def refuse(*a, **kw):
        raise PermissionError("Access Denied")

    def broken(*a, **kw):
        raise ConnectionResetError("reset by peer")

    monkeypatch.setattr(st.fs, "cat_file", refuse)
    monkeypatch.setattr(st.fs, "info", refuse)
    with pytest.raises(RemoteDenied) as e:
        st.read("x.npy")
    assert str(e.value) == f"{url}/x.npy: cannot read it (PermissionError: Access Denied)"
    with pytest.raises(RemoteDenied, match="cannot look it up"):
        st.size("x.npy")
    monkeypatch.setattr(st.fs, "cat_file", broken)  # any other failure stays a plain RemoteError
    with pytest.raises(RemoteError) as e:
        st.read("x.npy")
    assert type(e.value) is RemoteError and "ConnectionResetError: reset by peer" in str(e.value)


def test_a_passed_deadline_is_a_remote_timeout(url, monkeypatch):
    st = Store(url)
    st.write("slow.npy", b"data")
    st.local = False  # as a store across a network: the deadline applies
    monkeypatch.setenv("DATAPREP_REMOTE_DEADLINE", "0.2")
    monkeypatch.setattr(st.fs, "cat_file", lambda *a, **kw: time.sleep(2))
    with pytest.raises(RemoteTimeout) as e:
        st.read("slow.npy")
    assert str(e.value).startswith(f"{url}/slow.npy: {LATE} 0.2 s") and "DATAPREP_REMOTE_DEADLINE" in str(e.value)


def test_retries_follow_the_type_not_the_words():
    def failing(*errors):
        calls = []

        def fn():
            calls.append(1)
            if len(calls) <= len(errors):
                raise errors[len(calls) - 1]
            return "ok"
        return fn, calls

    fn, calls = failing(RemoteNotFound("s3://b/p/x.npy: gone"))
    with pytest.raises(RemoteNotFound):
        fetch.retried(fn)
    assert len(calls) == 1  # not coming back: not retried, whatever its message says
    fn, calls = failing(RemoteTimeout("s3://b/p/x.npy: too slow"))
    with pytest.raises(RemoteTimeout):
        fetch.retried(fn)
    assert len(calls) == 1  # its time is spent
    fn, calls = failing(RemoteError("s3://b/missing/x.npy: cannot read it (ConnectionError: missing route)"))
    assert fetch.retried(fn) == "ok" and len(calls) == 2  # a dropped request is retried, "missing" in its words or not
    fn, calls = failing(RemoteNotFound("s3://b/p/x.npy: not there yet"))
    assert fetch.retried(fn, what_stops=None) == "ok" and len(calls) == 2  # an upload retries every RemoteError


def test_only_a_missing_manifest_is_taken_for_an_incomplete_pack(url, monkeypatch):
    with pytest.raises(PackError, match="is not a complete pack"):  # nothing at the URL: the manifest is missing
        fetch.RemotePack(url)

    def down(self, rel, start=None, end=None):
        raise RemoteError(f"{self.where(rel)}: cannot read it (ConnectionError: the store is down)")

    monkeypatch.setattr(Store, "read", down)
    with pytest.raises(RemoteError) as e:  # the store failing is that failure, though the URL says "missing"
        fetch.RemotePack(url)
    assert type(e.value) is RemoteError
    assert str(e.value) == f"{url}/manifest.json: cannot read it (ConnectionError: the store is down)"
