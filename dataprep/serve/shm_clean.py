"""Cleaning shared memory: takes this user's (or the opted-in group's) segment directory, gives it rid of
what no live process holds, segments nobody uses, half-filled temporaries a killed run left and stale lock
files, and what was done in counts (`Cleaned`: `dataprep cache clean`'s line). A segment whose fill lock is
held (being filled, or its last user leaving) is skipped; one with a holder of its users lock, or a
process mapping it, is kept unless `all_mine`. serve/shm.py keeps the segments; its lock files are
serve/shm_locks.py's.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from .shm import _mappers, _segment_path, list_segments
from .shm_locks import _drop_locks, _nobody_uses, _take_fill


@dataclass
class Cleaned:
    """What `clean` did: (path, bytes) of each segment removed, by kind; lock files removed; what it kept."""
    unused: list[tuple[str, int]] = field(default_factory=list)  # complete (or damaged) segments nobody used
    half: list[tuple[str, int]] = field(default_factory=list)  # half-filled temporaries no live process fills
    in_use: list[tuple[str, int]] = field(default_factory=list)  # removed though in use (`all_mine`)
    locks: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)  # in use, or being filled or left right now

    @property
    def removed(self) -> list[str]:
        return [p for p, _ in self.unused + self.half + self.in_use] + self.locks

    def summary(self) -> str:
        def mb(items):
            return f"{sum(b for _, b in items) / 1e6:,.1f} MB"

        out = (f"removed {len(self.unused)} unused segment(s) ({mb(self.unused)}), {len(self.half)} half-filled "
               f"segment(s) left by a killed run ({mb(self.half)}), ")
        if self.in_use:
            out += f"{len(self.in_use)} segment(s) in use ({mb(self.in_use)}), "
        return out + f"{len(self.locks)} stale lock file(s); kept {len(self.kept)} segment(s) in use"


def clean(all_mine: bool = False) -> Cleaned:
    """Remove this user's segments nobody uses (every one with `all_mine`: processes that map one keep their
    mapping), half-filled temporaries no process is filling, and lock files no process holds whose segment
    is gone. Nothing a live process holds is touched: a segment whose fill lock is held (being filled, or
    its last user leaving) is skipped, and one with a holder of its users lock, or a process mapping it, is
    kept (its lock files always, the segment too unless `all_mine`)."""
    done = Cleaned()
    d = _segment_path()
    if not d.is_dir():
        return done
    bases = sorted({n.split(".tmp-")[0].removesuffix(".fill").removesuffix(".users")
                    for n in os.listdir(d) if n.startswith("dataprep-")})
    mapped = _mappers(list_segments())
    for base in bases:
        path = d / base
        fill_was_there = os.path.lexists(d / f"{base}.fill")
        fill_fd = _take_fill(path, wait=False)
        if fill_fd is None:  # a live process is filling it or leaving it now
            done.kept += [str(p) for p in [path, *d.glob(base + ".tmp-*")] if os.path.lexists(p)]
            continue
        try:
            for tmp in sorted(d.glob(base + ".tmp-*")):  # its filler would hold the fill lock: it died
                done.half.append((str(tmp), _size(tmp)))
                tmp.unlink(missing_ok=True)
            users = _nobody_uses(path)
            try:
                if os.path.lexists(path):
                    in_use = users is None or bool(mapped.get(str(path)))
                    if in_use and not all_mine:
                        done.kept.append(str(path))
                    else:
                        (done.in_use if in_use else done.unused).append((str(path), _size(path)))
                        path.unlink(missing_ok=True)
                if users is not None and not os.path.lexists(path):
                    done.locks += [str(d / f"{base}{x}") for x in (".users", ".fill")
                                   if os.path.lexists(d / f"{base}{x}") and (x == ".users" or fill_was_there)]
                    _drop_locks(path)
            finally:
                if users is not None and users >= 0:
                    os.close(users)
        finally:
            os.close(fill_fd)
    return done


def _size(path: Path) -> int:
    try:
        return os.lstat(path).st_size
    except FileNotFoundError:
        return 0
