"""The benchmark runs (tfm_export.benchmarks), each as `make bench` runs it, in one small round: they refuse a bad
setting before any work, time every backend they name, and report what they exist to measure."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from support.common import DEMO_CKPT

pytest.importorskip("ctranslate2", reason="CTranslate2 is in the dev/bench extras")


def test_interleaved_refuses_a_misspelt_setting_before_any_export(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "tfm_export.benchmarks.interleaved", "--model", str(DEMO_CKPT),
         "--work-dir", str(tmp_path / "work"), "--backends", "ort-fp32,ct2-fp32+thread=1", "--json",
         str(tmp_path / "r.json")], capture_output=True, text=True, timeout=120)
    assert result.returncode == 1 and "unknown CTranslate2 setting 'thread=1' in ct2-fp32+thread=1" in result.stderr
    assert not (tmp_path / "work").exists()


@pytest.mark.slow
def test_interleaved_runs_every_kind_of_backend_it_names(tmp_path):
    """interleaved (what `make bench` and `make bench-anchor` run), one small round: each backend kind it opens its
    own way times its cell, and the greedy output of ours equals CTranslate2's."""
    report = tmp_path / "report.json"
    result = subprocess.run(
        [sys.executable, "-m", "tfm_export.benchmarks.interleaved", "--model", str(DEMO_CKPT),
         "--work-dir", str(tmp_path / "work"), "--lengths", "16", "--batch-sizes", "2", "--beam-sizes", "2",
         "--threads", "1", "--rounds", "1", "--repeats", "1", "--min-time", "0",
         "--backends", "ort-fp32,ct2-fp32,ort-fp32-contract,ct2-fp32+threads=2", "--json", str(report)],
        capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    written = json.loads(report.read_text())
    results = written["rounds"][0]["results"]
    from tfm_export.bench.runners import cpp_binary
    from tfm_export.bench.targets import CPP_FIRST_LINE
    assert set(written["first_output_s"]) == {  # CTranslate2's first line at each of its settings' thread counts
        "tfm-run translate (fp32)", "ctranslate2 (float32, Python API, 2 threads)",
        "ctranslate2 (float32, Python API, 1 thread)", *([CPP_FIRST_LINE] if cpp_binary().is_file() else [])}
    assert {name: results[name]["cells"]["len 16, beam 2, batch 2"]["tokens_per_s"] > 0 for name in results} == \
        dict.fromkeys(("ort-fp32", "ct2-fp32", "ort-fp32-contract", "ct2-fp32+threads=2"), True)
    assert all(results[name]["agreement"] == 1.0 for name in ("ct2-fp32", "ort-fp32-contract", "ct2-fp32+threads=2"))


def test_fixed_shapes_reports_the_device_backends_wasted_rows(demo_onnx):
    """fixed_shapes (make bench): the device backend beside the in-place one on the held-out sentences, translations
    compared (a difference exits non-zero), each cell's wasted share of row-steps reported; rows finish at
    different steps there, so greedy batches of 8 waste some."""
    result = subprocess.run(
        [sys.executable, "-m", "tfm_export.benchmarks.fixed_shapes", "--model", str(demo_onnx), "--sentences", "16",
         "--batch-sizes", "8", "--beam-sizes", "1,4", "--rounds", "1", "--threads", "1"],
        capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    rows = re.findall(r"^\| (\d) \| 8 \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+)% \|$", result.stdout, re.M)
    assert [row[0] for row in rows] == ["1", "4"], result.stdout
    assert all(float(rate) > 0 for row in rows for rate in row[1:4]) and float(rows[0][4]) > 0, result.stdout


def test_startup_splits_the_first_translation(demo_onnx, tmp_path):
    """startup (make bench): tfm-run translate in fresh processes, with and without the graph
    cache, each start split into its phases and its memory, the phases adding up to the first line."""
    report = tmp_path / "phases.json"
    result = subprocess.run(
        [sys.executable, "-m", "tfm_export.benchmarks.startup", "--ort", str(demo_onnx), "--rounds", "1",
         "--variant", "off:TFM_PREPACKED_GRAPHS=off", "--json", str(report)],
        capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    runs = {name: rounds[0] for name, rounds in json.loads(report.read_text()).items()}
    assert sorted(runs) == [f"tfm-run {demo_onnx.parent.name}/{demo_onnx.name}",
                            f"tfm-run {demo_onnx.parent.name}/{demo_onnx.name} [off]"]
    for phases in runs.values():
        assert phases["imports"] + phases["load"] + phases["first batch"] == pytest.approx(phases["first line"])
        assert phases["session"] > 0 and phases["peak MB"] >= phases["private MB"] > 0, phases
    assert " first line " in result.stdout.splitlines()[0]


def test_prepacked_steps_times_both_loads(demo_onnx):
    """prepacked_steps (make bench): the directory loaded with and without its pre-packed graphs, every cell timed
    for each."""
    result = subprocess.run([sys.executable, "-m", "tfm_export.benchmarks.prepacked_steps", "--model", str(demo_onnx),
                             "--rounds", "1", "--max-length", "16"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    rows = re.findall(r"^\| (greedy|beam 4), batch \d \| (\d+) \| (\d+) \| [\d.]+ ", result.stdout, re.M)
    assert len(rows) == 3 and all(int(on) > 0 and int(off) > 0 for _, on, off in rows), result.stdout

