"""`dataprep bench`: takes a pack of any kind, gives how fast each way of serving it runs on this machine,
what limits it, and which setting to use.

It times the workload training runs (bench/workload.py): the Loader with the crop and flip the user
names. For every serving path that serves it differently (a JPEG pack's decode= values, the dataset's
default first: "fast" region-decodes RandomResizedCrop boxes, "accurate" decodes whole images; otherwise
one path that gathers stored samples into batches: decoded pixels, token windows, table rows), every
`num_workers` and batch size, the Loader runs for a bounded time after a warm-up, counting how its
crops were decoded. The same run measures this machine's limits for the pack: the dataset's own batch
fill on one core (a gather from the arrays it holds; for a JPEG pack under a crop plan, each path's
decode and crop), the machine's memory copy bandwidth, the single-core decode rate of each decoder on
this pack's whole images, and the file read bandwidth (a bound only when the pack is mapped,
cache="mmap"; a pack held in RAM is read once, at load).

A limit is an upper bound: a measured rate above one proves that limit was not this path's bound, so the
verdict names the tightest limit the measurements leave standing, and a rate is never more than 100% of
the bound it names.

The pieces live beside this module: bench/runs.py times one setting (`measure`, `Run`),
bench/machine_limits.py measures the limits (`limits`), bench/verdict.py weighs one against the other
(`verdict`, `overall_pick`). Their names are still served from here.
"""
from __future__ import annotations

import os
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

# the pieces' names: those used here, and the rest still importable from here, where they lived before
from .machine_limits import copy_bandwidth, decode_rate, fill_rate, is_plan, limits
from .runs import TICK, WINDOWS, Run, _cycle, cpu_seconds, decode_counts, measure, pss_bytes, sample_bytes, window_rates  # noqa: F401
from .verdict import NOISE, bounds, describe, overall_pick, reads_files, verdict  # noqa: F401


@dataclass
class Report:
    pack: str
    paths: list[str]
    runs: list[Run] = field(default_factory=list)
    limits: dict[str, float] = field(default_factory=dict)
    verdicts: dict[str, dict[str, Any]] = field(default_factory=dict)
    machine: dict[str, Any] = field(default_factory=dict)
    pick: dict[str, Any] = field(default_factory=dict)  # the overall pick and how sure it is (`overall_pick`)
    workload: dict[str, Any] = field(default_factory=dict)  # what every run served (Workload.to_dict, no decode)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "runs": [asdict(r) for r in self.runs]}


def gather_path(field) -> str:
    """The name of the path that gathers stored samples: decoded pixels, or whatever else a pack holds."""
    return "pixels" if getattr(field, "encoding", None) == "raw" else "gather"


def open_dataset(pack: Path, cache: str, options: dict[str, Any], decode: str | None = None):
    """The pack's dataset (its kind's class) with `options` (e.g. a token pack's context) and, for a
    decode path, `decode`; an option the class does not take is a DataprepError naming it."""
    import inspect

    from ..errors import DataprepError
    from ..kinds import kind_of
    from ..pack.backends import read_manifest

    cls = kind_of(read_manifest(pack), pack).dataset_class()
    takes = inspect.signature(cls).parameters
    kwargs = {"cache": cache, **options, **({"decode": decode} if decode else {})}
    if "progress" in takes:
        kwargs["progress"] = False
    wrong = sorted(k for k in kwargs if k not in takes)
    if wrong:
        raise DataprepError(f"{pack}: a {cls.__name__} takes no {', '.join(wrong)}")
    return cls(pack, **kwargs)


