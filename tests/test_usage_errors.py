"""Loader and Mixture argument errors are UsageErrors (a ValueError and a DataprepError) naming the argument
and the value, as the front door's are."""
from __future__ import annotations

import numpy as np
import pytest

import dataprep
from dataprep.errors import DataprepError, UsageError


class Rows:
    """The smallest servable dataset: row i is i."""

    def __init__(self, n: int = 8):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def batch_layout(self, request=None):
        return {"x": ((), np.dtype(np.int64))}

    def fill_batch(self, idx, out, request=None):
        out["x"][: len(idx)] = np.asarray(idx)


@pytest.mark.parametrize("kw, name", [
    ({"batch_size": 0}, "batch_size"), ({"batch_size": 2.5}, "batch_size"), ({"batch_size": True}, "batch_size"),
    ({"num_workers": -1}, "num_workers"), ({"prefetch": 0}, "prefetch"), ({"hold_bytes": -1}, "hold_bytes"),
    ({"layout": "chw"}, "layout"),
])
def test_a_bad_loader_argument_is_a_usage_error_naming_it(kw, name):
    args = {"batch_size": 2, **kw}
    with pytest.raises(UsageError, match=rf"Loader: {name}\b") as e:
        dataprep.Loader(Rows(), **args)
    assert isinstance(e.value, ValueError) and isinstance(e.value, DataprepError)
    assert repr(next(iter(kw.values()))) in str(e.value)


@pytest.mark.parametrize("kw, name", [
    ({"datasets": []}, "datasets"), ({"weights": [1, -1]}, "weights"), ({"weights": [1]}, "weights"),
    ({"exhausted": "never"}, "exhausted"), ({"datasets": [Rows(), Rows(0)]}, r"datasets\[1\]"),
])
def test_a_bad_mixture_argument_is_a_usage_error_naming_it(kw, name):
    args = {"datasets": [Rows(), Rows()], "weights": [1, 1], **kw}
    if "datasets" in kw and "weights" not in kw:
        args["weights"] = [1] * max(len(kw["datasets"]), 1)
    with pytest.raises(UsageError, match=rf"Mixture: {name}"):
        dataprep.Mixture(**args)


def test_a_working_loader_is_not_refused():
    """Negative control for the checks above: the same arguments in range serve."""
    assert [b[0].tolist() for b in dataprep.Loader(Rows(4), batch_size=2, prefetch=1, hold_bytes=0)] == [[0, 1], [2, 3]]
