"""scripts/gpu_check.py, the one-call check for a lent GPU machine, rehearsed on this CPU machine: the same steps on
the CPU execution provider, with what the lent machine lacks hidden from its processes, so that a missing file,
package or flag fails here; and a miss on the device side fails the run, saying which check in one line."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from support.common import REPO

SCRIPT = REPO / "scripts" / "gpu_check.py"


@pytest.fixture(scope="module")
def work(tmp_path_factory, demo_onnx, demo_generate) -> Path:
    """The script's work folder, holding the demo directories the test session made already (the script keeps
    what it finds there, as on a rerun on the GPU machine); the rest it makes itself."""
    work = tmp_path_factory.mktemp("gpu-check") / "work"
    work.mkdir()
    (work / "demo-fp32").symlink_to(demo_onnx)
    (work / "demo-generate").symlink_to(demo_generate)
    return work


def _rehearse(out: Path, work: Path, *options: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), "--rehearse", "--out", str(out), "--work", str(work),
                           "--numbers", "8", *options], capture_output=True, text=True, timeout=1200)


def test_the_rehearsal_runs_every_part_end_to_end(work, tmp_path):
    """env, parity and speed pass on the CPU: packages absent from the lent machine are absent here too, the wheel
    pieces are joined and installed as onnxruntime-gpu's would be, every comparison of the device backend with the
    CPU's is exact (fp16/int8 at their floors), and the bench times the CUDA-graph backend with ort-fp32's tokens;
    the GPU-only backends are skipped with their reason, which does not fail a rehearsal."""
    out = tmp_path / "out"
    done = _rehearse(out, work)
    assert done.returncode == 0, done.stdout[-4000:]
    assert done.stdout.rstrip().endswith("result: passed")
    checks = json.loads((out / "summary.json").read_text())["checks"]
    status = {c["name"]: c["status"] for c in checks}
    lines = {c["name"]: c["line"] for c in checks}
    assert "absent: sentencepiece, num2words, polygraphy, ctranslate2, tensorrt; present: none" in lines["versions"]
    assert f"tfm_export from {REPO / 'tfm_export'}" in lines["versions"]
    assert "tfm_probe-1.0-py3-none-any.whl (" in lines["wheel pieces"]
    device_side = [name for name in status if "cpu device backend" in name]
    assert len(device_side) == 6 and {status[name] for name in device_side} == {"ok"}
    assert "8/8 identical to cpu fp32 beam 4 (all required)" in lines["fp32 beam 4, cpu device backend, CUDA graphs"]
    assert status["int8 beam 1, cpu"] == status["generate beam 4, cpu"] == "ok"
    for name in ("placement fp32", "placement fp16"):
        assert "decoder_step_search:" in lines[name] and "0 Memcpy" in lines[name]
    assert status["ort-fp32-graphs"] == "ok" and "agreement with ort-fp32 1.0" in lines["ort-fp32-graphs"]
    assert {status[name] for name in ("ort-fp16", "ort-fp16-graphs", "hf-generate-fp16")} == {"skipped"}
    assert status["hf-generate"] == "ok" and (out / "bench.md").exists()
    assert status["tensorrt"] == "skipped" and lines["tensorrt"].startswith("skipped: TensorRT engines not built")
    assert not [c for c in checks if c["status"] not in ("ok", "skipped")]


def test_a_miss_on_the_device_side_fails_the_run_in_one_line(work, tmp_path):
    """One device-side translation changed (--inject-miss): the run exits 1 and its summary names the check, the
    count and the first line that differs; the check beside it still runs and passes."""
    out = tmp_path / "out"
    done = _rehearse(out, work, "--parts", "parity", "--only", "fp32 beam 1, cpu device backend", "--inject-miss")
    assert done.returncode == 1, done.stdout[-4000:]
    summary = done.stdout.split("== summary")[-1].splitlines()
    failed = [line for line in summary if line.startswith("FAILED")]
    assert len(failed) == 1 and re.fullmatch(r"result: FAILED \(1 of \d+ checks\)", summary[-1]), summary
    assert failed[0].startswith("FAILED  parity: fp32 beam 1, cpu device backend: 7/8 identical to cpu fp32 beam 1 "
                                "(all required)")
    assert "; line 8: '" in failed[0] and "<injected miss>' where the reference has '" in failed[0]
    assert "ok      parity: fp32 beam 1, cpu device backend, CUDA graphs: 8/8 identical" in done.stdout


def test_wheel_pieces_are_named_from_the_wheel_and_a_missing_or_broken_piece_is_one_line(tmp_path, monkeypatch):
    """onnxruntime-gpu reaches the GPU machine as pieces without its file name: the name pip needs comes from the
    wheel's own tags (all of them); a gap in the pieces, or pieces that do not make a whole zip, stop with one line
    before pip runs."""
    import zipfile
    monkeypatch.syspath_prepend(str(SCRIPT.parent))  # as the script runs: scripts/ first on the path
    from gpu_parts import env as gpu_check  # its env part, which imports nothing heavy
    from gpu_parts.harness import CheckError
    wheel = tmp_path / "joined.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("onnxruntime/__init__.py", "")
        archive.writestr("onnxruntime_gpu-1.31.1.dist-info/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: false\n"
                         "Tag: cp312-cp312-manylinux_2_27_x86_64\nTag: cp312-cp312-manylinux_2_28_x86_64\n")
    assert gpu_check.wheel_name(wheel) == \
        "onnxruntime_gpu-1.31.1-cp312-cp312-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl"
    gpu_check.split(wheel, tmp_path / "parts", 100)
    pieces = sorted((tmp_path / "parts").iterdir())
    assert len(pieces) > 2
    pieces[1].unlink()
    with pytest.raises(CheckError, match="one is missing; send every piece"):
        gpu_check.install_pieces([tmp_path / "parts"], tmp_path / "target", sys.executable)
    pieces[-1].rename(pieces[1])  # every name there, the bytes not in order: not a zip
    with pytest.raises(CheckError, match="are not a whole wheel: send every piece of one download"):
        gpu_check.install_pieces([tmp_path / "parts"], tmp_path / "target", sys.executable)
