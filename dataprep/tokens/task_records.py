"""A token task's records for --resume: takes a pack's output folder, a task's number and fingerprint,
gives what an earlier run finished of the task, its shards intact by checksum (`_finished`), the record
saved after each unit and when the task is done (`_save_record`), an input file's stamp for the
fingerprint (`_stamp`), and the shards a run left that no record keeps removed (`_drop_shards_of`,
`_remove_unrecorded`). tokens/tokenize.py keeps and drops a task's shards through these.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Collection

from ..driver import TASK_RECORDS, remove_entry
from ..pack.manifest import write_attachment
from ..pack.shard import reusable_shard
from ..safe_paths import open_nofollow

if TYPE_CHECKING:
    from .tokenize import FileTask


def _stamp(path: str) -> tuple:
    try:
        st = os.stat(path)
        return os.path.abspath(path), st.st_size, st.st_mtime_ns
    except OSError:
        return os.path.abspath(path), -1, -1


def _task_record(out: Path, task_no: int) -> Path:
    return out / TASK_RECORDS / f"{task_no:05d}.json"


def _finished(task: FileTask, fp: str) -> dict[str, Any] | None:
    """What an earlier run recorded of this task ({"done", "read", "chars", "record"}) when it was made with the same
    fingerprint and every shard it lists is still intact by checksum: the whole task ("done"), or its first units,
    `read` documents of `chars` characters; else None."""
    out = Path(task.out)
    try:
        with os.fdopen(open_nofollow(_task_record(out, task.task_no)), encoding="utf-8") as f:
            saved = json.load(f)
        if saved.get("fingerprint") != fp:
            return None
        for n, sp in saved["record"]["splits"].items():
            for sh in sp["shards"]:
                got = reusable_shard(out / n, sh["name"], fp)
                if got is None or got.get("files") != sh["files"]:
                    return None
        return {"done": saved.get("done", True), "read": int(saved.get("read", 0)), "chars": int(saved.get("chars", 0)),
                "record": saved["record"]}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def _save_record(out: Path, task_no: int, fp: str, done: bool, read: int, chars: int, rec: dict[str, Any]) -> None:
    """The task's record for --resume: after each unit (written once its shards are), and when it is done."""
    path = _task_record(out, task_no)
    path.parent.mkdir(mode=0o755, exist_ok=True)
    body = {"fingerprint": fp, "done": done, "read": read, "chars": chars, "record": rec}
    write_attachment(path.parent, path.name, json.dumps(body).encode("utf-8"))


def _drop_shards_of(out: Path, task_no: int, keep: Collection[tuple[str, str]] = ()) -> None:
    """An unfinished (or stale) run's shards of this task but those in `keep` (its kept units'): its shards are
    named after its number (TTTTTPPPP)."""
    prefix = f"{task_no:05d}"
    for n in ("train", "val"):
        d = out / n
        if d.is_dir() and not d.is_symlink():
            for p in d.iterdir():
                if len(p.name) == 9 and p.name.isdigit() and p.name.startswith(prefix) and (n, p.name) not in keep:
                    remove_entry(p)


def _remove_unrecorded(out: Path, names: list[str], recs: list[dict]) -> None:
    """After the tasks: drop shards and splits an earlier (resumed) run left that this run's records do not have."""
    recorded = {(n, sh["name"]) for r in recs for n, sp in r["splits"].items() for sh in sp["shards"]}
    for n in ("train", "val"):
        d = out / n
        if d.is_symlink() or not d.is_dir():
            continue
        if n not in names:
            remove_entry(d)
            continue
        for p in d.iterdir():
            if (n, p.name) not in recorded:
                remove_entry(p)
