"""The speed part: `tfm-run bench` on a random base-size Marian directory, its checks read from the bench's JSON."""

from __future__ import annotations

import json
from pathlib import Path

from .harness import FAILED, OK, RUN, SCRIPT, SKIPPED, Check, Environment, Part, Report, Scale, say


def speed_part(report: Report, env: Environment, work: Path, scale: Scale) -> None:
    part = Part("speed", report, env, scale.budgets["speed"])
    marian = work / ("small-marian" if env.rehearse else "base-marian")
    if not (marian / "config.json").exists():
        part.step("random Marian directory", [SCRIPT, "marian", "--output", marian, "--vocab-size",
                                              str(scale.vocab), "--sizes", json.dumps(scale.marian)], timeout=120)
    backends = ["ort-fp32", "ort-fp32-graphs", "ort-fp16", "ort-fp16-graphs", "hf-generate-fp16"]
    if env.rehearse:
        backends.insert(-1, "hf-generate")  # fp16 generate() is for GPUs: the rehearsal times the fp32 one
    bench_json, bench_md = report.out / "bench.json", report.out / "bench.md"
    bench_json.unlink(missing_ok=True)
    part.step("bench", ["-c", RUN, "bench", "--device", env.device, "--model", marian, "--work-dir", work / "bench",
                        "--backends", ",".join(backends), "--cells", scale.cells, "--output-length",
                        str(scale.output_length), "--repeats", str(scale.repeats), "--min-time", str(scale.min_time),
                        "--json", bench_json, "--markdown", bench_md], [marian / "config.json"], timeout=600)
    if bench_json.exists():
        for check in bench_checks(json.loads(bench_json.read_text(encoding="utf-8")), env.device):
            report.add(check)
    part.done()


def bench_checks(data: dict, device: str) -> list[Check]:
    """The bench's verdicts, one line each: every backend that can run on this device ran; the CUDA-graph
    backend decodes as the one it captures; tokens/s per cell, with the ratio to generate()."""
    backends = data["backends"]
    anchor = "hf-generate-fp16" if device == "cuda" else "hf-generate"
    anchor_rows = {(r["beam"], r["batch"]): r["tokens_per_s"] for r in backends.get(anchor, {}).get("rows", [])}
    checks = []
    for name, result in backends.items():
        if result["skipped"]:
            gpu_only = device == "cpu" and "time it with --device cuda" in result["skipped"]
            checks.append(Check("speed", name, SKIPPED if gpu_only else FAILED, f"{name}: {result['skipped']}"))
            continue
        cells = []
        for row in result["rows"]:
            anchor_rate = anchor_rows.get((row["beam"], row["batch"]))
            ratio = f" ({row['tokens_per_s'] / anchor_rate:.2f}x)" if anchor_rate and name != anchor else ""
            cells.append(f"beam {row['beam']} batch {row['batch']} {row['tokens_per_s']:,.0f}{ratio}")
        agreement = result.get("agreement")
        exact = name != "ort-fp32-graphs" or agreement == 1.0
        line = f"{name} tok/s: {'; '.join(cells)}; agreement with ort-fp32 {agreement}"
        if not exact:
            line += " (the captured steps must decode as ort-fp32)"
        checks.append(Check("speed", name, OK if exact else FAILED, line))
    for cell, ms in data.get("step_floor_ms", {}).items():
        say(f"step floor, {cell}: {ms:.3f} ms")
    return checks
