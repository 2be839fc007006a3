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
from ..runtime.search import Searcher, SearchOptions

TIMED_BACKENDS = {
    "torch-full": "PyTorch eager, full recompute every step (how the seed code decodes)",
    "torch-cache": "PyTorch eager with a KV cache",
    "ort-fp32": "ONNX Runtime fp32",
    "ort-int8-static": "ONNX Runtime, int8 Q/DQ graph (static, calibrated; on CPU its Q/DQ run as float ops)",
    "ort-int8-dynamic": "ONNX Runtime int8 dynamic",
    "ort-fp16": "ONNX Runtime fp16 on CUDA",
    "ort-fp32-graphs": "ONNX Runtime fp32, the device backend's steps captured as CUDA graphs and replayed "
                       "(on the CPU: the same backend, uncaptured)",
    "ort-fp16-graphs": "ONNX Runtime fp16 on CUDA, the device backend's steps captured as CUDA graphs and replayed",
    "ort-generate": "ONNX Runtime fp32, the whole search in generate.onnx (BeamSearch op, one input per call)",
    "tensorrt": "TensorRT fp16 engines (built from the fp32 graphs' fp16 version)",
    "ct2-fp32": "CTranslate2 float32 (same weights)",
    "ct2-int8": "CTranslate2 int8 (same weights)",
    "hf-generate": "transformers' own generate(), eager fp32 (a Hugging Face model directory's weights)",
    "hf-generate-fp16": "transformers' own generate(), eager fp16 on CUDA (a Hugging Face model directory's weights)",
    "cpp": "the C++ example's loop (examples/cpp, `make cpp`): ONNX Runtime fp32, decoder_step_search in place, "
           "a call's inputs as one batch",
}
DEVICES = ("cpu", "cuda")
GPU_ONLY = {"ort-fp16": "fp16 is for GPUs; time it with --device cuda",
            "ort-fp16-graphs": "fp16 is for GPUs; time it with --device cuda",
            "tensorrt": "TensorRT engines run on GPUs; time them with --device cuda",
            "hf-generate-fp16": "fp16 is for GPUs; time it with --device cuda"}
CPU_ONLY = {"ort-int8-dynamic":
            "its int8 operators (DynamicQuantizeLinear, MatMulInteger) are ONNX Runtime CPU kernels"}
# what `--device cuda` times by default: every GPU backend, and generate() as the anchor
GPU_BACKENDS = ("ort-fp32", "ort-fp32-graphs", "ort-fp16", "ort-fp16-graphs", "ort-generate", "tensorrt",
                "torch-cache", "hf-generate", "hf-generate-fp16")
# the device backend with its steps captured as CUDA graphs: a GPU measurement, so not in the CPU default
CUDA_GRAPHS = ("ort-fp32-graphs", "ort-fp16-graphs")
CPU_BACKENDS = tuple(name for name in TIMED_BACKENDS if name not in CUDA_GRAPHS)  # what `--device cpu` times
ONNX_VARIANTS = {"ort-fp32": "fp32", "ort-int8-static": "int8-static", "ort-int8-dynamic": "int8-dynamic",
                 "ort-fp16": "fp16", "ort-generate": "generate", "ort-fp32-graphs": "fp32", "ort-fp16-graphs": "fp16"}

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
    if device == "cpu" and name in GPU_ONLY:
        return GPU_ONLY[name]
    if device == "cuda" and name in CPU_ONLY:
        return f"CPU only: {CPU_ONLY[name]}"
    return None


def unavailable(name: str, artifacts: Artifacts, device: str = "cpu") -> str | None:
    """Why a backend cannot run here on `device`, or None."""
    if reason := wrong_device(name, device):
        return reason
    if name.startswith("hf-"):
        return _generate_unavailable(artifacts, device)
    if device == "cuda":
        problem = _no_gpu(name)
        if problem:
            return problem
    if name == "cpp":
        return _cpp_unavailable(artifacts)
    if name == "ort-generate" and artifacts.rules != SEED_RULES:
        return "generate.onnx is built for the seed's token layout; a Hugging Face model decodes with the loop"
    if name == "tensorrt" and artifacts.tensorrt is None:
        from ..runtime.tensorrt_platform import missing_reason
        return missing_reason() or "the engines could not be built (see the [bench] log)"
    if name in ONNX_VARIANTS and ONNX_VARIANTS[name] not in artifacts.onnx:
        return f"no {ONNX_VARIANTS[name]} model directory"
    if name.startswith("torch") and artifacts.checkpoint is None:
        return NO_CHECKPOINT
    if name.startswith("ct2") and artifacts.ctranslate2 is None:
        return artifacts.ctranslate2_unsupported or "CTranslate2 is not installed or the model could not be converted"
    return None


def _no_gpu(name: str) -> str | None:
    """Why `name` cannot run on a CUDA GPU here, or None."""
    if name.startswith("ct2"):
        import ctranslate2
        return None if ctranslate2.get_cuda_device_count() else "CTranslate2 sees no CUDA GPU"
    if name.startswith("torch"):
        import torch
        return None if torch.cuda.is_available() else "PyTorch sees no CUDA GPU"
    if name.startswith("ort") and not _has_cuda_provider():
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
    if name.startswith("ct2"):
        return _ctranslate2(artifacts, "int8" if name == "ct2-int8" else "float32", threads, device)
    if name.startswith("hf-"):
        return _generate(artifacts, name == "hf-generate-fp16", threads, device)
    if name == "cpp":
        return CppDecoder(artifacts.onnx["fp32"], threads)
    from ..runtime.backends import open_backend
    from ..runtime.search import LoopSearcher
    from ..runtime.session import SessionOptions
    if name.startswith("torch"):
        import torch
        if threads:
            torch.set_num_threads(threads)
        if name == "torch-full":
            from ..model.loading import load_checkpoint
            from .torch_full import TorchFullBackend
            return _searching(LoopSearcher(TorchFullBackend(load_checkpoint(artifacts.checkpoint).model)),
                              artifacts.rules)
        return _searching(open_backend(artifacts.checkpoint, "torch", device).searcher, artifacts.rules)
    if name == "tensorrt":
        return _searching(open_backend(artifacts.tensorrt, "tensorrt").searcher, artifacts.rules)
    options = SessionOptions(intra_op_threads=threads, device=device)
    if name in CUDA_GRAPHS:  # the device backend always, so that on the CPU it runs the same code uncaptured
        options = dataclasses.replace(options, cache="device", cuda_graphs=True)
    if name == "ort-generate":
        return _searching(open_backend(artifacts.onnx["generate"], "onnxruntime-generate", device, options).searcher,
                          artifacts.rules)
    return _searching(open_backend(artifacts.onnx[ONNX_VARIANTS[name]], "onnxruntime", device, options).searcher,
                      artifacts.rules)


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
