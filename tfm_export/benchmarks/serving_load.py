"""The translator layout on a real tritonserver under concurrent load, beside in-process `tfm-run` throughput, for
docs/benchmarks.md ("Serving"); `make bench-serving` runs it.

    python -m tfm_export.benchmarks.serving_load --serving-python .venv-serving/bin/python \
        --work-dir build/bench/serving

Each round sends REQUESTS one-sentence requests (the held-out demo numbers, cycled) from CLIENTS HTTP clients, then
translates the same sentences in this process with the Translator that `tfm-run translate` runs (its default
batch of 32, sorted by length); rounds alternate the two, so both see the same machine. Every server answer is
checked against the in-process translation. Nothing else should run meanwhile: clients and server share the CPU.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from ..runtime.translator import DecodeOptions, Translator
from ..serving.load import LoadResult, run_load
from ..serving.local_server import LocalTritonServer, ServerEnvironment
from ..serving.repository import RepositoryRequest, write_repository

DEMO = Path("models/demo")  # the shipped demo model, from the repository's root (make bench-serving runs there)


def main() -> int:
    args = _arguments()
    work = args.work_dir.resolve()
    work.mkdir(parents=True, exist_ok=True)
    model = args.model or _export_demo(work / "demo-onnx")
    write_repository(RepositoryRequest(model, work / "repo", max_batch=args.max_batch, force=True))
    lines = (DEMO / "heldout.en.txt").read_text().splitlines()
    texts = [lines[i % len(lines)] for i in range(args.requests)]
    translator = Translator.load(model)
    expected = [t.text for t in translator.translate(texts)]
    rows = []
    with LocalTritonServer(ServerEnvironment.find(args.serving_python), work / "repo", work / "server") as server:
        run_load(server.http_url, "translator", texts[:64], clients=args.clients)  # warm-up
        for round_ in range(1, args.rounds + 1):
            _log(f"round {round_}: {args.requests} requests from {args.clients} clients")
            load = run_load(server.http_url, "translator", texts, args.clients, rss=server.rss_bytes)
            wrong = sum(a != e for a, e in zip(load.answers, expected, strict=True))
            _log(f"round {round_}: in-process tfm-run")
            start = time.perf_counter()
            translator.translate(texts, DecodeOptions(batch_size=32))
            local = len(texts) / (time.perf_counter() - start)
            rows.append((round_, load, wrong, local))
    report = _markdown(rows, args)
    print(report)
    if args.markdown:
        args.markdown.write_text(report + "\n")
    return 0 if all(not load.errors and wrong == 0 for _, load, wrong, _ in rows) else 1


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--serving-python", type=Path, required=True, help="Interpreter with nvidia-pytriton and "
                        "tfm-export's runtime (make serving-env builds .venv-serving).")
    parser.add_argument("--work-dir", type=Path, required=True, help="For the exported model, repository, logs.")
    parser.add_argument("--model", type=Path, default=None, help="Model directory (default: export the demo model).")
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-batch", type=int, default=64, help="The repository's --max-batch.")
    parser.add_argument("--markdown", type=Path, default=None, help="Also write the report here.")
    return parser.parse_args()


def _export_demo(output: Path) -> Path:
    from ..graphs.pipeline import export_model_dir
    from ..model.loading import load_checkpoint
    _log(f"exporting the demo model to {output}")
    export_model_dir(load_checkpoint(DEMO / "ckpt.pt"), output, force=True, progress=False)
    return output


def _markdown(rows: list[tuple[int, LoadResult, int, float]], args: argparse.Namespace) -> str:
    lines = [f"{args.requests} one-sentence requests, {args.clients} concurrent HTTP clients, translator layout "
             f"(--max-batch {args.max_batch}, 1 CPU instance), greedy; in-process: the same sentences through "
             "`Translator.translate` (batch 32).", "",
             "| round | answered | wrong | server req/s | p50 ms | p99 ms | mean batch | server RSS MB (first / last "
             "sample) | in-process tfm-run sent/s | server / in-process |",
             "|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|"]
    for round_, load, wrong, local in rows:
        answered = sum(a is not None for a in load.answers)
        lines.append(f"| {round_} | {answered}/{len(load.answers)} | {wrong} | {load.throughput:.0f} | "
                     f"{load.latency_ms(50):.0f} | {load.latency_ms(99):.0f} | {load.mean_batch:.1f} | "
                     f"{load.rss_bytes[0] / 1e6:.0f} / {load.rss_bytes[-1] / 1e6:.0f} | {local:.0f} | "
                     f"{load.throughput / local:.2f}x |")
    ratio = statistics.median(load.throughput / local for _, load, _, local in rows)
    lines += ["", f"Median ratio, server throughput / in-process: {ratio:.2f}x."]
    return "\n".join(lines)


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
