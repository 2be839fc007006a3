"""One decode call per benchmark backend, all on the same ids: ours through the one decoding loop,
CTranslate2 through its own translate_batch. Heavy libraries (PyTorch, ONNX Runtime, CTranslate2) are
imported only by the backend that needs them, so each backend's peak memory is its own (every backend
runs in a fresh process)."""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..artifacts.manifest import is_hf_directory
from ..core.batching import pad_batch
from ..core.errors import TfmExportError
from ..core.token_rules import SEED_RULES, TokenRules
from ..core.tokenizer import BOS_ID, EOS_ID
from ..runtime.backend_names import CONCAT, DEVICE, GENERATE, ONNXRUNTIME, TENSORRT, TORCH
from ..runtime.search import Searcher, SearchOptions

DEVICES = ("cpu", "cuda")
GPU_FP16 = "fp16 is for GPUs; time it with --device cuda"


@dataclass(frozen=True)
class BenchBackend:
    """One timed backend: what it is, the library that runs it, where it runs, what it loads and how it is set."""

    name: str
    description: str
    library: str  # "ort", "torch", "ct2", "hf", "cpp" or "tensorrt": how it is opened and what it needs
    devices: tuple[str, ...] = DEVICES
    why_one_device: str = ""  # why it runs on its one device only
    variant: str | None = None  # ONNX Runtime: the model directory it loads ("fp32", "int8-dynamic", "generate")
    compute_type: str | None = None  # CTranslate2's; "fp16" for generate()
    runtime: str = ONNXRUNTIME  # ONNX Runtime: the runtime backend it opens (runtime.backend_names)
    cuda_graphs: bool = False  # ONNX Runtime: the device backend's steps captured (on the CPU: run uncaptured)
    full_recompute: bool = False  # PyTorch without a KV cache
    offered: bool = True  # in `tfm-run bench` (False: a benchmark run's own comparison)


BENCH_BACKENDS = {b.name: b for b in (
    BenchBackend("torch-full", "PyTorch eager, full recompute every step (how the seed code decodes)", "torch",
                 full_recompute=True),
    BenchBackend("torch-cache", "PyTorch eager with a KV cache", "torch"),
    BenchBackend("ort-fp32", "ONNX Runtime fp32", "ort", variant="fp32"),
    BenchBackend("ort-int8-static", "ONNX Runtime, int8 Q/DQ graph (static, calibrated; on CPU its Q/DQ run as "
                 "float ops)", "ort", variant="int8-static"),
    BenchBackend("ort-int8-dynamic", "ONNX Runtime int8 dynamic", "ort", ("cpu",),
                 "its int8 operators (DynamicQuantizeLinear, MatMulInteger) are ONNX Runtime CPU kernels",
                 variant="int8-dynamic"),
    BenchBackend("ort-fp16", "ONNX Runtime fp16 on CUDA", "ort", ("cuda",), GPU_FP16, variant="fp16"),
    BenchBackend("ort-fp32-graphs", "ONNX Runtime fp32, the device backend's steps captured as CUDA graphs and "
                 "replayed (on the CPU: the same backend, uncaptured)", "ort", variant="fp32", runtime=DEVICE,
                 cuda_graphs=True),
    BenchBackend("ort-fp16-graphs", "ONNX Runtime fp16 on CUDA, the device backend's steps captured as CUDA graphs "
                 "and replayed", "ort", ("cuda",), GPU_FP16, variant="fp16", runtime=DEVICE, cuda_graphs=True),
    BenchBackend("ort-generate", "ONNX Runtime fp32, the whole search in generate.onnx (BeamSearch op, one input "
                 "per call)", "ort", variant="generate", runtime=GENERATE),
    BenchBackend("tensorrt", "TensorRT fp16 engines (built from the fp32 graphs' fp16 version)", "tensorrt",
                 ("cuda",), "TensorRT engines run on GPUs; time them with --device cuda"),
    BenchBackend("ct2-fp32", "CTranslate2 float32 (same weights)", "ct2", compute_type="float32"),
    BenchBackend("ct2-int8", "CTranslate2 int8 (same weights)", "ct2", compute_type="int8"),
    BenchBackend("hf-generate", "transformers' own generate(), eager fp32 (a Hugging Face model directory's "
                 "weights)", "hf"),
    BenchBackend("hf-generate-fp16", "transformers' own generate(), eager fp16 on CUDA (a Hugging Face model "
                 "directory's weights)", "hf", ("cuda",), GPU_FP16, compute_type="fp16"),
    BenchBackend("cpp", "the C++ example's loop (examples/cpp, `make cpp`): ONNX Runtime fp32, decoder_step_search "
                 "in place, a call's inputs as one batch", "cpp"),
    BenchBackend("ort-fp32-contract", "ONNX Runtime fp32, the contract's decoder_step (whole-cache Concat, arrays in "
                 "and out, logits reduced in NumPy) instead of decoder_step_search", "ort", variant="fp32",
                 runtime=CONCAT, offered=False),
)}
TIMED_BACKENDS = {name: b.description for name, b in BENCH_BACKENDS.items() if b.offered}  # tfm-run bench's names
# what `--device cuda` times by default: every GPU backend, and generate() as the anchor
GPU_BACKENDS = ("ort-fp32", "ort-fp32-graphs", "ort-fp16", "ort-fp16-graphs", "ort-generate", "tensorrt",
                "torch-cache", "hf-generate", "hf-generate-fp16")
