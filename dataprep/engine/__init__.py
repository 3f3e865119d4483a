"""Engine stage: takes a list of independent tasks (one per shard) and a pure function, gives their results
in task order, calling back as each finishes.

Two engines, one interface (`map(fn, tasks, on_result, names)`, a context manager): `LocalEngine`, a
process pool on this machine, and `DaskEngine`, the tasks on a Dask cluster (an existing one by
address or scheduler file, or a local one it starts and stops). A task's result depends only on the
task, so every engine gives the same pack byte for byte. `ENGINES` is the registry the CLI's
`--engine` choices come from.
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator, Protocol, Sequence

from .dask import DaskEngine
from .local import LocalEngine, run_tasks

__all__ = ["ENGINES", "DaskEngine", "Engine", "LocalEngine", "make_engine", "open_engine", "run_tasks"]


class Engine(Protocol):
    name: str

    def map(self, fn: Callable[[Any], Any], tasks: Sequence[Any], on_result: Callable[[int, Any], None] | None = None,
            names: Sequence[str] | None = None) -> list[Any]: ...

    def describe(self) -> str: ...

    def __enter__(self) -> "Engine": ...

    def __exit__(self, *exc) -> None: ...


# name -> class; each takes `from_options(workers, address, scheduler_file, retries)`. distributed is imported
# only when a Dask engine is made.
ENGINES: dict[str, type] = {"local": LocalEngine, "dask": DaskEngine}


def make_engine(name: str = "local", workers: int = 1, address: str | None = None, scheduler_file: str | None = None,
                retries: int = 2) -> Engine:
    """The engine `name` ("local" or "dask"); `workers` is the local pool's size, or the size of the local
    Dask cluster started when neither `address` nor `scheduler_file` names an existing one."""
    from ..errors import DataprepError

    if name not in ENGINES:
        raise DataprepError(f"unknown engine {name!r}; choose one of {list(ENGINES)}")
    return ENGINES[name].from_options(workers, address, scheduler_file, retries)


@contextlib.contextmanager
def open_engine(name: str = "local", workers: int = 1, address: str | None = None, scheduler_file: str | None = None,
                say: Callable[[str], None] | None = None) -> Iterator[Engine]:
    """The engine `name`, open for the block (a cluster started for it is stopped after); where the tasks
    run is told to `say` when that is not this machine's process pool."""
    with make_engine(name, workers, address, scheduler_file) as eng:
        if name != "local" and say is not None:
            say(f"engine: {eng.describe()}")
        yield eng
