"""`dataprep cache list|clean`: this user's shared-memory segments (cache="shm") and their locks."""
from __future__ import annotations

import click


@click.group()
def cache() -> None:
    """Show or remove this user's shared-memory segments (cache="shm")."""


@cache.command("list")
def list_() -> None:
    """Every segment: size, the pack and split it holds, the processes mapping it."""
    from ..serve.shm import describe_segments, segment_dir

    segs = describe_segments()
    click.echo(f"{segment_dir()}: {len(segs)} segment(s), {sum(s['bytes'] for s in segs) / 1e6:,.1f} MB")
    for s in segs:
        state = "complete" if s["complete"] else "being filled or left half-filled"
        users = f"used by pid {', '.join(map(str, s['users']))}" if s["users"] else "unused"
        click.echo(f"  {s['path']}  {s['bytes'] / 1e6:,.1f} MB  {s['pack']} [{s['split']}]  {state}, {users}")


@cache.command()
@click.option("--all-mine", is_flag=True, help="Also remove segments in use (their processes keep what they mapped).")
@click.option("-v", "--verbose", is_flag=True, help="Also list each file removed or kept.")
def clean(all_mine: bool, verbose: bool) -> None:
    """Remove unused segments, abandoned half-filled ones, and lock files whose segment is gone; never what a
    live process is filling or (without --all-mine) using. Prints a summary."""
    from ..serve.shm import clean as run

    done = run(all_mine)
    if verbose:
        for p in done.removed:
            click.echo(f"removed {p}")
        for p in done.kept:
            click.echo(f"kept {p} (in use)")
    click.echo(done.summary())
