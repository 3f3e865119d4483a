"""`dataprep tokenize SRC... --tokenizer tokenizer.json --out DIR`: text becomes token packs once."""
from __future__ import annotations

import os

import click

from ..tokens.read import SPLITS
from .engine import engine_for, engine_options
from .profile import profile_option
from .progress import progress_option, shown
from .storage import staged_output, storage_options


@click.command()
@click.argument("src", nargs=-1, required=True)
@click.option("--out", "-o", required=True, type=click.Path(), help="Pack to create: a directory (npy, zarr) or an .h5 file (hdf5).")
@click.option("--tokenizer", type=click.Path(dir_okay=False), default=None, help="A Hugging Face tokenizers JSON file.")
@click.option("--train-bpe", "train_bpe", type=click.IntRange(256), default=None, help="Train a byte-level BPE of this vocabulary size first.")
@click.option("--split-docs", type=click.Choice(SPLITS), default="file", show_default=True,
              help="Plain text: a document per file, per line, or per blank-line-separated paragraph.")
@click.option("--text-field", default="text", show_default=True, help="The text field of .jsonl, or column of CSV/Parquet.")
@click.option("--eot", default=None, help="End-of-text token [default: <|endoftext|>, </s> or [SEP], whichever exists].")
@click.option("--eot-id", type=click.IntRange(0), default=None, help="End-of-text id (instead of --eot).")
@click.option("--val-fraction", type=click.FloatRange(0, 1, max_open=True), default=0.0, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--chunk-mb", type=click.IntRange(1), default=8, show_default=True, help="Text encoded per batch (bounds memory).")
@click.option("--strict", is_flag=True, help="Fail on bytes that are not UTF-8 instead of replacing and counting them.")
@click.option("--overwrite", is_flag=True, help="Replace a pack or unfinished run already in --out.")
@click.option("--resume", is_flag=True,
              help="Continue an interrupted run: tasks finished with the same inputs and settings, and intact by checksum, "
                   "are kept; the rest are tokenized.")
@click.option("--workers", "-j", type=click.IntRange(1), default=1, show_default=True,
              help="Processes for the local engine (the tokenizer already uses every core), or the local Dask cluster's size.")
@click.option("--task-mb", type=click.IntRange(1), default=64, show_default=True,
              help="Consecutive input files are grouped into tasks of about this much text (the unit of parallelism).")
@progress_option
@profile_option
@engine_options
@storage_options
def tokenize(src, out, tokenizer, train_bpe, split_docs, text_field, eot, eot_id, val_fraction, seed, chunk_mb, strict, overwrite,
             resume, workers, task_mb, progress, engine, address, scheduler_file, fmt, compress):
    """Tokenize text into uint16/uint32 token arrays with a document index."""
    from ..tokens.read import expand
    from ..tokens.tokenize import TokenizeSettings, tokenize as run

    settings = TokenizeSettings(split=split_docs, text_field=text_field, eot=eot, eot_id=eot_id, val_fraction=val_fraction,
                                seed=seed, chunk_bytes=chunk_mb << 20, task_bytes=task_mb << 20, strict=strict)
    from ..progress import Progress
    from ..remote.urls import redact

    files = expand(list(src))
    show = shown(progress)
    with engine_for(engine, workers, address, scheduler_file) as eng, \
            staged_output(out, fmt, compress, overwrite, eng, resume, progress=show) as target:
        with Progress(f"tokenize {redact(str(out))}", sum(os.path.getsize(f) for f in files), "bytes", show=show) as bar:
            try:
                r = run(files, target, settings, tokenizer, train_bpe, overwrite, progress=bar, engine=eng, resume=resume)
            except KeyboardInterrupt:
                bar.close(failed=True)
                click.echo(f"interrupted: finished shards kept in {target}; run the same command with --resume to continue", err=True)
                click.get_current_context().exit(130)

    click.echo(f"pack: {redact(str(out))}")
    for name, (docs, toks) in r["splits"].items():
        click.echo(f"  {name}: {docs:,} documents, {toks:,} tokens ({r['dtype']})")
    if r.get("reused"):
        click.echo(f"  resumed: {r['reused']} of {r['tasks']} tasks were finished and intact, {r['tasks'] - r['reused']} tokenized")
    if r["replaced"]:
        click.echo("  bytes that were not UTF-8, replaced: " + ", ".join(f"{k}: {v}" for k, v in r["replaced"].items()))
    click.echo(f"  {r['tokens']:,} tokens from {len(files)} files in {r['seconds']:.1f} s ({r['tokens'] / max(r['seconds'], 1e-9):,.0f} tokens/s)")
