"""Table build: takes table files and settings, gives a pack of kind "table" (one shard per split,
written atomically, manifest last), reusing the image build's output rules and shard writer."""
from __future__ import annotations

import datetime as _dt
import json
import os
import time
from pathlib import Path
from typing import Any, Callable

from ..driver import prepare_output
from ..pack.manifest import write_manifest
from ..pack.shard import shard_name, write_shard
from ..version import __version__
from .columns import VOCAB_FILE, TableSettings, convert
from .read import read_tables


def input_bytes(paths: list[str]) -> int:
    """The bytes of the table files (a directory: the files under it) that `build_table`'s progress counts."""
    return sum(_size(p) for p in paths)


def _size(path) -> int:
    p = Path(path)
    try:
        if p.is_dir():
            return sum(f.stat().st_size for f in p.rglob("*") if f.is_file())
        return p.stat().st_size
    except OSError:
        return 0  # read_tables names the file and the reason


class _Told:
    """An engine (default: this process) that tells `progress` of each file read, by its bytes (`input_bytes`)."""

    def __init__(self, engine, paths: list[str], progress):
        from ..engine import LocalEngine

        self.engine, self.paths, self.progress = engine or LocalEngine(1), paths, progress

    def map(self, fn, tasks, on_result=None, names=None):
        def told(i, result):
            self.progress(_size(self.paths[i]))
            if on_result:
                on_result(i, result)

        return self.engine.map(fn, tasks, told, names=names)

    def __getattr__(self, name):
        return getattr(self.engine, name)


def build_table(paths: list[str], out: str | os.PathLike, settings: TableSettings, read: dict[str, Any],
                target_file: str | None = None, overwrite: bool = False, engine=None,
                progress: Callable[[int], None] | None = None) -> dict[str, Any]:
    """Read (one task per file on `engine`: parsing is the slow part), convert (vocabularies and
    statistics need every row, so in this process) and write; return {"splits": {name: rows}, "rows": {"read":
    N, "dropped": {reason: rows}}, "columns": {column: what it became}, ...}. `progress(n)` is told of
    each file read, by its bytes (`input_bytes`)."""
    t0 = time.perf_counter()
    out = Path(out)
    df = read_tables(paths, **read, engine=_Told(engine, paths, progress) if progress else engine)
    if target_file:
        from ..errors import SourceError

        tdf = read_tables([target_file], **{**read, "header": "none", "names": None, "skip_rows": 0})
        if len(tdf) != len(df) or tdf.shape[1] != 1:
            raise SourceError(f"{target_file}: {len(tdf)} rows x {tdf.shape[1]} columns; expected one column of {len(df)} rows")
        df[settings.target] = tdf.iloc[:, 0].to_numpy()
    conv = convert(df, settings)
    prepare_output(out, overwrite)
    splits = {}
    for name, arrays in conv.splits.items():
        files = write_shard(out / name, 0, arrays, {"count": conv.counts[name]})
        splits[name] = {"count": conv.counts[name], "shards": [{"name": shard_name(0), "count": conv.counts[name], "files": files}],
                        "bytes": sum(f["bytes"] for f in files.values())}
    if conv.vocab:  # beside the manifest, which stays small however many categories there are
        (out / VOCAB_FILE).write_text(json.dumps(conv.vocab), encoding="utf-8")
    seconds = time.perf_counter() - t0
    write_manifest(out, {
        "kind": "table",
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "dataprep_version": __version__,
        "source": {"files": [str(Path(p).resolve()) for p in paths], "target_file": target_file, "read": read},
        "settings": settings.to_dict(),
        "fields": conv.fields,
        "stats": conv.stats,
        "rows": conv.rows,
        "splits": splits,
        "build": {"seconds": round(seconds, 3)},
    })
    return {"splits": conv.counts, "features": len(conv.fields["features"]["columns"]),
            "categorical": len(conv.fields.get("categorical", {}).get("columns", [])), "seconds": seconds,
            "target": conv.fields["target"], "rows": conv.rows, "columns": conv.fields["conversions"]}