# the device backend with its steps captured as CUDA graphs: a GPU measurement, so not in the CPU default
CUDA_GRAPHS = tuple(name for name in TIMED_BACKENDS if BENCH_BACKENDS[name].cuda_graphs)
CPU_BACKENDS = tuple(name for name in TIMED_BACKENDS if name not in CUDA_GRAPHS)  # what `--device cpu` times
CT2_SETTINGS = "use +packed, +mkl, +nomkl, +isa=NAME, +threads=N"
ORT_SETTINGS = "use +arena, +nospin"


@dataclass(frozen=True)
class Settings:
    """What a name's `+...` suffix sets (benchmarks.interleaved's levers): `ct2-int8+packed+threads=1`,
    `ort-fp32+arena+nospin`. Empty: the backend as `tfm-run bench` runs it."""

    env: tuple[tuple[str, str], ...] = ()  # CTranslate2's switches, set before it is imported
    threads: int | None = None  # CTranslate2: this many threads instead of the run's
    memory_arena: bool | None = None  # ONNX Runtime: SessionOptions.memory_arena
    spinning: bool = True  # ONNX Runtime: SessionOptions.spinning


def bench_backend(name: str) -> tuple[BenchBackend, Settings]:
    """A name as benchmarks give it: a backend, or a setting of one (`+...`); a CTranslate2 compute type this table
    does not list (`ct2-int16`) is a CTranslate2 backend of its own. Unknown names and settings are one line."""
    base, *parts = name.split("+")
    backend = BENCH_BACKENDS.get(base)
    if backend is None and base.startswith("ct2-"):
        backend = BenchBackend(base, f"CTranslate2 {base[4:]}", "ct2", compute_type=base[4:])
    if backend is None:
        raise TfmExportError(f"unknown backend {base!r}; choose one of {', '.join(BENCH_BACKENDS)}")
    if not parts:
        return backend, Settings()
    if backend.library == "ct2":
        return backend, _ct2_settings(name, parts)
    if backend.name == "ort-fp32" and set(parts) <= {"arena", "nospin"}:
        return backend, Settings(memory_arena="arena" in parts, spinning="nospin" not in parts)
    raise TfmExportError(f"unknown ONNX Runtime setting in {name}: {ORT_SETTINGS}" if backend.name == "ort-fp32"
                         else f"{name}: {backend.name} takes no settings")


def _ct2_settings(name: str, parts: list[str]) -> Settings:
    switches = {"packed": ("CT2_USE_EXPERIMENTAL_PACKED_GEMM", "1"), "mkl": ("CT2_USE_MKL", "1"),
                "nomkl": ("CT2_USE_MKL", "0")}
    env, threads = [], None
    for part in parts:
        if part in switches:
            env.append(switches[part])
        elif part.startswith("isa="):
            env.append(("CT2_FORCE_CPU_ISA", part[4:]))
        elif part.startswith("threads=") and part[8:].isdigit() and int(part[8:]) > 0:
            threads = int(part[8:])
        else:
            raise TfmExportError(f"unknown CTranslate2 setting {part!r} in {name}: {CT2_SETTINGS}")
    return Settings(tuple(env), threads)


Decode = Callable[[Sequence[Sequence[int]], int, int, bool], list[tuple[int, ...]]]

