"""The benchmark's GPU plumbing, held on the CPU: the CUDA-graph backends (the device backend, uncaptured here),
cells in place of the whole grid, a failing backend reported in its row, the captured step's floor, and where the
step's nodes run."""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from support.common import DEMO_CKPT, tiny_config

from tfm_export.bench.placement import step_placement
from tfm_export.bench.protocol import BenchSettings, run_backends
from tfm_export.bench.runners import CPU_BACKENDS, CUDA_GRAPHS, GPU_BACKENDS, Artifacts
from tfm_export.cli.run_cli import main as run_main
from tfm_export.core.errors import TfmExportError
from tfm_export.graphs.inputs import random_sources
from tfm_export.runtime.backends import DEVICE
from tfm_export.runtime.session import SessionOptions, has_cuda_provider
from tfm_export.runtime.step_graph import StepOptions


def test_cuda_graph_backends_decode_as_ort_fp32_uncaptured_on_the_cpu_and_a_failing_backend_is_a_row(
        demo_onnx, monkeypatch):
    """ort-fp32-graphs is the device backend with capture asked for: on the CPU it runs uncaptured and must give
    ort-fp32's tokens; only the given cells are timed; a backend whose process raises (here the C++ example's
    binary, which cannot open the model) is a failed row, and the others are still timed."""
    monkeypatch.setenv("TFM_CPP_TRANSLATE", "/bin/false")  # a file that runs and fails: CppDecoder raises
    sources = [list(row[row != 1]) for row in random_sources(20, 6, 8, seed=3)]
    settings = BenchSettings(backends=("ort-fp32", "ort-fp32-graphs", "ort-fp16-graphs", "cpp"),
                             cells=((1, 1), (2, 3)), output_length=5, repeats=2, min_time=0, threads=1,
                             sweep_lengths=())
    results = {r.name: r for r in run_backends(Artifacts(None, {"fp32": demo_onnx}, None), sources, 5, 200,
                                               settings)}
    for name in ("ort-fp32", "ort-fp32-graphs"):
        assert [(row.beam, row.batch) for row in results[name].rows] == [(1, 1), (2, 3)], name
    assert results["ort-fp32-graphs"].agreement == 1.0 and results["ort-fp32-graphs"].outputs
    assert results["ort-fp16-graphs"].skipped == "fp16 is for GPUs; time it with --device cuda"
    assert results["cpp"].skipped.startswith("failed: the C++ translator cannot open")


def test_the_cuda_graph_backends_are_gpu_defaults_only_and_cells_are_checked():
    assert set(CUDA_GRAPHS) <= set(GPU_BACKENDS) and not set(CUDA_GRAPHS) & set(CPU_BACKENDS)
    assert BenchSettings(cells=((1, 1), (4, 32))).max_rows == 128
    assert BenchSettings(batch_sizes=(1, 3), beam_sizes=(1, 2)).grid == ((1, 1), (1, 3), (2, 1), (2, 3))
    for cells, message in (("4y32", "'4y32' is not BEAMxBATCH"), ("100x1", "values must be 1..64"),
                           ("1x0", "values must be 1..1024")):
        result = CliRunner().invoke(run_main, ["bench", "--model", str(DEMO_CKPT), "--cells", cells])
        assert result.exit_code == 2 and message in result.output, (cells, result.output)


def test_the_replay_floor_says_why_it_cannot_capture_here_and_times_a_step_bound_once():
    """Without CUDA the captured step's floor is a reason, not a number; the captured timing itself (every output
    bound once to memory of its own, sized by an uncaptured run) runs the same way on the CPU."""
    import torch

    from tfm_export.bench.kernel_floor import best_run_ms
    from tfm_export.bench.step_floor import exported_step, replay_ms, step_inputs
    from tfm_export.core.graph_spec import cache_names
    from tfm_export.model.transformer import Transformer
    torch.manual_seed(0)
    model = Transformer(tiny_config()).eval()
    names = cache_names(model.config)
    present = dict(zip(names.self_inputs, names.self_outputs, strict=True)).get
    with exported_step(model) as graph:
        if not has_cuda_provider():
            with pytest.raises(TfmExportError, match="CUDA graphs need ONNX Runtime's CUDA provider"):
                replay_ms(graph, model, 2, 3, 7, 5)
        ms = best_run_ms(graph, step_inputs(model, 2, 3, 7, 5), SessionOptions(intra_op_threads=1), present,
                         captured=True)
    assert 0 < ms < 1000


def test_placement_counts_the_step_nodes_where_they_ran_and_keeps_a_cuda_request_off_the_cpu(demo_onnx):
    """On the CPU every node of the chosen step graph ran on the CPU provider, with no Memcpy; a placement asked
    for on CUDA where ONNX Runtime has no CUDA provider is the strict device error, not a CPU profile."""
    in_place = step_placement(demo_onnx, SessionOptions(intra_op_threads=1), step=StepOptions(fused=False))
    device = step_placement(demo_onnx, SessionOptions(intra_op_threads=1), DEVICE)
    for placement in (in_place, device):
        assert placement.graph == "decoder_step_search" and placement.memcpy == 0
        assert list(placement.nodes) == ["CPUExecutionProvider"] and placement.nodes["CPUExecutionProvider"] > 50
        assert placement.line.startswith(f"decoder_step_search: {placement.nodes['CPUExecutionProvider']} nodes ran")
    if not has_cuda_provider():
        with pytest.raises(TfmExportError, match="--device cuda: this onnxruntime has no CUDAExecutionProvider"):
            step_placement(demo_onnx, SessionOptions(device="cuda"))
