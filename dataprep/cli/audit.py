"""`dataprep audit PACK`: exact and near duplicates within and across the splits of an image pack, leaks
(val or test samples with a near twin in train) first; exit 0 when nothing is shared across splits, 1 when
something is, 2 for a usage error or a pack that cannot be read."""
from __future__ import annotations

import json
from pathlib import Path

import click

from ..audit.index import MAX_DISTANCE
from ..audit.panels import MAX_PANELS, PANELS
from ..audit.report import DEFAULT_MAX_DISTANCE
from .progress import progress_option, shown

UNREADABLE = 2  # as a usage error: the command could not do what was asked


@click.command()
@click.argument("pack", type=click.Path())
@click.option("--json", "as_json", is_flag=True,
              help='Print only JSON on stdout: {"pairs": [{"a": {"split", "index", "source"}, "b": {...}, "distance", "exact", '
                   '"group"[, "flip": true for a mirror pair, with --flips]}, ...], "shown": [the pairs the sheet and text '
                   'show], "summary": {...}}; progress and notes go to stderr.')
@click.option("--max-distance", type=click.IntRange(0, MAX_DISTANCE), default=DEFAULT_MAX_DISTANCE, show_default=True,
              help="Most bits two hashes may differ by to be a pair (distances are even: 11 finds what 10 does).")
@click.option("--flips", is_flag=True, help="Also pair images with each other's mirror image (decodes every image once).")
@click.option("--sheet", type=click.Path(dir_okay=False), default=None,
              help="Draw the pairs shown (see --panels) side by side into this PNG.")
@click.option("--panels", type=click.IntRange(1, MAX_PANELS), default=PANELS, show_default=True,
              help="Pairs the sheet and the text show: each leaking sample's closest twin in train first, then one pair "
                   "a group of near copies in turn. The JSON lists them in \"shown\"; summary.shown counts what is left off.")
@progress_option
@click.pass_context
def audit(ctx, pack, as_json, max_distance, flips, sheet, panels, progress):
    """Find exact and near duplicates in PACK (any backend, or a URL) within each split and across splits, from
    the perceptual hashes its build stored (a pack built without them is hashed on the fly, with a note).
    Val and test samples with a near twin in train are called out first; every pair within the distance is
    listed (a group of k copies gives all k(k-1)/2 pairs)."""
    from ..audit.pack import PackSamples, audit_arrays, hash_note, opened
    from ..audit.printout import text_report
    from ..audit.report import audit as run_audit
    from ..progress import reporter

    def needs(m):  # what of a pack at a URL is fetched: the stored hashes alone when they serve
        return audit_arrays(m, decode=bool(flips or sheet))

    from ..errors import DataprepError

    if sheet:  # before the audit, not after it: the sheet's folder must be there, its name free or a file of ours
        from ..safe_paths import check_file

        where = Path(sheet).expanduser().resolve().parent
        if not where.is_dir():
            click.echo(f"Error: cannot write the contact sheet {sheet}: no folder {where}", err=True)
            ctx.exit(UNREADABLE)
        try:
            check_file(Path(sheet).expanduser(), "contact sheet")
        except DataprepError as e:
            click.echo(f"Error: cannot write the contact sheet: {e}", err=True)
            ctx.exit(UNREADABLE)
    try:
        with opened(pack, needs, progress=shown(progress)) as (local, name), _open(PackSamples, local, name) as ps:
            note = hash_note(ps, flips)
            if note:
                click.echo(note, err=True)
            with reporter(shown(progress), f"audit {name}", ps.count(), "images", default=None) as bar:
                samples = ps.samples(flips, bar)
            report = run_audit(samples, max_distance, flips, panels=panels)
            report["summary"]["pack"] = name
            report["summary"]["hashed_on_the_fly"] = not ps.stored
            if sheet:
                lay = _sheet(ps, report["shown"], sheet)
                click.echo(f"sheet: {sheet} ({len(lay.boxes)} pairs drawn, {lay.width}x{lay.height} px)", err=True)
    except SheetError as e:
        click.echo(f"Error: {e}", err=True)
        ctx.exit(UNREADABLE)
    except (click.exceptions.Exit, click.exceptions.Abort, click.ClickException):
        raise
    except Exception as e:  # noqa: BLE001 - a pack that is not one, a damaged shard, or anything else: never exit 1 (= leaks)
        why = " ".join((str(e) or type(e).__name__).split())
        if not isinstance(e, (DataprepError, OSError)):
            why = f"{type(e).__name__}: {why}"
        click.echo(f"Error: cannot audit {why if str(pack) in why else f'{pack}: {why}'}", err=True)
        ctx.exit(UNREADABLE)
    if as_json:
        click.echo(json.dumps(report))
    else:
        click.echo(text_report(report))
    if any(lk["with_twin_in_any_other_split"] for lk in report["summary"]["leaks"].values()):  # mirror pairs too
        ctx.exit(1)


def _open(cls, local, name):
    """The pack opened for its audit; a manifest whose structure is not the format's is a PackError."""
    from ..errors import PackError
    from ..kinds import kind_of

    try:
        return cls(local, lambda m, where: kind_of(m, where).fields_of(m, where), name)
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        if isinstance(e, PackError):
            raise
        raise PackError(f"{name}: malformed manifest ({type(e).__name__}: {e})") from None


class SheetError(Exception):
    """The contact sheet could not be written (the audit itself went well)."""


def _sheet(ps, shown, path):
    """The contact sheet of the pairs shown, every image it shows read with one read of its shard."""
    from ..audit.sheet import contact_sheet

    stored = ps.stored_images([(p[side]["split"], int(p[side]["index"])) for p in shown for side in ("a", "b")])

    def load(side):
        key = (side["split"], int(side["index"]))
        return ps.decode(stored[key], f"{key[0]} sample {key[1]}")

    from ..errors import DataprepError

    try:
        return contact_sheet(shown, load, Path(path).expanduser(), max_pairs=len(shown))
    except DataprepError as e:  # safe_paths: what the name holds now is not ours to replace
        raise SheetError(f"cannot write the contact sheet: {e}") from None
    except OSError as e:
        raise SheetError(f"cannot write the contact sheet {path}: {e.strerror or e}") from None
