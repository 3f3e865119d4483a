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
    from ..pack.manifest import read_manifest

    m = read_manifest(pack)
    if as_json:
        click.echo(json.dumps(m, indent=1))
        return
    key = "image" if "image" in m["fields"] else f"image@{max(m.get('resolutions', [0]))}"
    f = m["fields"].get(key)
    click.echo(f"pack:      {pack}")
    click.echo(f"format:    {m['format']} v{m['format_version']} ({m['kind']}), dataprep {m.get('dataprep_version', '?')}")
    click.echo(f"created:   {m.get('created', '?')} from {m['source'].get('layout', 'files')} "
               f"{m['source'].get('root', ', '.join(m['source'].get('inputs', m['source'].get('files', []))[:2]))}")
    st = m.get("storage", {"backend": "npy", "compression": "none"})
    click.echo(f"storage:   {st['backend']}" + (f", {st['compression']}" if st.get("compression", "none") != "none" else ""))
    s = m["settings"]
    if "image" in s:
        i = s["image"]
        click.echo(
            f"images:    {i['mode']} ({f['encoding']}, {f['layout']}), "
            f"size {', '.join(map(str, m.get('resolutions') or [i['size']]))} ({i['resize']}"
            f"{', upscale' if i['upscale'] else ''}), {'grayscale' if i['grayscale'] else 'color'}"
            + (f", JPEG q{i['quality']}" if i["mode"] == "encoded" else "")
        )
        shape = "x".join("?" if d is None else str(d) for d in f["shape"])
        label = m["fields"].get("label")
        click.echo(f"sample:    {shape} {f['dtype']}" + (f"; labels {label['dtype']}" if label else ""))
    vol = m["fields"].get("volume")
    if vol:
        v = s.get("volume", {})
        shape = "x".join("?" if d is None else str(d) for d in vol["shape"][:3]) if vol["layout"] == "fixed" else "each its own"
        click.echo(f"volumes:   {vol['dtype']}, shape {shape}" + (f" ({v.get('resample')})" if v.get("shape") else "")
                   + (f", window {v['window'][0]:g}..{v['window'][1]:g}" if v.get("window") else "")
                   + (f"; labels {m['fields']['label']['dtype']}" if "label" in m["fields"] else "; unlabelled"))
    vmask = m["fields"].get("volume_mask")
    if vmask:
        click.echo(f"labels:    label volumes {vmask['dtype']}, resampled nearest")
    mask = next((spec for k, spec in m["fields"].items() if k.split("@")[0] == "mask"), None)
    if mask:
        how = m.get("mask", {})
        click.echo(f"masks:     {mask['dtype']} ({how.get('chosen_by', '?')}), pad value {mask.get('pad_value')}, "
                   f"ignore {mask.get('ignore')}, classes {mask.get('num_classes') or 'not declared'}"
                   + (f", label map {how['labels']['name']}" if how.get("labels") else ""))
    tok = m.get("tokenizer")
    if tok:
        click.echo(f"tokens:    {m['fields']['tokens']['dtype']}, vocabulary {tok['vocab_size']:,}, end-of-text id {tok['eot_id']}")
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
