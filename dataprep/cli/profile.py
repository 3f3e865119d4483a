"""`--profile FILE`: run a command under cProfile and write its statistics (read them with
`python -m pstats FILE`, then `sort cumtime` and `stats 20`)."""
from __future__ import annotations

import functools

import click


def profile_option(f):
    @click.option("--profile", "profile_to", type=click.Path(dir_okay=False), default=None,
                  help="Write a cProfile of this run to FILE (read it with: python -m pstats FILE).")
    @functools.wraps(f)
    def wrapper(*args, profile_to=None, **kwargs):
        if not profile_to:
            return f(*args, **kwargs)
        import cProfile

        prof = cProfile.Profile()
        try:
            return prof.runcall(f, *args, **kwargs)
        finally:
            prof.dump_stats(profile_to)
            click.echo(f"profile written to {profile_to} (python -m pstats {profile_to}; sort cumtime; stats 25)", err=True)

    return wrapper
