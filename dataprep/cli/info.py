"""`dataprep info PACK`: the manifest in a readable form (or as JSON)."""
from __future__ import annotations

import json

import click


@click.command()
@click.argument("pack", type=click.Path())
@click.option("--json", "as_json", is_flag=True, help="Print the manifest as JSON.")
@click.option("--skipped", is_flag=True, help="List every skipped source file with its reason.")
def info(pack, as_json, skipped):
    """Describe a pack: kind, format, settings, splits, classes, fields and skipped files."""
    from ..kinds import kind_of
    from ..pack.backends import read_manifest

    m = read_manifest(pack)
    if as_json:
        click.echo(json.dumps(m, indent=1))
        return
    click.echo(f"pack:      {pack}")
    click.echo(f"format:    {m['format']} v{m['format_version']} ({m['kind']}), dataprep {m.get('dataprep_version', '?')}")
    click.echo(f"created:   {m.get('created', '?')} from {m['source'].get('layout', 'files')} "
               f"{m['source'].get('root', ', '.join(m['source'].get('inputs', m['source'].get('files', []))[:2]))}")
    st = m.get("storage", {"backend": "npy", "compression": "none"})
    click.echo(f"storage:   {st['backend']}" + (f", {st['compression']}" if st.get("compression", "none") != "none" else ""))
    kind = kind_of(m, pack)
    for line in kind.summary(m):
        click.echo(line)
    click.echo("fields:")
    for key, f in kind.fields_of(m, pack).items():
        click.echo(f"  {key:12s} {f.describe()} ({', '.join(f.stored())})")
    classes = m.get("classes") or []
    if classes:
        click.echo(f"classes:   {len(classes)}: {', '.join(map(str, classes[:8]))}{' ...' if len(classes) > 8 else ''}")
    for name, sp in m["splits"].items():
        reasons = ", ".join(f"{n} {r}" for r, n in sp.get("skipped_by_reason", {}).items()) or "none"
        size = sp.get("bytes") or sum(f.get("bytes", 0) for s in sp["shards"] for f in s.get("files", {}).values())
        extra = f", {sp['tokens']:,} tokens" if "tokens" in sp else ""
        click.echo(f"split {name}: {sp['count']} samples{extra} in {len(sp['shards'])} shards, {size / 1e6:.1f} MB; skipped: {reasons}")
        if skipped:
            for r in sp.get("skipped", []):
                click.echo(f"    {r['source']}: {r['reason']}" + (f" ({r['detail']})" if r.get("detail") else ""))