def run_bench(pack: str | os.PathLike, workers: list[int] | None = None, batches: list[int] | None = None,
              paths: list[str] | None = None, seconds: float = 2.0, warmup: float = 0.5, crop=None,
              cache: str = "ram", options: dict[str, Any] | None = None, flip: bool = False) -> Report:
    """Bench the workload training runs (the Loader with `crop` and `flip`) on every serving path of
    `pack` that serves it differently, or on those of `paths`.

    Args:
        pack: a pack of any kind.
        workers, batches: the num_workers values [default: 0 up to the cores] and batch sizes [64, 256].
        paths: a JPEG pack's decode= values (any of the registry's), or its one gather path [default: the
            dataset's default decode first, then each that serves this workload differently].
        seconds, warmup: timed and warm-up seconds per setting.
        crop: what Loader(crop=) takes: (H, W), dataprep.RandomResizedCrop or dataprep.CenterCrop [default:
            none; a variable-size image pack: a square of its median shorter side].
        cache: the dataset's cache mode.
        options: more dataset arguments (a token pack's `context`).
        flip: the Loader's random horizontal flip.

    Returns:
        The runs, limits, verdicts and the pick, each with the workload it was timed on.
    """
    import inspect

    from ..errors import DataprepError
    from ..images.codec import DECODERS
    from ..kinds import kind_of
    from ..pack.backends import read_manifest
    from ..serve.request import Request
    from .workload import Workload, image_settings, jpeg_paths

    pack = Path(pack)
    cores = os.cpu_count() or 1
    workers = workers if workers is not None else list(range(cores + 1))
    batches = batches or [64, 256]
    m = read_manifest(pack)
    kind = kind_of(m, pack)
    served = next(iter(kind.served_fields(m, None, pack).values()))
    if (crop is not None or flip) and not hasattr(served, "shapes_name"):
        raise DataprepError(f"{pack}: a {m['kind']!r} pack takes no --crop or --flip (they cut and flip images)")
    default = None
    if getattr(served, "encoding", None) == "jpeg":
        default = inspect.signature(kind.dataset_class()).parameters["decode"].default
        takes = [d for d in DECODERS if DECODERS[d] is not None]
        avail = jpeg_paths(default, Workload(crop).training_crops)
    else:
        takes = avail = [gather_path(served)]
    if paths and any(p not in takes for p in paths):
        raise DataprepError(f"{pack}: serving paths of this pack are {', '.join(takes)}, not {', '.join(p for p in paths if p not in takes)}")
    paths = paths or avail
    base = open_dataset(pack, cache, options or {}, paths[0] if paths[0] in DECODERS else None)
    picked = False
    if crop is None:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                base.batch_layout(Request())
        except DataprepError:
            if not hasattr(base, "shapes"):
                raise
            side = int(np.median(base.shapes[:, :2].min(axis=1)))  # images of many sizes: the Loader needs a crop
            crop, picked = (side, side), True
    resolution, resize = image_settings(m) if hasattr(served, "shapes_name") else (None, None)
    work = Workload(crop, flip, resolution, resize, picked, default)
    rep = Report(str(pack), paths, machine={"cores": cores, "load": os.getloadavg(), "cache": cache,
                                            "crop": work.to_dict(None)["crop"], "kind": m["kind"], "samples": len(base)},
                 workload={**work.to_dict(None), "text": work.describe(None)})
    rep.limits = limits(base, paths, max(batches), crop, pack, cores, flip)
    for path in paths:
        ds = base if path == paths[0] else open_dataset(pack, cache, options or {}, path)
        fill_key = f"fill_{path}_samples_s"
        if path in DECODERS and is_plan(crop):  # each path's decode and crop on one core: what a worker runs
            rep.limits[fill_key] = fill_rate(ds, max(batches), crop, flip=flip)
        runs = [measure(ds, path, w, b, seconds, warmup, crop, flip) for b in batches for w in workers]
        rep.runs += runs
        v = verdict(path, runs, rep.limits, cores, cache, work.loader_args())
        if v["notes"]:  # the Loader beat (or nearly beat) a limit: measure it again, now, and keep the higher
            # B023 (noqa below) does not apply: every lambda is called on the next line, in this iteration
            if fill_key in rep.limits:
                again = {fill_key: lambda: fill_rate(ds, max(batches), crop, flip=flip)}  # noqa: B023
            elif path in DECODERS:
                again = {f"decode_{path}_samples_s": lambda: decode_rate(ds, path)}  # noqa: B023
            else:
                again = {"gather_samples_s": lambda: fill_rate(ds, max(batches), crop, flip=flip),  # noqa: B023
                         "memory_mb_s": lambda: copy_bandwidth(cores)}
            rep.limits.update({k: max(rep.limits[k], f()) for k, f in again.items()})
            v = verdict(path, runs, rep.limits, cores, cache, work.loader_args())
        rep.verdicts[path] = v
    rep.machine["load_after"] = os.getloadavg()
    rep.pick = overall_pick(rep.runs, (*rep.machine["load"][:1], *rep.machine["load_after"][:1]), cores,
                            default if default in paths else None)
    if rep.pick:
        rep.pick["workload"] = work.to_dict(rep.pick["path"] if default is not None else None)
        rep.pick["for"] = work.describe(rep.pick["path"] if default is not None else None)
        rep.pick["loader"] = f"Loader(num_workers={rep.pick['workers']}, batch_size={rep.pick['batch']}{work.loader_args()})"
        if default is not None and default not in paths:
            rep.pick["why"] += f"; the default decode={default!r} was not timed (--paths), so the pick is not compared with it"
    return rep


