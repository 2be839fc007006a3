"""The speed and memory targets of docs/benchmarks.md, judged from the reports of one `make bench` run
(benchmarks.interleaved's JSON, one per model): ONNX Runtime against CTranslate2 in every cell, peak memory
and the bandwidth floor on the base config; first-translation latency and ONNX Runtime's weight-MatMul floor
(bench.kernel_floor) reported. A target is met only where every cell meets it; shortfalls are shown cut, never
rounded, to three decimals (1.2497x reads 1.249x, not 1.250x). An anchor measured at several settings in the run
(`ct2-fp32` and `ct2-fp32+threads=1`) is taken at its best: its fastest setting in each cell and round, its smallest
peak memory."""

from __future__ import annotations

import math
import re
import statistics

TARGET_RATIO = 1.25  # ours / CTranslate2 tokens/s, in every cell
FLOOR_RATIO = 1.3  # batch-1 fp32 greedy time per token / the memory-bandwidth floor
TARGET_MODEL = "base"  # the model whose memory and floor are targets; the others' are reported
PAIRS = (("ort-fp32", "ct2-fp32"), ("ort-int8-dynamic", "ct2-int8"))
CELL = "len {length}, beam {beam}, batch {batch}"
CPP_FIRST_LINE = "tfm_translate, the C++ command (fp32)"  # its first-line entry in a report
CPP_TARGET_MODEL, CPP_TARGET_BATCH = "demo", 32  # its first line before CTranslate2's; no slower than tfm-run here


def cell_name(length: int, beam: int, batch: int) -> str:
    return CELL.format(length=length, beam=beam, batch=batch)


def cell_sizes(cell: str) -> tuple[int, int, int]:
    """(length, beam, batch) of a cell's name."""
    length, beam, batch = (int(v) for v in re.findall(r"\d+", cell))
    return length, beam, batch


def cut(value: float, places: int = 3) -> str:
    return f"{math.floor(value * 10 ** places) / 10 ** places:.{places}f}"


def settings_of(report: dict, name: str) -> list[str]:
    """`name` and, for a CTranslate2 anchor, every setting of it the run measured (`ct2-fp32+threads=1` is a
    setting of `ct2-fp32`); our own backends' settings are backends of their own."""
    names = report["rounds"][0]["results"]
    return [n for n in names if n == name or (name.startswith("ct2-") and n.startswith(name + "+"))]


def timed_backends(report: dict) -> set[str]:
    """The backends a report's run timed."""
    return set(report["rounds"][0]["results"])


def _rate(result: dict, names: list[str], cell: str) -> float:
    """One round's tokens/s in the cell: the fastest of `names`."""
    return max(result["results"][n]["cells"][cell]["tokens_per_s"] for n in names)


def round_ratios(report: dict, ours: str, anchor: str) -> dict[str, list[float]]:
    """Per cell, the tokens/s ratio of each round (both measured in that round; the anchor at its fastest
    setting in that round)."""
    rounds, settings = report["rounds"], settings_of(report, anchor)
    return {cell: [_rate(r, [ours], cell) / _rate(r, settings, cell) for r in rounds]
            for cell in rounds[0]["results"][ours]["cells"]}


def anchor_choices(report: dict, anchor: str) -> dict[str, int]:
    """How many cell-rounds each setting of the anchor was the fastest in (for the report, when there are several)."""
    settings = settings_of(report, anchor)
    counts = dict.fromkeys(settings, 0)
    for r in report["rounds"]:
        for cell in r["results"][anchor]["cells"]:
            counts[max(settings, key=lambda n: r["results"][n]["cells"][cell]["tokens_per_s"])] += 1
    return counts


def cell_ratios(report: dict, ours: str, anchor: str) -> dict[str, float]:
    """Per cell, the median over rounds of the per-round ratio."""
    return {cell: statistics.median(values) for cell, values in round_ratios(report, ours, anchor).items()}


def floor_ms(report: dict) -> float:
    """The bandwidth floor: weight bytes one batch-1 greedy token reads / the measured copy bandwidth."""
    return report["weight_bytes_per_token"] / (report["copy_bandwidth_gbs"] * 1e9) * 1e3


def ms_per_token(report: dict, name: str, cell: str, best_setting: bool = False) -> float:
    """Median over rounds; best_setting: each round's fastest setting of `name` (for an anchor)."""
    names = settings_of(report, name) if best_setting else [name]
    return statistics.median(1e3 / _rate(r, names, cell) for r in report["rounds"])


def _median_of(report: dict, name: str, key: str) -> float:
    return statistics.median(r["results"][name][key] for r in report["rounds"])


def _anchor_peak(report: dict, anchor: str) -> float:
    return min(_median_of(report, name, "peak_rss_mb") for name in settings_of(report, anchor))


def _at_best(model: str, report: dict, anchor: str) -> str:
    """'' for an anchor measured at one setting; else which of its settings were the fastest, how often."""
    counts = anchor_choices(report, anchor)
    if len(counts) < 2:
        return ""
    return (f"; {model}: {anchor} at its best of " + ", ".join(f"{n} (fastest in {c} cell-rounds)"
                                                               for n, c in counts.items()))


def _speed_rows(reports: dict[str, dict]) -> list[tuple[str, str, bool | None]]:
    rows = []
    for ours, anchor in PAIRS:
        ratios = {f"{model} {cell}": v for model, report in reports.items()
                  if {ours, anchor} <= timed_backends(report)  # a run of other backends: not judged
                  for cell, v in cell_ratios(report, ours, anchor).items()}
        if not ratios:
            continue
        short = {c: v for c, v in ratios.items() if v < TARGET_RATIO}
        worst = min(ratios, key=ratios.get)
        measured = f"{len(ratios) - len(short)} of {len(ratios)} cells; lowest {cut(ratios[worst])}x ({worst})"
        measured += "".join(_at_best(model, report, anchor) for model, report in reports.items())
        if short:
            measured += f"; short: {', '.join(f'{c} {cut(v)}x' for c, v in short.items())}"
        rows.append((f"{ours} >= {TARGET_RATIO}x {anchor} in every cell", measured, not short))
    return rows


