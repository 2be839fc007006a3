"""Where the time to the first translation goes, phase by phase, for `tfm-run translate` on a model directory and
for CTranslate2's Python API on its converted model, each in fresh processes, alternating round by round:

    python -m tfm_export.benchmarks.startup --ort build/bench/base/onnx-fp32 --ct2 build/bench/base/ctranslate2 \
        --rounds 5 --threads 2 --ct2-threads 2,1 --variant off:TFM_PREPACKED_GRAPHS=off \
        [--variant before:PYTHONPATH=OTHER_CHECKOUT]

Phases (wall-clock seconds from just before the process is spawned; medians over the rounds, with min-max):
  imports      to the moment the model starts to load (the interpreter, tfm-run's or ctranslate2's imports)
  load         opening the model: for tfm-run Translator.load, within it
                 hashing   sha256 of the directory's files (summed wall time; it overlaps the sessions)
                 sessions  ONNX Runtime's InferenceSession constructors (summed)
               for CTranslate2 its Translator constructor; each with its CPU seconds beside it (the calling
               thread's: load cpu leaves out the hashing threads, hash cpu is theirs)
  first batch  load done to the first output line read from the process's stdout (tokenize, encode, the decode
               of up to --max-length tokens, print)
  first line   the total: spawn to the first output line (what `make bench` reports)
  cpu          the process's user + system CPU seconds, to its exit (less sensitive to other jobs' load)
  peak MB      the process's peak RSS (VmHWM), at its exit
  private MB   its resident anonymous pages once the model is loaded (heap: its own, however many processes run)
  file MB      its resident file-backed pages then (libraries and mapped weights: shared between processes)
The child is the real command (tfm_export.cli.entry.run_main) with timestamps taken by wrappers installed as the
modules are imported, so nothing is imported earlier than the command itself imports it. Run it on a quiet
machine, or read the medians with their spread: start-up is mostly CPU and shares the cores.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# What both children start with: the interpreter's start recorded, memory recorded at exit, in TFM_PHASES_LOG.
CHILD_COMMON = r"""
import sys, time, json, os
log = open(os.environ["TFM_PHASES_LOG"], "a")
def record(event, start, end, cpu):
    log.write(json.dumps([event, start, end, cpu]) + "\n"); log.flush()
record("python", float(os.environ["TFM_PHASES_T0"]), time.time(), time.process_time())
def memory(event):  # VmHWM: the peak so far; RssAnon: private pages; RssFile + RssShmem: shareable (file-backed)
    status = dict(line.split(":", 1) for line in open("/proc/self/status").read().splitlines() if ":" in line)
    mb = lambda k: int(status[k].split()[0]) / 1024
    log.write(json.dumps([event, mb("VmHWM"), mb("RssAnon"), mb("RssFile") + mb("RssShmem")]) + "\n"); log.flush()
import atexit; atexit.register(memory, "exit")
"""

# tfm-run's child: a meta-path finder wraps functions of the modules named below once those modules have run, and
# records (event, start, end) spans. Then the CLI runs as the console script runs it.
CHILD_ORT = CHILD_COMMON + r"""
import importlib.abc, importlib.util, functools
def timed(event, fn):
    @functools.wraps(fn)
    def wrapper(*a, **k):
        start, cpu = time.time(), time.thread_time()
        try:
            return fn(*a, **k)
        finally:
            record(event, start, time.time(), time.thread_time() - cpu)
            if event == "load":
                memory("loaded")
    return wrapper
def patch_files(m): m.file_sha256 = timed("hash", m.file_sha256)
def patch_ort(m):
    cls = m.InferenceSession
    cls.__init__ = timed("session", cls.__init__)
def patch_translator(m):
    load = m.Translator.load.__func__
    m.Translator.load = classmethod(timed("load", load))
PATCHES = {"tfm_export.core.files": patch_files, "onnxruntime": patch_ort, "tfm_export.runtime.translator":
           patch_translator}
