"""`dataprep tokenize SRC... --tokenizer tokenizer.json --out DIR`: text becomes token packs once; the
work is dataprep.build.tokenize's (also `dataprep.tokenize`), whose TOKENIZE_OPTIONS give the defaults."""
from __future__ import annotations

import click

from ..build import TOKENIZE_OPTIONS as T
from ..tokens.read import SPLITS
from .engine import engine_options
from .numbers import Finite, Ranged
from .profile import profile_option
from .progress import progress_option
from .storage import storage_options


@click.command()
@click.argument("src", nargs=-1, required=True)
@click.option("--out", "-o", required=True, type=click.Path(), help="Pack to create: a directory (npy, zarr) or an .h5 file (hdf5).")
@click.option("--tokenizer", type=click.Path(dir_okay=False), default=None, help="A Hugging Face tokenizers JSON file.")
@click.option("--train-bpe", "train_bpe", type=Ranged("train_bpe"), default=None, help="Train a byte-level BPE of this vocabulary size first.")
@click.option("--split-docs", type=click.Choice(SPLITS), default=T["split_docs"], show_default=True,
              help="Plain text: a document per file, per line, or per blank-line-separated paragraph.")
@click.option("--text-field", default=T["text_field"], show_default=True, help="The text field of .jsonl, or column of CSV/Parquet.")
@click.option("--eot", default=None, help="End-of-text token [default: <|endoftext|>, </s> or [SEP], whichever exists].")
@click.option("--eot-id", type=Ranged("eot_id"), default=None, help="End-of-text id (instead of --eot).")
@click.option("--val-fraction", type=Finite(0, 1, below=True), default=T["val_fraction"], show_default=True,
              help="Documents drawn for val, each by a hash of --seed and its text (copies of a text share a split).")
@click.option("--seed", type=Ranged("seed"), default=T["seed"], show_default=True)
@click.option("--chunk-mb", type=Ranged("chunk_mb"), default=T["chunk_mb"], show_default=True,
              help="Text encoded per batch (bounds memory; never changes the pack's data or split).")
@click.option("--strict", is_flag=True, help="Fail on bytes that are not UTF-8 instead of replacing and counting them.")
@click.option("--overwrite", is_flag=True, help="Replace a pack or unfinished run already in --out.")
@click.option("--resume", is_flag=True,
              help="Continue an interrupted run: tasks, and units of about 8 MiB of text within a task, finished with the "
                   "same inputs and settings and intact by checksum, are kept; the rest are tokenized.")
@click.option("--workers", "-j", type=Ranged("workers"), default=T["workers"], show_default=True,
              help="Processes for the local engine (the tokenizer already uses every core), or the local Dask cluster's size.")
@click.option("--task-mb", type=Ranged("task_mb"), default=T["task_mb"], show_default=True,
              help="Consecutive input files are grouped into tasks of about this much text (the unit of parallelism; "
                   "never changes the pack's data or split).")
@progress_option
@profile_option
@engine_options
@storage_options
def tokenize(src, out, tokenizer, train_bpe, split_docs, text_field, eot, eot_id, val_fraction, seed, chunk_mb, strict, overwrite,
             resume, workers, task_mb, progress, engine, address, scheduler_file, fmt, compress):
    """Tokenize text into uint16/uint32 token arrays with a document index."""
    from .. import build as front
    from .build import run_front_door

    run_front_door(front.tokenize, src, out, tokenizer=tokenizer, train_bpe=train_bpe, split_docs=split_docs,
                   text_field=text_field, eot=eot, eot_id=eot_id, val_fraction=val_fraction, seed=seed, chunk_mb=chunk_mb,
                   strict=strict, overwrite=overwrite, resume=resume, workers=workers, task_mb=task_mb, progress=progress,
                   engine=engine, address=address, scheduler_file=scheduler_file, fmt=fmt, compress=compress)