def table(rep: Report) -> list[str]:
    """The report as the command prints it: the workload, one row per setting, how crops were decoded, the
    limits, each path's verdict and the pick with the workload it is for."""
    lines = [f"workload: {rep.workload['text']}"] if rep.workload.get("text") else []
    lines += [f"{'path':8s} {'workers':>7s} {'batch':>5s} {'samples/s':>10s} {'MB/s':>8s} {'CPU main':>8s} "
             f"{'CPU wkrs':>8s} {'PSS MB':>7s} {'waiting':>7s}"]
    for r in rep.runs:
        wk = sum(v for k, v in r.cpu.items() if k != "main")
        lines.append(f"{r.path:8s} {r.workers:7d} {r.batch:5d} {r.samples_s:10,.0f} {r.mb_s:8,.0f} {r.cpu['main']:8.2f} "
                     f"{wk:8.2f} {r.pss_bytes / 1e6:7,.0f} {r.wait_fraction:7.0%}")
    lim, cache = rep.limits, rep.machine.get("cache", "ram")
    have = []
    if "gather_samples_s" in lim:
        have.append(f"gather {lim['gather_samples_s']:,.0f} samples/s per core")
        have.append(f"memory bandwidth {lim['memory_mb_s']:,.0f} MB/s ({lim['sample_bytes']:,.0f} B a sample)")
    have += [f"{k[7:-10]} decode {v:,.0f}/s per core" for k, v in lim.items() if k.startswith("decode_")]
    have += [f"{k[5:-10]} decode and crop {v:,.0f}/s per core" for k, v in lim.items() if k.startswith("fill_")]
    if reads_files(lim, cache):
        have.append(f"read {lim['read_mb_s']:,.0f} MB/s")
    elif cache == "mmap":
        have.append(f"read {lim['read_mb_s']:,.0f} MB/s (not a bound: the mapped pack fits in the RAM available, "
                    "so its pages stay in the page cache after the first pass)")
    else:
        have.append(f"read {lim['read_mb_s']:,.0f} MB/s (not a bound: cache={cache!r} holds the pack in RAM, read once at load)")
    lines += decoded_lines(rep)
    lines.append("limits: " + "; ".join(have))
    for path, v in rep.verdicts.items():
        if v["bound"] == "unknown":
            lines.append(f"{path}: best {v['best_samples_s']:,.0f} samples/s, above every limit this run measured: unknown. "
                         f"Use {v['recommend']}")
        else:
            lines.append(f"{path}: best {v['best_samples_s']:,.0f} samples/s = {v['fraction_of_limit']:.0%} of its limit, "
                         f"{v['limit_what']} ({v['limit_samples_s']:,.0f}): {v['bound']}. Use {v['recommend']}")
        lines += [f"  {n}" for n in v.get("notes", [])]
    p = rep.pick
    if p:
        loader = p.get("loader", f"Loader(num_workers={p['workers']}, batch_size={p['batch']})")
        lines.append(f"pick: {p['path']} with {loader}, {p['samples_s']:,.0f} samples/s; {p['confidence']}: {p['why']}")
        if "for" in p:
            lines.append(f"  for {p['for']}: timed on this workload only (another crop, flip or decode serves at other "
                         "rates: rerun bench with yours)")
        if "default" in p:
            d = p["default"]
            lines.append(f"  the default decode={d['path']!r} served at most {d['samples_s']:,.0f} samples/s (workers="
                         f"{d['workers']}, batch {d['batch']}): the pick is {d['speedup']:.2f}x, beyond noise")
    return lines


def decoded_lines(rep: Report) -> list[str]:
    """How each path's crops were decoded, as shares over its runs (region: the fast decode of the restart
    segments around each box; fast: the whole image, fast; otherwise accurate, at the scale named)."""
    lines = []
    for path in rep.paths:
        counts: dict[str, int] = {}
        for r in (r for r in rep.runs if r.path == path):
            for k, v in r.decode_paths.items():
                counts[k] = counts.get(k, 0) + v
        total = sum(counts.values())
        if total:
            shares = ", ".join(f"{k} {v / total:.0%}" for k, v in sorted(counts.items(), key=lambda kv: -kv[1]))
            lines.append(f"  {path}: {shares}")
    return ["decoded (share of crops):", *lines] if lines else []
