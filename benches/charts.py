#!/usr/bin/env python3
"""Draws one chart per benchmark path from the benchmarks' own output, for docs/benchmarks.md.

Each file `benches/results/<path>.md` holds what a benchmark script printed (its markdown
tables), under a first line saying when, on what and from which script it was measured. Every
table row whose first cell is the comparison and whose next cell starts with a ratio ("0.37x")
becomes a bar; a `target` column (`<= 1.5x`, `>= 0.8x`) becomes a tick on that bar, and the
bar is green where the target is met, red where it is missed, grey where there is none. The
charts go to `docs/img/bench-<path>.png`.

`.venv/bin/python benches/charts.py` (matplotlib, in the `bench` extra).
"""

import pathlib
import re
import textwrap

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benches" / "results"
OUT = ROOT / "docs" / "img"
RATIO = re.compile(r"^\s*(\d+(?:\.\d+)?)x")
TARGET = re.compile(r"([<>]=?)\s*(\d+(?:\.\d+)?)x")


def rows(text: str) -> list[tuple[str, float, tuple[str, float] | None]]:
    """(what, ratio, target) of every table row with a ratio in its second cell."""
    found = []
    header: list[str] = []
    for line in text.splitlines():
        if not line.startswith("|"):
            header = []
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not header:
            header = [c.lower() for c in cells]
            continue
        if set(cells[0]) <= {"-", ":", " "}:
            continue
        m = RATIO.match(cells[1]) if len(cells) > 1 else None
        if not m:
            continue
        target = None
        if "target" in header:
            t = TARGET.search(cells[header.index("target")])
            target = (t.group(1), float(t.group(2))) if t else None
        found.append((cells[0].replace("`", ""), float(m.group(1)), target))
    return found


def met(ratio: float, target: tuple[str, float] | None) -> str:
    if target is None:
        return "#9e9e9e"
    op, bound = target
    ok = ratio <= bound if op.startswith("<") else ratio >= bound
    return "#2e7d32" if ok else "#c62828"


def draw(path: pathlib.Path) -> pathlib.Path:
    text = path.read_text()
    title = text.splitlines()[0].lstrip("# ").strip()
    data = rows(text)
    if not data:
        raise SystemExit(f"{path}: no table row with a ratio")
    labels = [textwrap.fill(w, 58) for w, _, _ in data]
    height = 0.2 + sum(0.22 * (lab.count("\n") + 1) + 0.12 for lab in labels)
    fig, ax = plt.subplots(figsize=(10, max(2.0, height)))
    ys = range(len(data))[::-1]
    ratios = [r for _, r, _ in data]
    ax.barh(list(ys), ratios, color=[met(r, t) for _, r, t in data], height=0.6)
    for y, (_, r, t) in zip(ys, data):
        ax.text(r, y, f" {r:g}x", va="center", fontsize=8)
        if t is not None:
            ax.plot([t[1], t[1]], [y - 0.4, y + 0.4], color="black", linewidth=1.5)
    ax.axvline(1.0, color="#555555", linewidth=0.8, linestyle="--")
    ax.set_yticks(list(ys), labels, fontsize=7)
    ax.set_xscale("log")
    ax.set_xlabel("ratio (log scale; the dashed line is 1x, black ticks are targets)", fontsize=8)
    fig.suptitle(textwrap.fill(title, 110), fontsize=9)
    fig.tight_layout()
    OUT.mkdir(parents=True, exist_ok=True)
    out = OUT / f"bench-{path.stem}.png"
    fig.savefig(out, dpi=90, bbox_inches="tight", pad_inches=0.1)  # no label cut off
    plt.close(fig)
    return out


def main() -> None:
    for path in sorted(RESULTS.glob("*.md")):
        print(draw(path).relative_to(ROOT))


if __name__ == "__main__":
    main()
