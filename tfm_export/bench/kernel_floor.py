"""How fast any decoder step ONNX Runtime runs could be here, at batch 1: only the MatMuls by the weights one
greedy step reads (no attention over the cache, no norms, no search around it), as one graph of ONNX Runtime's
own kernels, timed at its best. A speed target that needs a whole step faster than this needs other kernels
than ONNX Runtime's CPU ones, not another graph or loop around them."""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnxruntime as ort
from torch import nn

from ..core.graph_spec import DEFAULT_OPSET
from ..runtime.session import SessionOptions, open_session

ONCE_PER_SOURCE = ("enc_attn.w_ks", "enc_attn.w_vs")  # applied to the encoder output once, not per step
FUSED_QKV = ("slf_attn.w_qs", "slf_attn.w_ks", "slf_attn.w_vs")  # read by one step as one matrix
RUNS = 40


def step_matmuls(model: nn.Module) -> list[tuple[int, int]]:
    """(in, out) of each MatMul by a weight in one decoder step, grouped as one matrix
    (a layer's self-attention Q, K and V in one), the output projection last."""
    shapes: dict[str, list[int]] = {}
    for name, module in model.decoder.named_modules():
        if not isinstance(module, nn.Linear) or name.endswith(ONCE_PER_SOURCE):
            continue
        key = name.rsplit(".", 1)[0] if name.endswith(FUSED_QKV) else name
        shapes.setdefault(key, [module.in_features, 0])[1] += module.out_features
    projection = model.trg_word_prj
    return [(i, o) for i, o in shapes.values()] + [(projection.in_features, projection.out_features)]


def _save_graph(shapes: list[tuple[int, int]], path: Path) -> None:
    """One MatMul per shape, each from its own input row, every product an output (nothing is skipped); the
    weights in a file beside it (a large model's step reads more than protobuf's 2 GB)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(0)
    widths = sorted({i for i, _ in shapes})
    inputs = [helper.make_tensor_value_info(f"x{w}", TensorProto.FLOAT, [1, w]) for w in widths]
    nodes = [helper.make_node("MatMul", [f"x{i}", f"w{n}"], [f"y{n}"]) for n, (i, _) in enumerate(shapes)]
    weights = [numpy_helper.from_array(rng.standard_normal(shape, dtype=np.float32), f"w{n}")
               for n, shape in enumerate(shapes)]
    outputs = [helper.make_tensor_value_info(f"y{n}", TensorProto.FLOAT, [1, o]) for n, (_, o) in enumerate(shapes)]
    graph = helper.make_graph(nodes, "step_matmuls", inputs, outputs, weights)
    onnx.save_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", DEFAULT_OPSET)]), str(path),
                    save_as_external_data=True, location=f"{path.name}.data")


def best_run_ms(path: Path, feeds: dict[str, np.ndarray], options: SessionOptions,
                alias: Callable[[str], str | None] = lambda name: None, captured: bool = False) -> float:
    """Best of RUNS runs (the first, which allocates, left out) of the graph opened as tfm-run opens its own,
    inputs and outputs bound once, as tfm-run's step binds them; alias(input) names an output bound to that
    input's own memory (a buffer the graph writes in place). On a GPU (options.device "cuda") every input and
    output lives in its memory, as tfm-run's device backend keeps them, and each run ends synchronised.
    captured: the run captured once as a CUDA graph (with options.cuda_graphs on CUDA) and replayed, as the device
    backend replays its steps: a replay writes to the addresses it was captured with, so every output is bound to
    memory of its own, sized by one uncaptured run first."""
    session = open_session(path, options, capture=captured)
    binding = session.io_binding()
    values = {name: ort.OrtValue.ortvalue_from_numpy(value, options.placed, 0) for name, value in feeds.items()}
    for name, value in values.items():
        binding.bind_ortvalue_input(name, value)
    aliased = {alias(name): value for name, value in values.items() if alias(name)}
    outputs = [output.name for output in session.get_outputs()]
    for name in outputs:
        if name in aliased:
            binding.bind_ortvalue_output(name, aliased[name])
        else:
            binding.bind_output(name, options.placed)
    run = None
    if captured:
        session.run_with_iobinding(binding, graph_run_options(-1))
        for name, value in zip(outputs, binding.get_outputs(), strict=True):
            if name not in aliased:
                binding.bind_ortvalue_output(name, ort.OrtValue.ortvalue_from_numpy(value.numpy(), options.placed, 0))
        run = graph_run_options(1)
    times = []
    for _ in range(RUNS):
        start = time.perf_counter()
        session.run_with_iobinding(binding, run)
        times.append(time.perf_counter() - start)
    return 1e3 * min(times[1:])


def graph_run_options(graph_id: int) -> ort.RunOptions:
    """A run that captures (or replays) CUDA graph `graph_id`; -1: a run that captures nothing. ONNX Runtime
    keeps one graph per id in a session; 0 is its default id, which the runtime's device backend leaves unused."""
    run = ort.RunOptions()
    run.add_run_config_entry("gpu_graph_id", str(graph_id))
    return run


def matmul_floor_ms(model: nn.Module, threads: int = 0) -> dict[str, float]:
    """Best time of the step's MatMuls with threads spinning within a run (tfm-run's default) and sleeping:
    the lower is the floor."""
    shapes = step_matmuls(model)
    feeds = {f"x{width}": np.ones((1, width), np.float32) for width in {i for i, _ in shapes}}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "step_matmuls.onnx"
        _save_graph(shapes, path)
        return {"spinning" if spinning else "sleeping":
                best_run_ms(path, feeds, SessionOptions(intra_op_threads=threads, spinning=spinning))
                for spinning in (False, True)}
