"""Verify stage: takes a pack of any kind and backend, gives every problem found in it, by file: the manifest,
every shard file's checksum, headers, offsets, shapes and counts, and what each of the kind's fields checks
(label range, mask values, token ids; with `decode`, whether every stored JPEG decodes to its shape).

It knows no kind: the kind registry gives the pack's fields, and every shard is loaded through them.

A local copy of a pack at a URL (`cache="disk:DIR"`) holds only the shard files its loads needed (never the
audit arrays a dataset does not load, nor a split it did not open; a killed fetch may have brought fewer):
verify checks every file the copy holds, as for any pack, and counts the ones it does not hold instead of
calling them missing, so a copy a killed fetch resumed can be trusted for what it serves."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from .errors import PackError
from .kinds import kind_of
from .pack.arrays import LoadContext
from .pack.backends import open_reader
from .pack.manifest import MANIFEST, attachment_problems
from .progress import reporter


@dataclass
class Report:
    problems: list[tuple[str, str]] = field(default_factory=list)  # (path, what is wrong)
    shards: int = 0
    files: int = 0
    bytes: int = 0
    samples: int = 0
    decoded: int = 0
    copy_of: str | None = None  # a partial local copy of the pack at this URL (as shown): files it lacks are not problems
    left_out: int = 0  # files of the pack such a copy does not hold (fetched when a load needs them): not checked

    @property
    def ok(self) -> bool:
        return not self.problems


def verify_pack(pack: str | os.PathLike, decode: bool = False, progress: bool | Callable[[int], None] | None = None,
                what: str | None = None, partial: bool = True) -> Report:
    """Check everything about a pack and report every problem rather than stopping at the first. `progress`:
    True shows the shards checked (a bar on a terminal, lines in a log: dataprep/progress.py), in lines
    named `what` [default: "verify PACK"]; a callable is told of each (1); None or False shows nothing.
    `partial`: a local copy of a pack at a URL (its origin file says so) may lack shard files, counted in
    `left_out` rather than reported; False holds it to every file (verify of a URL, which fetched them all)."""
    from .remote.packs import copy_origin

    what = what or f"verify {pack}"
    pack = Path(pack)
    rep = Report(copy_of=copy_origin(pack) if partial and pack.is_dir() else None)
    where = pack / MANIFEST if pack.is_dir() and not (pack / "zarr.json").exists() else pack
    try:
        reader = open_reader(pack)
        m = reader.manifest
        fields = kind_of(m, where).fields_of(m, where)
    except (PackError, KeyError, TypeError, ValueError) as e:
        rep.problems.append((str(where), str(e)))
        return rep
    try:
        bar = reporter(progress, what, _shard_count(m), "shards")
    except BaseException:
        reader.close()
        raise
    try:
        for split, entry in m["splits"].items():
            counted = 0
            for k, shard in enumerate(entry.get("shards", [])):
                counted += _verify_shard(pack, reader, fields, split, k, shard, decode, rep)
                bar.update(1)
            if counted != entry.get("count"):
                rep.problems.append((str(pack / split), f"split {split}: shards hold {counted} samples, the split says {entry.get('count')}"))
        if m.get("attachments"):  # files beside the shards (a token pack's tokenizer) have their checksums too
            rep.problems += [(str(pack / name), what) for name, what in attachment_problems(m, reader.attachments())]
            rep.files += len(m["attachments"])
    finally:
        bar.close()
        reader.close()
    return rep


def _shard_count(m: dict) -> int | None:
    try:
        return sum(len(entry.get("shards", [])) for entry in m["splits"].values())
    except (AttributeError, KeyError, TypeError):
        return None  # counted anyway: the shards' own problems are the report's


def _verify_shard(pack: Path, reader, fields: dict, split: str, k: int, shard: dict, decode: bool, rep: Report) -> int:
    """Load one shard through every field, checksums checked; record what is wrong; give its recorded count."""
    split_dir = pack / split
    where = split_dir / str(shard.get("name"))
    files = shard.get("files", {}) if isinstance(shard.get("files"), dict) else {}
    try:
        count = int(shard.get("count", 0))
    except (TypeError, ValueError):
        count = 0
    # a partial copy's files it does not hold (a symlink counts as held: loading it is the problem to report)
    absent = {n for n in files if not os.path.lexists(where / n)} if rep.copy_of is not None else set()
    ctx = LoadContext(verify=True, reader=reader)
    covered: set[str] = set()
    unloaded: set[str] = set()  # arrays of fields a partial copy holds only part of: checked by checksum below
    ok = True
    loaded = {}
    for key, f in fields.items():
        covered |= set(f.stored())
        if any(f"{a}.npy" in absent for a in f.stored()):
            unloaded |= set(f.stored())
            continue
        try:
            arrays = f.load(split_dir, [shard], ctx)
        except (PackError, KeyError, TypeError, ValueError) as e:
            rep.problems.append((str(where), str(e)))
            ok = False
            continue
        loaded[key] = arrays
        if f.count(arrays) != count:
            rep.problems.append((str(where / f"{next(iter(f.stored()))}.npy"), f"holds {f.count(arrays)} samples, the shard says {count}"))
            ok = False
        for what in f.check(arrays, deep=decode):
            rep.problems.append((str(where), what))
    strings = fields["source"].strings(loaded["source"]) if "source" in loaded else None
    if decode:
        for key, f in fields.items():
            found = f.decode_check(loaded[key]) if key in loaded and hasattr(f, "decode_check") else None
            if found is None:
                continue
            rep.decoded += f.count(loaded[key])
            for i, what in found:
                name = f" ({strings[i]})" if strings is not None else ""
                rep.problems.append((str(where), f"sample {i}{name}: {what}"))
    for fname in files:  # anything a field did not read is still checked against its checksum
        if fname in absent:
            rep.left_out += 1
            continue
        if fname.endswith(".npy") and (fname[:-4] not in covered or fname[:-4] in unloaded):
            try:
                reader.shard_array(split, k, fname[:-4], verify=True)
            except (PackError, KeyError, TypeError, ValueError) as e:
                rep.problems.append((str(where), str(e)))
                ok = False
    rep.shards += 1
    rep.files += len(files) - len(absent)
    rep.bytes += sum(int(f.get("bytes", 0)) for n, f in files.items() if isinstance(f, dict) and n not in absent)
    if ok:
        rep.samples += count
    return count


def verify_remote(url: str, decode: bool = False, progress: bool | None = None) -> tuple[Report, str]:
    """`verify_pack` for a pack at a URL: every object fetched and checked against the manifest's sha256
    (each damaged, truncated or missing one named by its URL), then the fields' checks on the copy.
    Returns the report (paths as URLs) and the URL as shown. `progress` shows the fetch (None: in a log
    only, as every fetch) and the checks (as verify_pack's)."""
    from .remote.packs import local_copy

    with local_copy(url, keep_going=True, progress=progress) as (rp, d, bad):
        rep = verify_pack(d, decode=decode, progress=progress, what=f"verify {rp.shown}", partial=False)  # all fetched
        lost = {where[len(rp.shown) + 1:] for where, _ in bad}
        prefix = str(d) + os.sep

        def shown(path: str) -> str:
            return rp.store.where(path[len(prefix):].replace(os.sep, "/")) if path.startswith(prefix) else path

        # a file that could not be fetched is missing from the copy too: say it once, as the store's problem
        kept = [(shown(p), w) for p, w in rep.problems
                if not any(p.startswith(prefix + rel.rsplit("/", 1)[0]) for rel in lost)]
        rep.problems = [*bad, *kept]
    return rep, rp.shown