# The C++ example's binary as `make cpp` builds it (scripts/build_cpp.py); TFM_CPP_TRANSLATE names another.
CPP_BINARY = Path(__file__).resolve().parents[2] / "build" / "cpp" / "bin" / "tfm_translate"

# why PyTorch and CTranslate2 cannot run for an fp32 model directory: its manifest names its checkpoint, not where it is
NO_CHECKPOINT = "no checkpoint (give bench --model the checkpoint, not a model directory, to time this backend)"


@dataclass(frozen=True)
class Artifacts:
    """Everything the backends load, made once per benchmark run from one checkpoint."""

    checkpoint: Path | None
    onnx: dict[str, Path]  # variant ("fp32", "int8-static", ...) -> model directory
    ctranslate2: Path | None
    source_tokens: tuple[str, ...] = ()  # id -> token, for CTranslate2's string interface
    target_tokens: tuple[str, ...] = ()
    tensorrt: Path | None = None  # fp16 engine directory, where TensorRT and a GPU are present
    ctranslate2_unsupported: str | None = None  # why CTranslate2's spec cannot express this model
    rules: TokenRules = SEED_RULES  # ids and beam rule of the model (a pretrained model's own)


def wrong_device(name: str, device: str) -> str | None:
    """Why a backend never runs on `device`, known before any artifact is built; or None."""
    backend = bench_backend(name)[0]
    if device in backend.devices:
        return None
    return backend.why_one_device if device == "cpu" else f"CPU only: {backend.why_one_device}"


def unavailable(name: str, artifacts: Artifacts, device: str = "cpu") -> str | None:
    """Why a backend (or a setting of one) cannot run here on `device`, or None."""
    if reason := wrong_device(name, device):
        return reason
    backend = bench_backend(name)[0]
    if backend.library == "hf":
        return _generate_unavailable(artifacts, device)
    if device == "cuda":
        problem = _no_gpu(backend.library)
        if problem:
            return problem
    if backend.library == "cpp":
        return _cpp_unavailable(artifacts)
    if backend.variant == "generate" and artifacts.rules != SEED_RULES:
        return "generate.onnx is built for the seed's token layout; a Hugging Face model decodes with the loop"
    if backend.library == "tensorrt" and artifacts.tensorrt is None:
        from ..runtime.tensorrt_platform import missing_reason
        return missing_reason() or "the engines could not be built (see the [bench] log)"
    if backend.variant is not None and backend.variant not in artifacts.onnx:
        return f"no {backend.variant} model directory"
    if backend.library == "torch" and artifacts.checkpoint is None:
        return NO_CHECKPOINT
    if backend.library == "ct2" and artifacts.ctranslate2 is None:
        return artifacts.ctranslate2_unsupported or "CTranslate2 is not installed or the model could not be converted"
    return None


def _no_gpu(library: str) -> str | None:
    """Why a library's backends cannot run on a CUDA GPU here, or None."""
    if library == "ct2":
        import ctranslate2
        return None if ctranslate2.get_cuda_device_count() else "CTranslate2 sees no CUDA GPU"
    if library == "torch":
        import torch
        return None if torch.cuda.is_available() else "PyTorch sees no CUDA GPU"
    if library == "ort" and not _has_cuda_provider():
        return "this onnxruntime has no CUDA provider"
    return None


def _generate_unavailable(artifacts: Artifacts, device: str) -> str | None:
    if artifacts.checkpoint is None or not is_hf_directory(artifacts.checkpoint):
        return "generate() runs Hugging Face models: give bench --model a Hugging Face model directory"
    if importlib.util.find_spec("transformers") is None:
        return "transformers is not installed (pip install 'tfm-export[hf]')"
    return _no_gpu("torch") if device == "cuda" else None


def open_decoder(name: str, artifacts: Artifacts, threads: int, device: str = "cpu") -> Decode:
    """decode(sources with <s>/</s>, beam size, length, forced) -> generated ids per source (best only). Our
    backends are opened as `tfm-run translate` opens them (Translator.load), but for the cache-less baseline."""
    backend, settings = bench_backend(name)
    return OPENERS[backend.library](backend, settings, artifacts, threads, device)


def _open_ct2(backend: BenchBackend, settings: Settings, artifacts: Artifacts, threads: int, device: str) -> Decode:
    os.environ.update(dict(settings.env))  # before ctranslate2 is imported (each backend runs in a fresh process)
    return _ctranslate2(artifacts, backend.compute_type or "float32", settings.threads or threads, device)