def _model_rows(model: str, report: dict) -> list[tuple[str, str, bool | None]]:
    target, rows = model == TARGET_MODEL, []
    for ours, anchor in [pair for pair in PAIRS if set(pair) <= timed_backends(report)]:
        a, b = _median_of(report, ours, "peak_rss_mb"), _anchor_peak(report, anchor)
        rows.append((f"peak RSS {ours} <= {anchor} ({model})", f"{a:.0f} vs {b:.0f} MB", a <= b if target else None))
    floor = floor_ms(report)
    cell = next(c for c in report["rounds"][0]["results"]["ort-fp32"]["cells"] if c.endswith("beam 1, batch 1"))
    ms = ms_per_token(report, "ort-fp32", cell)
    rows.append((f"batch-1 fp32 greedy within {FLOOR_RATIO}x of the bandwidth floor ({model}, {cell})",
                 f"{ms:.2f} ms/token, floor {floor:.2f} ms ({report['copy_bandwidth_gbs']:.1f} GB/s): "
                 f"{ms / floor:.2f}x", ms / floor <= FLOOR_RATIO if target else None))
    kernels = report.get("matmul_floor_ms")
    if kernels:
        need = ms_per_token(report, "ct2-fp32", cell, best_setting=True) / TARGET_RATIO
        rows.append((f"ONNX Runtime's weight MatMuls alone, one batch-1 step ({model}), against what "
                     f"{TARGET_RATIO}x ct2-fp32 allows a whole token ({cell})",
                     f"{min(kernels.values()):.3f} ms (best of: "
                     + ", ".join(f"{k} {v:.3f}" for k, v in kernels.items()) + f"); allowed {need:.3f} ms", None))
    rows += _step_floor_rows(model, report)
    first = {name: statistics.median(v) for name, v in report.get("first_output_s", {}).items()}
    if first:
        rows.append((f"first translation reported beside CTranslate2's ({model})",
                     "; ".join(f"{n} {v:.2f} s" for n, v in first.items()), None))
    return rows + _cpp_rows(model, report, first)


def _cpp_rows(model: str, report: dict, first: dict[str, float]) -> list[tuple[str, str, bool | None]]:
    """The C++ command against CTranslate2's first line (at its best thread count) and tfm-run's batches."""
    rows = []
    target = model == CPP_TARGET_MODEL
    anchors = {n: v for n, v in first.items() if n.startswith("ctranslate2")}
    if CPP_FIRST_LINE in first and anchors:
        best = min(anchors, key=anchors.get)
        rows.append((f"the C++ command's first line before CTranslate2's best ({model})",
                     f"{first[CPP_FIRST_LINE]:.3f} vs {anchors[best]:.3f} s ({best})",
                     first[CPP_FIRST_LINE] < anchors[best] if target else None))
    if {"cpp", "ort-fp32"} <= timed_backends(report):
        ratios = {c: v for c, v in cell_ratios(report, "cpp", "ort-fp32").items()
                  if cell_sizes(c)[2] == CPP_TARGET_BATCH}
        if ratios:
            worst = min(ratios, key=ratios.get)
            rows.append((f"cpp >= ort-fp32 at batch {CPP_TARGET_BATCH} ({model})",
                         f"lowest {cut(ratios[worst])}x ({worst})", ratios[worst] >= 1.0 if target else None))
    return rows


def allowed_step_ms(report: dict, cell: str) -> float:
    """The time a whole step of the cell may take to meet the target: CTranslate2's per step (a step gives
    each sentence of the batch one token) / TARGET_RATIO."""
    return ms_per_token(report, "ct2-fp32", cell, best_setting=True) * cell_sizes(cell)[2] / TARGET_RATIO


def _step_floor_rows(model: str, report: dict) -> list[tuple[str, str, bool | None]]:
    """Per fp32 cell short of the target: ONNX Runtime's fastest whole step (bench.step_floor) against the
    step the target allows. A floor above the allowance puts the cell out of ONNX Runtime's reach."""
    floors = report.get("step_floor_ms")
    if not floors:
        return []
    short = [c for c, v in cell_ratios(report, "ort-fp32", "ct2-fp32").items() if v < TARGET_RATIO and c in floors]
    if not short:
        return []
    verdicts = {True: [], False: []}
    for cell in short:
        floor, allowed = min(floors[cell].values()), allowed_step_ms(report, cell)
        verdicts[floor > allowed].append(f"{cell} ({floor:.3f} vs {allowed:.3f} ms)")
    measured = "; ".join(f"{label} in {len(v)}: {', '.join(v)}" for label, v in
                         (("out of reach", verdicts[True]), ("within reach", verdicts[False])) if v)
    return [(f"ONNX Runtime's whole step (decoder_step_search, no loop) against the step {TARGET_RATIO}x "
             f"ct2-fp32 allows, in the fp32 cells short of the target ({model})", measured, None)]


def targets(reports: dict[str, dict]) -> str:
    """The targets table (markdown) from the reports of one run, by model name."""
    rows = _speed_rows(reports) + [row for model, report in reports.items() for row in _model_rows(model, report)]
    lines = ["| target | measured | met |", "|---|---|---|"]
    lines += [f"| {t} | {m} | {'reported' if ok is None else ('yes' if ok else '**no**')} |" for t, m, ok in rows]
    return "\n".join(lines)
