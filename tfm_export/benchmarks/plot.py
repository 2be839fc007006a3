#!/usr/bin/env python3
"""One PNG from `make bench`'s JSON reports: tokens/s of every backend in every cell (median of the rounds), one
panel per model, dated and labelled with the machine the reports record. Draws what was measured; measures nothing.

    python -m tfm_export.benchmarks.plot --output docs/benchmarks.png \
        demo=build/bench/demo.json base=build/bench/base.json
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

TITLES = {"demo": "demo model (d_model 128, 3+3 layers, vocab 88)",
          "base": "base config (d_model 512, 6+6 layers, vocab 32,000)"}
# ours dark, CTranslate2's light, one hue per precision (the C++ example its own); a setting of one hatched
COLORS = {"ort-fp32": "#1f77b4", "ct2-fp32": "#aec7e8", "ort-int8-dynamic": "#2ca02c", "ct2-int8": "#98df8a",
          "cpp": "#9467bd"}


def medians(report: dict) -> tuple[list[str], dict[str, list[float]]]:
    """The cells in the report's order, and per backend its median tokens/s over the rounds in each cell."""
    names = list(report["rounds"][0]["results"])
    cells = list(report["rounds"][0]["results"][names[0]]["cells"])
    rates = {name: [statistics.median(r["results"][name]["cells"][cell]["tokens_per_s"] for r in report["rounds"])
                    for cell in cells] for name in names}
    return cells, rates


def label(cell: str) -> str:
    """'len 64, beam 4, batch 8' -> '64 tok\\nbeam 4\\nx8'."""
    parts = dict(part.split(" ") for part in cell.split(", "))
    return f"{parts['len']} tok\n{'greedy' if parts['beam'] == '1' else 'beam ' + parts['beam']}\nx{parts['batch']}"


def plot(reports: dict[str, dict], output: Path) -> None:
    fig, axes = plt.subplots(len(reports), 1, figsize=(13, 4.2 * len(reports)), squeeze=False)
    for ax, (name, report) in zip(axes[:, 0], reports.items(), strict=True):
        cells, rates = medians(report)
        width = 0.8 / len(rates)
        for i, (backend, values) in enumerate(rates.items()):
            ax.bar([c + (i - (len(rates) - 1) / 2) * width for c in range(len(cells))], values, width, label=backend,
                   color=COLORS.get(backend.split("+")[0]), hatch="//" if "+" in backend else None)  # a setting
        ax.set_xticks(range(len(cells)), [label(c) for c in cells], fontsize=8)
        ax.set_yscale("log")
        ax.set_ylim(top=max(max(v) for v in rates.values()) * 4)  # room for the legend above the bars
        ax.set_ylabel("generated tokens/s")
        ax.set_title(TITLES.get(name, name), fontsize=10)
        ax.legend(fontsize=8, ncol=len(rates), loc="upper left")
        ax.grid(axis="y", alpha=0.3)
    machine = next(iter(reports.values()))["machine"]
    fig.suptitle(f"make bench, {machine['date']}: {machine['cpu']}, {machine['cores']} cores "
                 f"(median of {len(next(iter(reports.values()))['rounds'])} interleaved rounds)", fontsize=11)
    fig.tight_layout()
    fig.savefig(output, dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, required=True)
    parser.add_argument("reports", nargs="+", help="NAME=REPORT.json, as `make bench` writes them")
    args = parser.parse_args()
    reports = {name: json.loads(Path(path).read_text(encoding="utf-8"))
               for name, path in (arg.split("=", 1) for arg in args.reports)}
    plot(reports, args.output)


if __name__ == "__main__":
    main()
