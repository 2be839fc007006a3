"""The children: each step of a part that runs tfm_export, as a subcommand of gpu_check.py in a process of its own."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

from .harness import MISS


def child_translate(args: argparse.Namespace) -> int:
    """Translate the numbers as tfm-run does (Translator.load with the session options its flags make); with
    --against, compare line by line and pass when identical (exact) or at verify's floor for the precision."""
    from tfm_export.runtime.session import SessionOptions
    from tfm_export.runtime.translator import DecodeOptions, Translator
    lines = args.input.read_text(encoding="utf-8").splitlines()
    options = SessionOptions(device=args.device, cuda_graphs=args.cuda_graphs)
    start = time.perf_counter()
    translator = Translator.load(args.model, (), args.backend, options)
    got = [t.text for t in translator.translate(lines, DecodeOptions(beam_size=args.beam))]
    seconds = time.perf_counter() - start
    if args.perturb:
        got[-1] += MISS
    args.output.write_text("\n".join(got) + "\n", encoding="utf-8")
    if args.against is None:
        print(f"{args.label}: {len(got)} translations in {seconds:.1f} s")
        return 0
    want = args.against.read_text(encoding="utf-8").splitlines()
    return verdict(args.label, got, want, args.reference, args.floor, seconds)


def verdict(label: str, got: list[str], want: list[str], reference: str, floor: str, seconds: float) -> int:
    """Print how many translations equal the reference's and whether that passes: all of them (floor "exact") or
    verify's share for the precision (graphs.parity.MIN_AGREEMENT); exit status 0 or 1."""
    from tfm_export.graphs.parity import MIN_AGREEMENT
    same = sum(g == w for g, w in zip(got, want, strict=True))
    share = 1.0 if floor == "exact" else MIN_AGREEMENT[floor]
    passed = same == len(want) if floor == "exact" else same / len(want) >= share
    rule = "all required" if floor == "exact" else f"floor {100 * share:.1f}%"
    line = f"{label}: {same}/{len(want)} identical to {reference} ({rule}), {seconds:.1f} s"
    if not passed:
        first = next(i for i, (g, w) in enumerate(zip(got, want, strict=True)) if g != w)
        line += f"; line {first + 1}: {got[first]!r} where the reference has {want[first]!r}"
    print(line)
    return 0 if passed else 1


def child_placement(args: argparse.Namespace) -> int:
    from tfm_export.bench.placement import step_placement
    from tfm_export.runtime.session import SessionOptions
    print(f"{args.label} {step_placement(args.model, SessionOptions(device=args.device), args.backend).line}")
    return 0


def child_probe(args: argparse.Namespace) -> int:
    """One Add on the device, in a session made as tfm-run makes its own (onnxruntime.preload_dlls, providers
    checked after the session is built), with no PyTorch imported: the CUDA libraries found by ONNX Runtime alone."""
    import tempfile

    import numpy as np
    import onnx
    from onnx import TensorProto, helper

    from tfm_export.core.errors import TfmExportError
    from tfm_export.runtime.session import SessionOptions, open_session
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
    model = helper.make_model(helper.make_graph([helper.make_node("Add", ["x", "x"], ["y"])], "probe", [x], [y]),
                              opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "probe.onnx"
        onnx.save(model, path)
        try:
            session = open_session(path, SessionOptions(device=args.device))
        except TfmExportError as exc:
            print(f"no {args.device} session: {exc}")
            return 1
        result = session.run(None, {"x": np.ones(2, np.float32)})[0]
    if "torch" in sys.modules or result.tolist() != [2.0, 2.0]:
        print("the probe imported PyTorch or computed a wrong sum")
        return 1
    libraries = " (LD_LIBRARY_PATH: the nvidia wheels)" if "nvidia" in os.environ.get("LD_LIBRARY_PATH", "") else ""
    print(f"a {args.device} session without PyTorch runs on {', '.join(session.get_providers())}{libraries}")
    return 0


def child_marian(args: argparse.Namespace) -> int:
    """A random Marian directory (tfm_export.benchmarks.marian_shape's model) with a tokenizers-only tokenizer.json:
    words w2 ... of a WordLevel vocabulary, </s> 0 framing sources as MarianTokenizer does, <pad> last."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    from tfm_export.benchmarks.marian_shape import random_marian
    size = args.vocab_size
    vocab = {"</s>": 0, "<unk>": 1, **{f"w{i}": i for i in range(2, size - 1)}, "<pad>": size - 1}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.add_special_tokens(["</s>", "<unk>", "<pad>"])
    tokenizer.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 0)])
    args.output.mkdir(parents=True, exist_ok=True)
    random_marian(args.output, size, size - 1, **json.loads(args.sizes))
    tokenizer.save(str(args.output / "tokenizer.json"))
    print(f"wrote {args.output}: a random Marian model, vocabulary {size}, {args.sizes}")
    return 0


def child_tensorrt(args: argparse.Namespace) -> int:
    """fp16 TensorRT engines of the demo model built here and the numbers translated with them, greedy, against the
    CPU's fp32 at verify's fp16 floor; "skipped: why" where TensorRT or a GPU it supports is missing."""
    from tfm_export.runtime.tensorrt_platform import missing_reason
    why = missing_reason()
    if why:
        print(f"skipped: TensorRT engines not built or run: {why}")
        return 0
    from tfm_export.runtime.translator import Translator
    from tfm_export.trt.build import build_engines
    lines = args.input.read_text(encoding="utf-8").splitlines()
    want = [t.text for t in Translator.load(args.model).translate(lines)]
    start = time.perf_counter()
    build_engines(args.model, args.output, "fp16", force=True, progress=False)
    built = time.perf_counter() - start
    start = time.perf_counter()
    got = [t.text for t in Translator.load(args.output).translate(lines)]
    return verdict(f"TensorRT fp16 engines (built in {built:.0f} s), greedy", got, want, "the CPU's fp32", "fp16",
                   time.perf_counter() - start)


CHILDREN: dict[str, Callable[[argparse.Namespace], int]] = {
    "translate": child_translate, "placement": child_placement, "probe": child_probe, "marian": child_marian,
    "tensorrt": child_tensorrt}


def child_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpu_check.py", description="one step of the GPU check, in its own process")
    commands = parser.add_subparsers(dest="command", required=True)
    for name in ("translate", "placement"):
        command = commands.add_parser(name)
        command.add_argument("--model", type=Path, required=True)
        command.add_argument("--device", default="cpu")
        command.add_argument("--backend", default="onnxruntime")
        command.add_argument("--label", default="")
    translate = commands.choices["translate"]
    translate.add_argument("--cuda-graphs", action="store_true")
    translate.add_argument("--beam", type=int, default=1)
    translate.add_argument("--input", type=Path, required=True)
    translate.add_argument("--output", type=Path, required=True)
    translate.add_argument("--against", type=Path, default=None)
    translate.add_argument("--reference", default="the reference", help="what --against holds, for the report")
    translate.add_argument("--floor", default="exact", help="exact, or a precision of MIN_AGREEMENT")
    translate.add_argument("--perturb", action="store_true", help="change the last output line (a test's miss)")
    commands.add_parser("probe").add_argument("--device", default="cuda")
    tensorrt = commands.add_parser("tensorrt")
    for option in ("--model", "--output", "--input"):
        tensorrt.add_argument(option, type=Path, required=True)
    marian = commands.add_parser("marian")
    marian.add_argument("--output", type=Path, required=True)
    marian.add_argument("--vocab-size", type=int, required=True)
    marian.add_argument("--sizes", default="{}", help="JSON: MarianConfig sizes over opus-mt's")
    return parser
