"""Repeated, interleaved rounds of the benchmark's own measurement, for ratios against CTranslate2 that
one `tfm-run bench` pass (each backend once, one after another) cannot give on a shared, noisy machine.

The artifacts are made once, as `tfm-run bench` makes them (bench.artifacts); then every round runs each
backend in a fresh process (bench.protocol's timing loop: warm-up, then whole batches), in an order that
rotates from round to round, so every backend sees the same drift of the machine's load. Ratios are taken
per round (ours / anchor from the same round) and their median is reported beside the spread.

Backends besides `tfm-run bench`'s names:
  ort-fp32+arena, ort-fp32+nospin (combined: ort-fp32+arena+nospin)
                      ort-fp32 with ONNX Runtime's CPU memory arena on / its threads sleeping while they wait
                      (tfm-run's defaults: no arena for decoder_step_search, threads spinning within a run)
  ort-fp32-contract   the contract's decoder_step (whole-cache Concat, arrays in and out, logits reduced in
                      NumPy) instead of decoder_step_search, which tfm-run translate uses when the directory has it
  ct2-<compute_type>[+packed][+mkl][+isa=NAME][+threads=N]
                      CTranslate2 with that compute type and CT2_USE_EXPERIMENTAL_PACKED_GEMM=1,
                      CT2_USE_MKL=1, CT2_FORCE_CPU_ISA=NAME set before it is imported, or N threads instead
                      of --threads. Every setting of an anchor named in one run is measured in every round, and
                      the targets take the anchor at its fastest setting in each cell and round (its smallest
                      peak memory): `make bench` gives CTranslate2 one thread beside --threads, since on some
                      machines it is faster with fewer

    python -m tfm_export.benchmarks.interleaved --model build/bench/base-model/ckpt.pt --work-dir build/bench/il \
        --rounds 3 --backends ort-fp32,ct2-float32,ort-int8-dynamic,ct2-int8 --json build/bench/il.json
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from ..bench import protocol, runners
from ..bench.targets import cell_name, cell_sizes, floor_ms, ms_per_token, round_ratios, settings_of, targets
from ..core.errors import TfmExportError
from ..core.machine import return_large_blocks

# Every backend runs in a spawned process, which imports this script again: the export side (torch, onnx:
# ~230 MB) is imported inside main() and finish() only, so that it is in no backend's peak memory.


def measure(name: str, artifacts, sources, lengths, settings, reference) -> dict:
    """One backend in this (fresh) process: load, unforced greedy outputs, then every cell timed."""
    return_large_blocks()  # as tfm-run does; CTranslate2's peak falls further with it, so every backend gets it
    start = time.perf_counter()
    decode = runners.open_decoder(name, artifacts, settings.threads)
    load_s = time.perf_counter() - start
    outputs = [o for batch in protocol.batches(sources, 8) for o in decode(batch, 1, lengths[0], False)]
    cells = {}
    for length in lengths:
        for beam in settings.beam_sizes:
            for size in settings.batch_sizes:
                row = protocol.time_batches(decode, protocol.batches(sources, size), beam, length, True, settings)
                cells[cell_name(length, beam, size)] = {**row.summary, "timings_s": row.timings_s}
    return {"name": name, "load_s": load_s, "peak_rss_mb": protocol.backend_peak_rss_mb(decode), "cells": cells,
            "agreement": None if reference is None else protocol.agreement(outputs, reference),
            "outputs": outputs}


def copy_bandwidth_gbs(megabytes: int = 512, repeats: int = 7) -> float:
    """Best of `repeats` copies of a buffer far larger than the last-level cache, one slice per core in
    threads (NumPy's copy releases the GIL), as bytes read + written per second."""
    from concurrent.futures import ThreadPoolExecutor
    a = np.ones(megabytes * 2**20 // 4, np.float32)
    b = np.empty_like(a)
    cores = os.cpu_count() or 1
    slices = [slice(i * len(a) // cores, (i + 1) * len(a) // cores) for i in range(cores)]
    with ThreadPoolExecutor(cores) as pool:
        def copy() -> float:
            start = time.perf_counter()
            list(pool.map(lambda s: np.copyto(b[s], a[s]), slices))
            return time.perf_counter() - start
        best = min(copy() for _ in range(repeats))
    return 2 * a.nbytes / best / 1e9


def weight_bytes_per_token(checkpoint) -> int:
    """fp32 bytes of the weights one greedy step reads at batch 1: every decoder layer's (less the
    cross-attention key/value projections, applied once to the encoder output) and the output projection
    (the tied embedding matrix; the input embedding reads one row of it)."""
    from ..bench.kernel_floor import ONCE_PER_SOURCE
    params = dict(checkpoint.model.named_parameters())
    layers = sum(p.numel() for n, p in params.items() if n.startswith("decoder.")
                 and not any(f".{once}." in n for once in ONCE_PER_SOURCE) and "word_emb" not in n
                 and "position" not in n)
    vocab, width = checkpoint.config.trg_vocab_size, checkpoint.config.d_model
    return 4 * (layers + vocab * width)


FIRST_CT2 = """import sys, ctranslate2
t = ctranslate2.Translator(sys.argv[1], device="cpu", compute_type="float32", intra_threads=int(sys.argv[4]))
out = t.translate_batch([sys.argv[2].split()], max_decoding_length=int(sys.argv[3]))
print(" ".join(out[0].hypotheses[0]), flush=True)
"""


def first_output_s(command: list[str]) -> float:
    """Process start to its first line on stdout."""
    import subprocess
    start = time.perf_counter()
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True) as proc:
        line = proc.stdout.readline()
        elapsed = time.perf_counter() - start
        proc.wait()
    if not line:
        raise SystemExit(f"no output from {' '.join(command)}")
    return elapsed


def first_latencies(fp32: Path, ct2: Path, sentence: str, ct2_tokens: str, rounds: int, threads: int,
                    ct2_threads: list[int], length: int = 64) -> dict[str, list[float]]:
    """`tfm-run translate` and the C++ command (where `make cpp` built it) on the fp32 directory (the sentence), and
    CTranslate2's Python API in a fresh interpreter (its tokens) at each of its thread counts, alternating; all at
    most `length` tokens (random weights rarely stop earlier)."""
    from ..bench.runners import cpp_binary
    from ..bench.targets import CPP_FIRST_LINE
    options = ["--max-length", str(length), "--threads", str(threads), "--beam-size", "1"]
    commands = {"tfm-run translate (fp32)": [str(Path(sys.executable).with_name("tfm-run")), "translate", "--model",
                                             str(fp32), *options, sentence]}
    if cpp_binary().is_file():
        commands[CPP_FIRST_LINE] = [str(cpp_binary()), str(fp32), *options, sentence]
    for n in ct2_threads:
        commands[f"ctranslate2 (float32, Python API, {n} thread{'s' * (n > 1)})"] = [
            sys.executable, "-c", FIRST_CT2, str(ct2), ct2_tokens, str(length), str(n)]
    out: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(rounds):
        for name, command in commands.items():
            out[name].append(first_output_s(command))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--work-dir", type=Path, required=True)
    parser.add_argument("--fp32-dir", type=Path, default=None,
                        help="an fp32 export of --model (a checkpoint) to time as is, instead of exporting it again")
    parser.add_argument("--backends", default="ort-fp32,ct2-fp32,ort-int8-dynamic,ct2-int8")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--lengths", default="64,128")
    parser.add_argument("--batch-sizes", default="1,8,32")
    parser.add_argument("--beam-sizes", default="1,4")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--min-time", type=float, default=1.0)
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--json", type=Path, required=True)
    parser.add_argument("--resume", type=Path, default=None, help="a .partial.json: skip the rounds it holds")
    args = parser.parse_args()
    from ..bench.artifacts import build_fp32, build_variants, calibration_for, open_model
    from ..bench.run import bench_sources, bench_texts
    backends = args.backends.split(",")
    for name in backends:  # a misspelt backend or setting fails now, not after the exports
        try:
            runners.bench_backend(name)
        except TfmExportError as exc:
            raise SystemExit(str(exc)) from None
    lengths = [int(v) for v in args.lengths.split(",")]
    settings = protocol.BenchSettings(batch_sizes=tuple(int(v) for v in args.batch_sizes.split(",")),
                                      beam_sizes=tuple(int(v) for v in args.beam_sizes.split(",")),
                                      repeats=args.repeats, min_time=args.min_time, threads=args.threads)
    model = open_model(args.model, args.fp32_dir)
    if args.resume:  # the rounds of an earlier run (its .partial.json); only what follows them is run again
        finish(args, model, json.loads(args.resume.read_text(encoding="utf-8")))
        return
    args.work_dir.mkdir(parents=True, exist_ok=True)
    say = lambda text: print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)  # noqa: E731
    built = build_fp32(model, args.work_dir, say)
    sources = bench_sources(None, model, len(built.artifacts.source_tokens), 32)
    inputs = bench_texts(model, len(built.artifacts.source_tokens), 32)
    calib = calibration_for(inputs, None, [], args.work_dir / "calibration.txt", None)
    variants = {"ort-int8-dynamic"} & set(backends)
    build_variants(built, model, args.work_dir, calib, [*variants, "ct2-fp32"], 128, say=say)
    for name in list(backends):  # what cannot run here (no CTranslate2 model, no C++ binary) is left out, saying why
        why = runners.unavailable(name, built.artifacts)
        if why:
            say(f"{name} left out: {why}")
            backends.remove(name)
    bandwidth = copy_bandwidth_gbs()
    say(f"copy bandwidth {bandwidth:.1f} GB/s")
    context = multiprocessing.get_context("spawn")
    reference = None
    rounds = []
    for r in range(args.rounds):
        order = backends[r % len(backends):] + backends[:r % len(backends)]
        if r % 2:
            order = order[::-1]
        results = {}
        for name in order:
            say(f"round {r + 1}: {name}")
            with context.Pool(1) as pool:
                results[name] = pool.apply(measure, (name, built.artifacts, sources, lengths, settings, reference))
            if name == "ort-fp32" and reference is None:
                reference = results[name]["outputs"]
            say(f"  {name}: load {results[name]['load_s']:.2f} s, peak RSS {results[name]['peak_rss_mb']:.0f} MB; "
                + "; ".join(f"{cell}: {v['tokens_per_s']:.0f} tok/s" for cell, v in results[name]["cells"].items()))
        for result in results.values():
            result.pop("outputs")
        rounds.append({"order": order, "results": results, "load_average": os.getloadavg()})
        partial = {"rounds": rounds, "copy_bandwidth_gbs": bandwidth}
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.with_suffix(".partial.json").write_text(json.dumps(partial, indent=1), encoding="utf-8")
    finish(args, model, {"rounds": rounds, "copy_bandwidth_gbs": bandwidth, "build_s": built.build_s,
                         "sizes_mb": built.size_mb})


def anchor_threads(partial: dict, threads: int) -> list[int]:
    """The thread counts the run gave ct2-fp32 (its first line is timed at each)."""
    found = {runners.bench_backend(name)[1].threads or threads for name in settings_of(partial, "ct2-fp32")}
    return sorted(found, reverse=True) or [threads]


def finish(args, model, partial: dict) -> None:
    """First-translation latency, the weights a token reads, the report."""
    from ..bench.run import bench_sources, bench_texts
    from ..core.token_rules import SEED_RULES
    say = lambda text: print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)  # noqa: E731
    say("first translation latency")
    vocab = model.vocab.source.tokens()
    sources = bench_sources(None, model, len(vocab), 32)
    first_source = sources[0]
    ct2_ids = first_source[1:-1] if model.rules == SEED_RULES else first_source  # CT2 frames only the seed's
    first = first_latencies(model.fp32_dir or args.work_dir / "onnx-fp32", args.work_dir / "ctranslate2",
                            bench_texts(model, len(vocab), 1)[0], " ".join(vocab[i] for i in ct2_ids),
                            args.rounds, args.threads, anchor_threads(partial, args.threads))
    if model.checkpoint is not None:  # the MatMuls by its weights: the fastest any ONNX Runtime step could be
        from ..bench.kernel_floor import matmul_floor_ms
        say("ONNX Runtime's weight MatMuls alone")
        partial = {**partial, "matmul_floor_ms": matmul_floor_ms(model.checkpoint.model, args.threads)}
        partial = {**partial, **step_floors(model.checkpoint.model, partial, sources, args.threads, say)}
    report = {"machine": protocol.machine_info(), "model": str(args.model),
              "settings": {k: str(v) for k, v in vars(args).items()},
              "weight_bytes_per_token": weight_bytes_per_token(model.checkpoint), "first_output_s": first, **partial}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=1), encoding="utf-8")
    summarise(report)


