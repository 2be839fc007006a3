"""runtime.session on a machine without a GPU: --device cuda either gets every session on the CUDA provider or
stops with one line, never a CPU decode; fp32 on CUDA is fp32 (TF32 only when asked); CUDA graphs only for the
step graphs of the device backend."""

from __future__ import annotations

import onnxruntime as ort
import pytest
from click.testing import CliRunner

from tfm_export.cli.run_cli import main as run_main
from tfm_export.runtime.session import CUDA_PROVIDER, SessionOptions, preload_cuda_libraries, providers


def test_a_cuda_session_onnx_runtime_built_for_the_cpu_is_one_line_not_a_cpu_decode(demo_onnx, monkeypatch):
    """ONNX Runtime lists CUDA but cannot load its libraries: it warns and builds a CPU-only session. Here the CPU
    build is made to list CUDA, so the session it builds is exactly that one."""
    monkeypatch.setattr(ort, "get_available_providers", lambda: [CUDA_PROVIDER, "CPUExecutionProvider"])
    result = CliRunner().invoke(run_main, ["translate", "--model", str(demo_onnx), "--device", "cuda", "forty-two"])
    assert result.exit_code == 1 and len(result.output.strip().splitlines()) == 1, result.output
    assert "runs this graph on CPUExecutionProvider only: its CUDAExecutionProvider could not load" in result.output
    assert "quarante" not in result.output


def test_translate_on_a_cpu_only_onnx_runtime_with_device_cuda_is_one_line(demo_onnx):
    result = CliRunner().invoke(run_main, ["translate", "--model", str(demo_onnx), "--device", "cuda", "forty-two"])
    assert result.exit_code == 1 and len(result.output.strip().splitlines()) == 1, result.output
    assert "no CUDAExecutionProvider" in result.output


@pytest.mark.parametrize("tf32, graphs, capture, expected", [
    (False, False, False, {"use_tf32": "0"}), (True, False, False, {"use_tf32": "1"}),
    (False, True, True, {"use_tf32": "0", "enable_cuda_graph": "1"}), (False, True, False, {"use_tf32": "0"}),
    (False, False, True, {"use_tf32": "0"})])
def test_the_cuda_provider_gets_fp32_and_graphs_only_as_asked(tf32, graphs, capture, expected, monkeypatch):
    loaded = []
    monkeypatch.setattr(ort, "preload_dlls", lambda *a, **k: loaded.append(1), raising=False)
    preload_cuda_libraries.cache_clear()
    chosen = providers(SessionOptions(device="cuda", tf32=tf32, cuda_graphs=graphs), capture)
    assert chosen == [(CUDA_PROVIDER, expected), "CPUExecutionProvider"] and loaded == [1]
    assert providers(SessionOptions(), capture) == ["CPUExecutionProvider"]


def test_fp32_on_cuda_is_fp32_by_default(monkeypatch):
    """What every library user of SessionOptions() gets, without the CLI's explicit flag: TF32 off."""
    monkeypatch.setattr(ort, "preload_dlls", lambda *a, **k: None, raising=False)
    preload_cuda_libraries.cache_clear()
    assert providers(SessionOptions(device="cuda")) == [(CUDA_PROVIDER, {"use_tf32": "0"}), "CPUExecutionProvider"]