def _open_hf(backend: BenchBackend, settings: Settings, artifacts: Artifacts, threads: int, device: str) -> Decode:
    return _generate(artifacts, backend.compute_type == "fp16", threads, device)


def _open_cpp(backend: BenchBackend, settings: Settings, artifacts: Artifacts, threads: int, device: str) -> Decode:
    return CppDecoder(artifacts.onnx["fp32"], threads)


def _open_torch(backend: BenchBackend, settings: Settings, artifacts: Artifacts, threads: int,
                device: str) -> Decode:
    import torch

    from ..runtime.backends import open_backend
    from ..runtime.search import LoopSearcher
    from ..runtime.session import SessionOptions
    if threads:
        torch.set_num_threads(threads)
    if backend.full_recompute:
        from ..model.loading import load_checkpoint
        from .torch_full import TorchFullBackend
        return _searching(LoopSearcher(TorchFullBackend(load_checkpoint(artifacts.checkpoint).model)),
                          artifacts.rules)
    return _searching(open_backend(artifacts.checkpoint, TORCH, SessionOptions(device=device)).searcher,
                      artifacts.rules)


def _open_tensorrt(backend: BenchBackend, settings: Settings, artifacts: Artifacts, threads: int,
                   device: str) -> Decode:
    from ..runtime.backends import open_backend
    return _searching(open_backend(artifacts.tensorrt, TENSORRT).searcher, artifacts.rules)


def _open_ort(backend: BenchBackend, settings: Settings, artifacts: Artifacts, threads: int, device: str) -> Decode:
    """The device backend always for captured steps, so that on the CPU it runs the same code uncaptured."""
    from ..runtime.backends import open_backend
    from ..runtime.session import SessionOptions
    options = SessionOptions(intra_op_threads=threads, device=device, memory_arena=settings.memory_arena,
                             spinning=settings.spinning, cuda_graphs=backend.cuda_graphs)
    return _searching(open_backend(artifacts.onnx[backend.variant], backend.runtime, options).searcher,
                      artifacts.rules)


OPENERS: dict[str, Callable[[BenchBackend, Settings, Artifacts, int, str], Decode]] = {
    "ct2": _open_ct2, "hf": _open_hf, "cpp": _open_cpp, "torch": _open_torch, "tensorrt": _open_tensorrt,
    "ort": _open_ort}


def cpp_binary() -> Path:
    return Path(os.environ.get("TFM_CPP_TRANSLATE", CPP_BINARY))


def _cpp_unavailable(artifacts: Artifacts) -> str | None:
    if not cpp_binary().is_file():
        return f"{cpp_binary()} is not built (`make cpp`)"
    if artifacts.rules.forced_eos is not None:  # the other backends leave it out (_searching); the binary applies it
        return "the C++ example forces the model's </s> at the length limit, which the benchmark leaves out"
    return None


class CppDecoder:
    """The C++ binary in --ids mode, one process per decoding setting and batch size, kept running: it decodes what
    has arrived on stdin as soon as no more is coming (a call's sources, written at once, are one batch), so a timed
    call costs decoding, not the process's start and model load. `warm` starts the timed setting's process and
    decodes with it before the timing; `close` ends them all. Opening runs the binary once with no input, which
    opens the model and stops (the load time the bench reports)."""

    def __init__(self, model: Path, threads: int) -> None:
        self.model, self.threads = model, threads
        self.running: dict[tuple[int, int, bool, int], subprocess.Popen[str]] = {}
        opened = subprocess.run(self._command(), input="", capture_output=True, text=True)
        if "empty input" not in opened.stderr:
            raise TfmExportError(f"the C++ translator cannot open {model}: {opened.stderr.strip()}")

    def __call__(self, sources: Sequence[Sequence[int]], beam: int, length: int, forced: bool
                 ) -> list[tuple[int, ...]]:
        child = self._process(beam, length, forced, len(sources))
        assert child.stdin is not None and child.stdout is not None and child.stderr is not None
        child.stdin.write("".join(" ".join(map(str, ids)) + "\n" for ids in sources))
        child.stdin.flush()
        out = []
        for _ in sources:
            line = child.stdout.readline()
            if not line:
                raise TfmExportError(f"the C++ translator stopped: {child.stderr.read().strip()}")
            out.append(tuple(int(t) for t in line.split()))
        return out

    def warm(self, sources: Sequence[Sequence[int]], beam: int, length: int, forced: bool) -> None:
        self(sources, beam, length, forced)

    def pids(self) -> list[int]:
        return [child.pid for child in self.running.values()]

    def close(self) -> None:
        for child in self.running.values():
            if child.stdin:
                child.stdin.close()
            child.wait()

    def _process(self, beam: int, length: int, forced: bool, batch: int) -> subprocess.Popen[str]:
        key = (beam, length, forced, batch)
        if key not in self.running:
            command = self._command("--beam-size", str(beam), "--max-length", str(length),
                                    "--min-length", str(length if forced else 0), "--batch-size", str(batch))
            self.running[key] = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                                 stderr=subprocess.PIPE, text=True)
        return self.running[key]

    def _command(self, *options: str) -> list[str]:
        return [str(cpp_binary()), str(self.model), "--ids", "--threads", str(self.threads), *options]


