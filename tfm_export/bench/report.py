"""Benchmark results as a terminal table, JSON with machine info, and a PNG plot."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..core.files import write_atomically, write_text_atomically
from .protocol import BackendResult, BenchSettings
from .runners import TIMED_BACKENDS


def table(results: list[BackendResult]) -> list[str]:
    lines = [f"{'backend':17} {'decode':7} {'batch':>5} {'median ms':>10} {'p95 ms':>9} {'sent/s':>8} {'tok/s':>9}"]
    for r in results:
        if r.skipped:
            lines.append(f"{r.name:17} skipped: {r.skipped}")
            continue
        for row in r.rows:
            s, decode = row.summary, "greedy" if row.beam == 1 else f"beam {row.beam}"
            lines.append(f"{r.name:17} {decode:7} {row.batch:>5} {s['median_ms']:10.1f} {s['p95_ms']:9.1f} "
                         f"{s['sentences_per_s']:8.2f} {s['tokens_per_s']:9.1f}")
    return lines


def summary(results: list[BackendResult], sizes: dict[str, float], build_s: dict[str, float]) -> list[str]:
    lines = [f"{'backend':17} {'load s':>7} {'peak RSS MB':>11} {'same output as ort-fp32':>24}"]
    for r in results:
        if not r.skipped:
            same = "-" if r.agreement is None else f"{100 * r.agreement:.1f}%"
            lines.append(f"{r.name:17} {r.load_s:7.2f} {r.peak_rss_mb:11.0f} {same:>24}")
    lines.append("artifacts: " + ", ".join(f"{k} {v:.1f} MB" + (f" (made in {build_s[k]:.1f} s)" if k in build_s
                                                                 else "") for k, v in sizes.items()))
    return lines


def markdown(results: list[BackendResult], sizes: dict[str, float], build_s: dict[str, float],
             found: dict[str, float | None], info: dict[str, Any]) -> str:
    """The same figures as markdown tables, for docs/benchmarks.md."""
    machine = info["machine"]
    versions = ", ".join(f"{k} {v}" for k, v in machine["versions"].items() if v)
    gpu = f", GPU {machine['gpu']}" if machine.get("gpu") else ""
    lines = [f"Machine: {machine['cpu']}, {machine['cores']} cores{gpu}; {versions}; {machine['date']}.",
             f"Inputs: {info['sentences']} sentences ({info['input']}), output length {info['output_length']}"
             + (" (forced: </s> barred until then)." if info["forced"] else " at most (stops at </s>)."),
             *([f"Decoder step placement: {info['placement']}."] if info.get("placement") else []), "",
             "| backend | decode | batch | median ms | p95 ms | sentences/s | tokens/s |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for r in results:
        if r.skipped:
            lines.append(f"| {r.name} | skipped: {r.skipped} | | | | | |")
        for row in r.rows:
            s, decode = row.summary, "greedy" if row.beam == 1 else f"beam {row.beam}"
            lines.append(f"| {r.name} | {decode} | {row.batch} | {s['median_ms']:.1f} | {s['p95_ms']:.1f} | "
                         f"{s['sentences_per_s']:.2f} | {s['tokens_per_s']:.1f} |")
    lines += ["", "| backend | load s | peak RSS MB | same greedy output as ort-fp32 |", "|---|---:|---:|---:|"]
    lines += [f"| {r.name} | {r.load_s:.2f} | {r.peak_rss_mb:.0f} | "
              + ("-" if r.agreement is None else f"{100 * r.agreement:.1f}%") + " |" for r in results if not r.skipped]
    lines += ["", "| artifact | size MB | made in s |", "|---|---:|---:|"]
    lines += [f"| {k} | {v:.1f} | " + (f"{build_s[k]:.1f}" if k in build_s else "-") + " |" for k, v in sizes.items()]
    lines += ["", "| ratio (tokens/s, greedy) | value |", "|---|---:|"]
    lines += [f"| {k} | " + ("-" if v is None else f"{v:.2f}x") + " |" for k, v in found.items()]
    sweep = [r for r in results if r.sweep]
    if sweep:
        lengths = sorted({n for r in sweep for n in r.sweep})
        lines += ["", "| batch 1 greedy, ms per sentence | " + " | ".join(f"{n} tokens" for n in lengths) + " |",
                  "|---|" + "---:|" * len(lengths)]
        lines += [f"| {r.name} | " + " | ".join(f"{r.sweep[n]:.0f}" if n in r.sweep else "-" for n in lengths) + " |"
                  for r in sweep]
    floors = info.get("step_floor_ms", {})
    if floors:
        lines += ["", "| decoder_step_search alone on the GPU (bench.step_floor) | ms per step |", "|---|---:|"]
        lines += [f"| {cell} | {ms:.3f} |" for cell, ms in floors.items()]
    return "\n".join(lines) + "\n"


def to_json(path: Path, results: list[BackendResult], settings: BenchSettings, extra: dict[str, Any]) -> None:
    data = {**extra, "settings": {k: list(v) if isinstance(v, tuple) else v for k, v in vars(settings).items()},
            "backends": {r.name: {"description": TIMED_BACKENDS[r.name], **r.to_json()} for r in results}}
    write_text_atomically(path, json.dumps(data, indent=2) + "\n", "the benchmark JSON")


def plot(path: Path, results: list[BackendResult], title: str) -> None:
    """Left: greedy tokens/s per backend and batch size. Right: batch-1 latency against output length."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    ran = [r for r in results if not r.skipped]
    fig, (bars, lines) = plt.subplots(1, 2, figsize=(13, 4.8))
    sizes = sorted({row.batch for r in ran for row in r.rows})
    width = 0.8 / max(1, len(ran))
    for i, r in enumerate(ran):
        rates = {row.batch: row.summary["tokens_per_s"] for row in r.rows if row.beam == 1}
        bars.bar([j + i * width for j in range(len(sizes))], [rates.get(b, 0) for b in sizes], width, label=r.name,
                 color=_color(r.name))
    bars.set_xticks([j + 0.4 - width / 2 for j in range(len(sizes))], [f"batch {b}" for b in sizes])
    bars.set_ylabel("generated tokens/s (greedy)")
    bars.set_yscale("log")
    bars.legend(fontsize=7)
    for r in ran:
        if r.sweep:
            lengths = sorted(r.sweep)
            lines.plot(lengths, [r.sweep[n] for n in lengths], marker="o", label=r.name, color=_color(r.name))
    lines.set_xlabel("output length (tokens, forced)")
    lines.set_ylabel("latency per sentence, ms (batch 1, greedy)")
    lines.set_xscale("log", base=2)
    lines.set_yscale("log")
    lines.legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    write_atomically({path: lambda tmp: fig.savefig(tmp, dpi=100, format="png")}, "the plot")
    plt.close(fig)


def _color(name: str) -> str:
    """One colour per backend in both panels and every plot."""
    return f"C{list(TIMED_BACKENDS).index(name) % 10}"
