"""`dataprep cache list|clean`: this user's shared-memory segments (cache="shm") and their locks, and the
local copies dataprep stages on disk (a URL's copy for verify, convert or plan; a conversion's temporary)
that a killed run left behind."""
from __future__ import annotations

import click


@click.group()
def cache() -> None:
    """Show or remove this user's shared-memory segments (cache="shm") and staged copies a killed run left."""


def _state(item: dict) -> str:
    return f"in use by pid {item['pid']}" if item["alive"] else f"left by a killed run (pid {item['pid']})"


def _staged() -> tuple[list[dict], list[dict]]:
    from ..pack.convert import pending_temporaries
    from ..remote.cachedir import staged_copies

    return staged_copies(), pending_temporaries()


@cache.command("list")
def list_() -> None:
    """Every segment: size, the pack and split it holds, the processes mapping it; then every staged copy
    and conversion temporary: size, and whether its process lives."""
    from ..remote.cachedir import cache_root
    from ..serve.shm import describe_segments, segment_dir

    segs = describe_segments()
    click.echo(f"{segment_dir()}: {len(segs)} segment(s), {sum(s['bytes'] for s in segs) / 1e6:,.1f} MB")
    for s in segs:
        state = "complete" if s["complete"] else "being filled or left half-filled"
        users = f"used by pid {', '.join(map(str, s['users']))}" if s["users"] else "unused"
        click.echo(f"  {s['path']}  {s['bytes'] / 1e6:,.1f} MB  {s['pack']} [{s['split']}]  {state}, {users}")
    copies, temps = _staged()
    staged = copies + temps
    click.echo(f"{cache_root(create=False)}: {len(staged)} staged cop(ies) and conversion temporar(ies), "
               f"{sum(c['bytes'] for c in staged) / 1e6:,.1f} MB")
    for c in copies:
        click.echo(f"  {c['path']}  {c['bytes'] / 1e6:,.1f} MB  a URL's {c['kind']} copy, {_state(c)}")
    for t in temps:
        click.echo(f"  {t['path']}  {t['bytes'] / 1e6:,.1f} MB  a conversion's temporary, {_state(t)}")


@cache.command()
@click.option("--all-mine", is_flag=True, help="Also remove segments in use (their processes keep what they mapped).")
@click.option("-v", "--verbose", is_flag=True, help="Also list each file removed or kept.")
def clean(all_mine: bool, verbose: bool) -> None:
    """Remove unused segments, abandoned half-filled ones, and lock files whose segment is gone; and the staged
    copies and conversion temporaries killed runs left. Never what a live process is filling, writing or
    (without --all-mine) using. Prints a summary."""
    from ..pack.convert import clean_temporaries
    from ..remote.cachedir import clean_staged
    from ..serve.shm_clean import clean as run

    done = run(all_mine)
    copies, kept_copies = clean_staged()
    temps, kept_temps = clean_temporaries()
    if verbose:
        for p in done.removed:
            click.echo(f"removed {p}")
        for p, _ in copies + temps:
            click.echo(f"removed {p}")
        for p in done.kept:
            click.echo(f"kept {p} (in use)")
        for p in kept_copies + kept_temps:
            click.echo(f"kept {p} (its process lives)")
    click.echo(done.summary())
    gone = copies + temps
    if gone or kept_copies or kept_temps:
        click.echo(f"removed {len(gone)} staged cop(ies) and conversion temporar(ies) left by killed runs "
                   f"({sum(b for _, b in gone) / 1e6:,.1f} MB); kept {len(kept_copies) + len(kept_temps)} whose process lives")