def _has_cuda_provider() -> bool:
    from ..runtime.session import has_cuda_provider
    return has_cuda_provider()


def _searching(searcher: Searcher, rules: TokenRules) -> Decode:
    """A searcher under the model's rules (a pretrained model's: generate()'s beam rule), less a forced </s> at the
    length limit, which CTranslate2 has no option for: every backend generates the same tokens. A forced length
    bars </s> until it (min_length), in the loops and in generate.onnx alike."""
    rules = dataclasses.replace(rules, forced_eos=None)

    def decode(sources: Sequence[Sequence[int]], beam: int, length: int, forced: bool) -> list[tuple[int, ...]]:
        options = SearchOptions(length, beam, min_length=length if forced else 0)
        return [h[0].tokens for h in searcher.search(pad_batch(sources, rules.pad), options, rules)]
    return decode


def _generate(artifacts: Artifacts, half: bool, threads: int, device: str) -> Decode:
    """transformers' generate() on the directory's own weights, with the model's generation config as tfm-run
    decodes with it, less the forced </s> at the length limit (as for every backend here)."""
    import torch
    import transformers
    if threads:
        torch.set_num_threads(threads)
    dtype = torch.float16 if half else torch.float32
    model = transformers.AutoModelForSeq2SeqLM.from_pretrained(artifacts.checkpoint, dtype=dtype).to(device).eval()
    rules = artifacts.rules

    def decode(sources: Sequence[Sequence[int]], beam: int, length: int, forced: bool) -> list[tuple[int, ...]]:
        ids = torch.from_numpy(pad_batch(sources, rules.pad))
        mask = torch.zeros_like(ids)
        for i, row in enumerate(sources):
            mask[i, :len(row)] = 1
        with torch.inference_mode():
            out = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device), num_beams=beam,
                                 max_new_tokens=length, min_new_tokens=length if forced else 0, do_sample=False,
                                 forced_eos_token_id=None, num_return_sequences=1)
        return [tuple(row[:row.index(rules.eos)] if rules.eos in row else row) for row in out[:, 1:].tolist()]
    return decode


def _ctranslate2(artifacts: Artifacts, compute_type: str, threads: int, device: str = "cpu") -> Decode:
    import ctranslate2
    translator = ctranslate2.Translator(str(artifacts.ctranslate2), device=device, compute_type=compute_type,
                                        intra_threads=threads, inter_threads=1)
    vocab = artifacts.source_tokens
    index = {token: i for i, token in enumerate(artifacts.target_tokens)}
    seed = artifacts.rules == SEED_RULES
    framing = (BOS_ID, EOS_ID) if seed else ()  # CT2's seed spec adds its own
    banned = None if seed else [[artifacts.target_tokens[i]] for i in artifacts.rules.banned] or None

    def decode(sources: Sequence[Sequence[int]], beam: int, length: int, forced: bool) -> list[tuple[int, ...]]:
        tokens = [[vocab[i] for i in row if i not in framing] for row in sources]
        results = translator.translate_batch(tokens, beam_size=beam, max_decoding_length=length,
                                             min_decoding_length=length if forced else 0, max_batch_size=0,
                                             suppress_sequences=banned)
        return [tuple(index[t] for t in r.hypotheses[0]) for r in results]
    return decode


def agreement(got: list[tuple[int, ...]], want: list[tuple[int, ...]]) -> float:
    return float(np.mean([g == w for g, w in zip(got, want, strict=True)])) if want else 1.0
