"""A PNG of a bench report, drawn with OpenCV (no plotting library needed): samples/s against
num_workers, one line per serving path at its best batch size, each path's limit dashed."""
from __future__ import annotations

from pathlib import Path

import numpy as np

COLORS = [(200, 80, 30), (40, 150, 40), (30, 60, 200), (150, 40, 150), (20, 140, 170)]


def plot(rep, out: str | Path) -> Path:
    import cv2

    W, H, L, R, T, B = 900, 560, 90, 30, 40, 70
    img = np.full((H, W, 3), 255, np.uint8)
    runs = rep.runs
    workers = sorted({r.workers for r in runs}) or [0]
    top = max([r.samples_s for r in runs] + [v["limit_samples_s"] for v in rep.verdicts.values()] + [1.0]) * 1.1

    def xy(w, v):
        x = L + (W - L - R) * (workers.index(w) / max(len(workers) - 1, 1))
        return int(x), int(H - B - (H - B - T) * v / top)

    cv2.line(img, (L, H - B), (W - R, H - B), (0, 0, 0), 1)
    cv2.line(img, (L, T), (L, H - B), (0, 0, 0), 1)
    for w in workers:
        x, _ = xy(w, 0)
        cv2.putText(img, str(w), (x - 5, H - B + 20), cv2.FONT_HERSHEY_SIMPLEX, 0.5, (0, 0, 0), 1)
    for k in range(5):
        v = top * k / 4
        _, y = xy(workers[0], v)
        cv2.putText(img, f"{v:,.0f}", (5, y + 5), cv2.FONT_HERSHEY_SIMPLEX, 0.45, (0, 0, 0), 1)
    cv2.putText(img, "num_workers", (W // 2 - 50, H - 25), cv2.FONT_HERSHEY_SIMPLEX, 0.55, (0, 0, 0), 1)
    cv2.putText(img, f"samples/s: {Path(rep.pack).name}", (L, 25), cv2.FONT_HERSHEY_SIMPLEX, 0.6, (0, 0, 0), 1)
    for i, path in enumerate(rep.paths):
        color = COLORS[i % len(COLORS)]
        best_batch = max((r for r in runs if r.path == path), key=lambda r: r.samples_s).batch
        pts = [xy(r.workers, r.samples_s) for r in sorted(runs, key=lambda r: r.workers) if r.path == path and r.batch == best_batch]
        for a, b in zip(pts, pts[1:]):
            cv2.line(img, a, b, color, 2)
        for p in pts:
            cv2.circle(img, p, 4, color, -1)
        lim = rep.verdicts[path]["limit_samples_s"]
        _, y = xy(workers[0], min(lim, top))
        for x in range(L, W - R, 16):
            cv2.line(img, (x, y), (min(x + 8, W - R), y), color, 1)
        cv2.putText(img, f"{path} (batch {best_batch}): {rep.verdicts[path]['bound']}", (L + 10, T + 20 + 20 * i),
                    cv2.FONT_HERSHEY_SIMPLEX, 0.5, color, 1)
    out = Path(out)
    if not cv2.imwrite(str(out), cv2.cvtColor(img, cv2.COLOR_RGB2BGR)):
        raise OSError(f"{out}: could not write the plot")
    return out
