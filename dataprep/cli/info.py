"""`dataprep info PACK`: the manifest in a readable form (or as JSON), and a cheap check that every file it
records is there (by existence and recorded size; `dataprep verify` reads and hashes them). With `--context`,
a token pack's packing plan too: rows an epoch, padding and documents cut per split, from the document
offsets alone."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import click

from ..errors import DataprepError, UsageError
from ..tokens.packing import STRATEGIES


def first_of(items: list, n: int, what: str = "more") -> str:
    """The first n items, joined, and how many are left out."""
    shown = ", ".join(map(str, items[:n]))
    return shown + (f" ... and {len(items) - n:,} {what}" if len(items) > n else "")


def missing_files(pack: str | os.PathLike, m: dict[str, Any]) -> tuple[str, int, list[str]]:
    """(what was checked, how many, what is wrong with each that is not as the manifest records it). An npy
    pack: every shard file exists, is a regular file, and has its recorded size; a Zarr group: every array's
    metadata exists (chunks of zeros are never written, so a chunk file may be absent); an HDF5 pack is its
    one file, opened to read the manifest."""
    from ..pack.backends import detect

    root, backend, n, bad = Path(pack), detect(pack), 0, []
    if backend == "hdf5":
        return "HDF5 file (the pack is one file)", 1, []
    for split, entry in m["splits"].items():
        if backend == "zarr":
            from ..pack.backends.layout import group_path, plan_arrays

            for name in plan_arrays(m, split):
                n += 1
                if not (root / group_path(split, name) / "zarr.json").is_file():
                    bad.append(f"{group_path(split, name)}: missing")
            continue
        for s in entry["shards"]:
            for fname, rec in s.get("files", {}).items():
                n += 1
                rel = f"{split}/{s['name']}/{fname}"
                try:
                    st = os.stat(root / rel, follow_symlinks=False)
                except FileNotFoundError:
                    bad.append(f"{rel}: missing")
                    continue
                except OSError as e:
                    bad.append(f"{rel}: {e.strerror}")
                    continue
                if not os.path.isfile(root / rel) or os.path.islink(root / rel):
                    bad.append(f"{rel}: not a regular file")
                elif "bytes" in rec and st.st_size != rec["bytes"]:
                    bad.append(f"{rel}: {st.st_size:,} bytes, the manifest records {rec['bytes']:,}")
    return ("Zarr arrays (their metadata)" if backend == "zarr" else "shard files, with their recorded sizes"), n, bad


@click.command()
@click.argument("pack", type=click.Path())
@click.option("--json", "as_json", is_flag=True, help="Print the manifest as JSON (with --context, and packed_rows).")
@click.option("--skipped", is_flag=True, help="List every skipped source file with its reason.")
@click.option("--context", type=click.IntRange(min=2), default=None,
              help="A token pack: also the rows of this many tokens packing its documents makes, per split.")
@click.option("--packing", type=click.Choice(STRATEGIES), default=None,
              help="The packing strategy of --context's rows [default: best_fit].")
@click.pass_context
def info(ctx, pack, as_json, skipped, context, packing):
    """Describe a pack: kind, format, settings, splits, classes, fields and skipped files; check that every file
    the manifest records exists with its recorded size (exit 1 when one does not; `dataprep verify` also reads
    and hashes them). With --context (and --packing), a token pack's packed rows as PackedDocuments serves
    them: rows an epoch, padding share and documents cut, per split."""
    from ..kinds import kind_of
    from ..pack.backends import read_manifest
    from ..remote.urls import is_url

    if packing is not None and context is None:
        raise UsageError("--packing says how --context's rows are packed: give --context too")
    remote = is_url(pack)
    if remote:  # the manifest read from the store, every object looked up (sizes), none read
        from ..remote.packs import RemotePack, missing_objects

        rp = RemotePack(pack)
        m, what = rp.manifest, "objects, with their recorded sizes"
        pack = rp.shown
        checked, bad = missing_objects(rp)
    else:
        m = read_manifest(pack)
        what, checked, bad = missing_files(pack, m)
    kind = kind_of(m, pack)
    # a pack missing files says so first; its plan would fail on them
    rows = None if context is None or bad else packed(pack, m, kind, context, packing or STRATEGIES[0], remote)
    if as_json:
        click.echo(json.dumps(m if rows is None else {**m, "packed_rows": rows}, indent=1))
    else:
        describe(pack, m, skipped, kind)
        if rows is not None:
            describe_rows(rows)
        if not bad:
            click.echo(f"files:     {checked:,} {what}: all present" if checked > 1 else f"files:     one {what}: present")
    if bad:
        for line in bad:
            click.echo(f"BAD {line}", err=as_json)
        click.echo(f"FAILED: {pack}: {len(bad):,} of {checked:,} files missing or not as recorded", err=True)
        ctx.exit(1)


def packed(pack, m: dict[str, Any], kind, context: int, strategy: str, remote: bool) -> dict[str, Any]:
    """The JSON's `packed_rows`: the context, the strategy and each split's figures (the kind's `packed_rows`);
    a UsageError for a pack whose kind packs no rows, a DataprepError for a pack at a URL."""
    if remote:
        raise DataprepError(f"--context: {pack} is at a URL; the plan is made from a local pack's document offsets: "
                            "copy it first (dataprep convert URL --to npy --out DIR) and run info on DIR")
    splits = kind.packed_rows(pack, m, context, strategy)
    if splits is None:
        raise UsageError(f"--context: {pack} is a pack of {m['kind']}; rows of tokens are packed from a token pack's "
                         "documents (dataprep tokenize)")
    return {"context": context, "packing": strategy, "splits": splits}


def describe_rows(rows: dict[str, Any]) -> None:
    click.echo(f"packed:    rows of {rows['context']:,} tokens by {rows['packing']}, as PackedDocuments serves them "
               "(as many rows every epoch)")
    for name, r in rows["splits"].items():
        cut = r["documents_cut"]
        click.echo(f"  {name}: {r['documents']:,} documents in {r['rows']:,} rows, padding {100 * r['padding_share']:.3f} % "
                   f"({r['padding']:,} tokens), {cut:,} document{'s' * (cut != 1)} cut")


def describe(pack, m: dict[str, Any], skipped: bool, kind) -> None:
    src = m["source"]
    inputs = list(src.get("inputs", src.get("files", [])))
    click.echo(f"pack:      {pack}")
    click.echo(f"format:    {m['format']} v{m['format_version']} ({m['kind']}), dataprep {m.get('dataprep_version', '?')}")
    where = src["root"] if "root" in src else first_of(inputs, 2, "more input files")
    click.echo(f"created:   {m.get('created', '?')} from {src.get('layout', 'files')} {where}")
    st = m.get("storage", {"backend": "npy", "compression": "none"})
    click.echo(f"storage:   {st['backend']}" + (f", {st['compression']}" if st.get("compression", "none") != "none" else ""))
    for line in kind.summary(m):
        click.echo(line)
    click.echo("fields:")
    for key, f in kind.fields_of(m, pack).items():
        click.echo(f"  {key:12s} {f.describe()} ({', '.join(f.stored())})")
    classes = list(m.get("classes") or [])
    if classes:
        names = m.get("class_names") or []
        named = [f"{c} ({n})" if n and n != c else str(c) for c, n in zip(classes, [*names, *[None] * len(classes)])]
        click.echo(f"classes:   {len(classes)}: {first_of(named, 8)}")
    for name, sp in m["splits"].items():
        reasons = ", ".join(f"{n} {r}" for r, n in sp.get("skipped_by_reason", {}).items()) or "none"
        size = sp.get("bytes") or sum(f.get("bytes", 0) for s in sp["shards"] for f in s.get("files", {}).values())
        extra = "".join(f", {sp[k]:,} {k}" for k in ("tokens", "frames") if isinstance(sp.get(k), int))
        click.echo(f"split {name}: {sp['count']} samples{extra} in {len(sp['shards'])} shards, {size / 1e6:.1f} MB; skipped: {reasons}")
        if skipped:
            for r in sp.get("skipped", []):
                click.echo(f"    {r['source']}: {r['reason']}" + (f" ({r['detail']})" if r.get("detail") else ""))