def step_floors(model, partial: dict, sources: list[list[int]], threads: int, say) -> dict:
    """Per cell, ONNX Runtime's fastest whole step (bench.step_floor) at the cell's rows, at the mean cache
    length of its steps and the shortest source (a floor: no real step of the cell has less to do)."""
    from ..bench.step_floor import exported_step, step_floor_ms
    say("ONNX Runtime's fastest whole step, per cell")
    source = min(len(s) for s in sources)
    floors = {}
    with exported_step(model) as graph:
        for cell in next(iter(partial["rounds"][0]["results"].values()))["cells"]:
            length, beam, batch = cell_sizes(cell)
            floors[cell] = step_floor_ms(graph, model, batch, beam, (length - 1) // 2, source, threads)
    return {"step_floor_ms": floors, "step_floor_source_length": source}


def summarise(report: dict) -> None:
    """Per cell: tokens/s of each backend (median over rounds), and per-round ratios against the anchors."""
    names = list(report["rounds"][0]["results"])
    cells = list(report["rounds"][0]["results"][names[0]]["cells"])
    pairs = [(a, b) for a, b in (("ort-fp32", "ct2-fp32"), ("ort-fp32-contract", "ct2-fp32"),
                                 ("ort-fp32", "ort-fp32-contract"), ("ort-int8-dynamic", "ct2-int8"),
                                 ("cpp", "ort-fp32"), ("cpp", "ct2-fp32"))
             if a in names and b in names]
    best = {b: " (its best setting)" if len(settings_of(report, b)) > 1 else "" for _, b in pairs}
    print("| cell | " + " | ".join(f"{n} tok/s" for n in names) + " | "
          + " | ".join(f"{a} / {b}{best[b]} (median; min-max)" for a, b in pairs) + " |")
    print("|---|" + "---:|" * (len(names) + len(pairs)))
    per_round = {pair: round_ratios(report, *pair) for pair in pairs}
    for cell in cells:
        rates = {n: [r["results"][n]["cells"][cell]["tokens_per_s"] for r in report["rounds"]] for n in names}
        ratios = [f"{statistics.median(v):.2f}x ({min(v):.2f}-{max(v):.2f})"
                  for v in (per_round[pair][cell] for pair in pairs)]
        print(f"| {cell} | " + " | ".join(f"{statistics.median(rates[n]):.0f}" for n in names) + " | "
              + " | ".join(ratios) + " |")
    print()
    print("| backend | load s (median) | peak RSS MB (median; min-max) | same greedy output as ort-fp32 |")
    print("|---|---:|---:|---:|")
    for n in names:
        rss = [r["results"][n]["peak_rss_mb"] for r in report["rounds"]]
        load = [r["results"][n]["load_s"] for r in report["rounds"]]
        agree = [r["results"][n]["agreement"] for r in report["rounds"] if r["results"][n]["agreement"] is not None]
        print(f"| {n} | {statistics.median(load):.2f} | {statistics.median(rss):.0f} ({min(rss):.0f}-{max(rss):.0f}) | "
              + (f"{100 * statistics.median(agree):.1f}%" if agree else "-") + " |")
    floor = floor_ms(report)
    print(f"\ncopy bandwidth (bytes read + written per s, 512 MB np.copyto, a slice per core, best of 7): "
          f"{report['copy_bandwidth_gbs']:.1f} GB/s; weights read per greedy token at batch 1: "
          f"{report['weight_bytes_per_token'] / 1e6:.1f} MB; floor {floor:.2f} ms/token")
    for n in [n for n in names if n.startswith("ort-fp32")]:
        for cell in [c for c in cells if c.endswith("beam 1, batch 1")]:
            ms = ms_per_token(report, n, cell)
            print(f"{n}, {cell}: {ms:.2f} ms/token = {ms / floor:.2f}x the floor")
    if "matmul_floor_ms" in report:
        from ..bench.kernel_floor import RUNS
        print(f"ONNX Runtime's weight MatMuls alone, one batch-1 step, best of {RUNS}: "
              + ", ".join(f"{k} {v:.3f} ms" for k, v in report["matmul_floor_ms"].items()))
    if "step_floor_ms" in report:
        print(f"\nONNX Runtime's fastest whole step (bench.step_floor: decoder_step_search alone, no loop; source of "
              f"{report['step_floor_source_length']} tokens, the mean cache length), against each fp32 backend's "
              "step (a step: one token for each sentence of the batch):\n")
        fp32 = [n for n in names if n.split("+")[0].endswith("fp32")]  # each setting of an fp32 backend
        print("| cell | floor ms (best setting) | " + " | ".join(f"{n} ms/step" for n in fp32) + " |")
        print("|---|---:|" + "---:|" * len(fp32))
        for cell, floor in report["step_floor_ms"].items():
            best = min(floor, key=floor.get)
            steps = [ms_per_token(report, n, cell) * cell_sizes(cell)[2] for n in fp32]
            print(f"| {cell} | {floor[best]:.3f} ({best}) | " + " | ".join(f"{v:.3f}" for v in steps) + " |")
        print()
    for name, values in report.get("first_output_s", {}).items():
        print(f"first output line, {name}: median {statistics.median(values):.2f} s "
              f"({', '.join(f'{v:.2f}' for v in values)})")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--summarise":
        summarise(json.loads(Path(sys.argv[2]).read_text(encoding="utf-8")))
    elif len(sys.argv) > 2 and sys.argv[1] == "--targets":  # --targets NAME=REPORT.json ...
        print(targets({name: json.loads(Path(path).read_text(encoding="utf-8"))
                       for name, path in (arg.split("=", 1) for arg in sys.argv[2:])}))
    else:
        main()