class Hook(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name not in PATCHES:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        run = spec.loader.exec_module
        def exec_module(module):
            run(module)
            PATCHES[name](module)
        spec.loader.exec_module = exec_module
        return spec
sys.meta_path.insert(0, Hook())
sys.argv = ["tfm-run", *sys.argv[1:]]
from tfm_export.cli.entry import run_main
run_main()
"""

CHILD_CT2 = CHILD_COMMON + r"""
import ctranslate2
start, cpu = time.time(), time.process_time()
t = ctranslate2.Translator(sys.argv[1], device="cpu", compute_type=sys.argv[5], intra_threads=int(sys.argv[4]))
record("load", start, time.time(), time.process_time() - cpu)
memory("loaded")
out = t.translate_batch([sys.argv[2].split()], max_decoding_length=int(sys.argv[3]))
print(" ".join(out[0].hypotheses[0]), flush=True)
"""


def run_child(command: list[str], extra_env: dict[str, str]) -> dict[str, float]:
    """One fresh process: its phases in seconds from spawn."""
    with tempfile.NamedTemporaryFile("r", suffix=".jsonl") as log:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.time()
        env = {**os.environ, **extra_env, "TFM_PHASES_LOG": log.name, "TFM_PHASES_T0": repr(t0)}
        # from another directory: `python -c` puts the working directory first on sys.path, before PYTHONPATH
        with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                              cwd=tempfile.gettempdir()) as proc:
            line = proc.stdout.readline()
            first = time.time() - t0
            _, err = proc.communicate()
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if not line:
            raise SystemExit(f"no output from {' '.join(command)}: {err.strip()[-500:]}")
        events = [json.loads(x) for x in Path(log.name).read_text().splitlines()]
    spans: dict[str, list[tuple[float, float, float]]] = {}
    memory = {}
    for event, *values in events:
        if event == "exit":
            memory["peak MB"] = values[0]
            continue
        if event == "loaded":
            memory["private MB"], memory["file MB"] = values[1:]
            continue
        start, end, cpu = values
        spans.setdefault(event, []).append((start - t0, end - t0, cpu))
    load = spans["load"][0]
    phases = {"imports": load[0], "load": load[1] - load[0], "load cpu": load[2]}
    for event in ("hash", "session"):
        if event in spans:
            phases[event] = sum(e - s for s, e, _ in spans[event])
            phases[f"{event} cpu"] = sum(c for _, _, c in spans[event])
    phases["first batch"] = first - load[1]
    phases["first line"] = first
    phases["cpu"] = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {**phases, **memory}


def thread_counts(text: str) -> list[int]:
    """'2,1' -> [2, 1]: whole numbers above zero, or argparse's one-line usage error."""
    counts = [int(n) for n in text.split(",") if n.strip().isdigit()]
    if len(counts) != len(text.split(",")) or 0 in counts:
        raise argparse.ArgumentTypeError(f"{text!r}: give thread counts above 0, comma-separated, e.g. 2,1")
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ort", type=Path, action="append", default=[], help="a model directory (repeatable)")
    parser.add_argument("--ct2", type=Path, action="append", default=[], help="a CTranslate2 model (repeatable)")
    parser.add_argument("--ct2-compute-type", default="float32")
    parser.add_argument("--max-length", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--ct2-threads", type=thread_counts, default=None, metavar="N[,N]",
                        help="CTranslate2's thread counts, each run as its own process (default: --threads)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tfm-run-args", default="", help="extra tfm-run translate options, space-separated")
    parser.add_argument("--variant", action="append", default=[], metavar="LABEL:NAME=VALUE[,NAME=VALUE]",
                        help="each --ort model also run with these environment variables (repeatable), e.g. "
                             "nocache:TFM_PREPACKED_GRAPHS=off")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    args.ort, args.ct2 = [p.resolve() for p in args.ort], [p.resolve() for p in args.ct2]
    if not args.ort:
        parser.error("give at least one --ort model directory: its vocabulary makes the sentence")
    from ..core.errors import TfmExportError
    try:
        sentence, tokens = first_sentence(args.ort[0])
    except TfmExportError as exc:  # not a model directory, or a damaged one: one line
        parser.error(str(exc))
    variants = {"": {}}
    for variant in args.variant:
        label, _, assignments = variant.partition(":")
        variants[f" [{label}]"] = dict(a.split("=", 1) for a in assignments.split(",") if a)
    commands: dict[str, tuple[list[str], dict[str, str]]] = {}
    for model in args.ort:
        for label, env in variants.items():
            commands[f"tfm-run {model.parent.name}/{model.name}{label}"] = ([
                sys.executable, "-c", CHILD_ORT, "translate", "--model", str(model), "--max-length",
                str(args.max_length), "--threads", str(args.threads), "--beam-size", "1", *args.tfm_run_args.split(),
                sentence], env)
    ct2_threads = args.ct2_threads or [args.threads]
    for model in args.ct2:
        for n in ct2_threads:
            commands[f"ctranslate2 {model.parent.name}/{model.name} ({args.ct2_compute_type}, {n} "
                     f"thread{'s' * (n > 1)})"] = ([sys.executable, "-c", CHILD_CT2, str(model), tokens,
                                                    str(args.max_length), str(n), args.ct2_compute_type], {})
    results: dict[str, list[dict[str, float]]] = {name: [] for name in commands}
    for r in range(args.rounds):
        order = list(commands) if r % 2 == 0 else list(commands)[::-1]
        for name in order:
            results[name].append(run_child(*commands[name]))
        print(f"round {r + 1}: " + ", ".join(f"{n}: {results[n][-1]['first line']:.3f} s" for n in commands),
              file=sys.stderr, flush=True)
    print(table(results, os.getloadavg()))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1), encoding="utf-8")


def table(results: dict[str, list[dict[str, float]]], load: tuple[float, float, float]) -> str:
    phases = ["imports", "load", "load cpu", "hash", "hash cpu", "session", "session cpu", "first batch", "first line",
              "cpu", "peak MB", "private MB", "file MB"]
    rows = ["| process | " + " | ".join(phases) + " |", "|---|" + "---:|" * len(phases)]
    for name, rounds in results.items():
        cells = []
        for phase in phases:
            values = [r[phase] for r in rounds if phase in r]
            cells.append(f"{statistics.median(values):.3f} ({min(values):.3f}-{max(values):.3f})" if values else "-")
        rows.append(f"| {name} | " + " | ".join(cells) + " |")
    rows.append(f"\nseconds from spawn, median (min-max) of {len(next(iter(results.values())))} rounds; load "
                f"average at the end {load[0]:.1f}; hash and session are summed spans within load")
    return "\n".join(rows)


def first_sentence(model: Path) -> tuple[str, str]:
    """make bench's first sentence (bench.run's random sources, seed 0) as text for tfm-run and as the tokens
    CTranslate2 takes, from the model directory's own vocabulary."""
    from ..artifacts.model_dir import ModelDir
    from ..bench.artifacts import BenchModel
    from ..bench.run import bench_sources, bench_texts
    from ..core.token_rules import SEED_RULES
    directory = ModelDir.read(model)
    vocab = directory.vocabulary()
    bench = BenchModel(model, None, model, directory.config.n_position, vocab, directory.rules)
    size = len(vocab.source.tokens())
    ids = bench_sources(None, bench, size, 1)[0]
    ids = ids[1:-1] if directory.rules == SEED_RULES else ids
    return bench_texts(bench, size, 1)[0], " ".join(vocab.source.tokens()[i] for i in ids)


if __name__ == "__main__":
    main()
