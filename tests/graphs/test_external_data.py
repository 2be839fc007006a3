"""The external layout, which every model past 2 GB of weights gets (`--weights external` forces it at any size): each
graph's weights in one shared file, each tensor once, and every later stage reading it. Made here from the demo
checkpoint, so that the oracles are the trained model's: PyTorch's reference decoders (verify), the fp32 directory
for its precisions (verify's floors), and tfm-run on the same directory, itself held to PyTorch, for generate.onnx.
The C++, Node and Triton runs of this layout are in their own modules (tests/examples, tests/serving)."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
from pathlib import Path

import onnx
import pytest
from click.testing import CliRunner
from support.common import CALIBRATION, DEMO_CKPT, REPO

from tfm_export import DecodeOptions, Translator
from tfm_export.artifacts.model_dir import DATA_KEY, WEIGHTS_FILE, read_manifest
from tfm_export.cli.export_cli import main as export_main
from tfm_export.cli.run_cli import main as run_main
from tfm_export.core import stamps as stamps_module
from tfm_export.demo import numbers as demo_numbers
from tfm_export.graphs.generate_dir import write_generate_dir
from tfm_export.graphs.parity import DEFAULT_TOLERANCE
from tfm_export.graphs.pipeline import PARITY_OPTIONS, check_parity
from tfm_export.graphs.weights import ALIGNMENT, INLINE_MAX_BYTES
from tfm_export.model.loading import load_checkpoint
from tfm_export.runtime.backends import CONCAT, open_backend
from tfm_export.runtime.prepacked_graphs import PREPACKED_DIR

SAMPLES = REPO / "models" / "demo" / "samples.en.txt"
TEXTS = [en for en, _ in demo_numbers.held_out_pairs()[:64]]


def _weight_sizes(checkpoint: Path) -> list[int]:
    """The bytes of each of the checkpoint's tensors, each storage once (a tied table is one)."""
    state = load_checkpoint(checkpoint).model.state_dict()
    return [t.untyped_storage().nbytes() for t in {t.untyped_storage().data_ptr(): t for t in state.values()}.values()]


def test_every_graph_reads_one_file_holding_each_weight_once(demo_external):
    manifest = read_manifest(demo_external)
    assert {entry[DATA_KEY] for entry in manifest["graphs"].values()} == {WEIGHTS_FILE}
    assert WEIGHTS_FILE in manifest["files"]
    for entry in manifest["graphs"].values():
        proto = onnx.load(str(demo_external / entry["file"]), load_external_data=False)
        inline = [i.name for i in proto.graph.initializer if i.data_location != onnx.TensorProto.EXTERNAL
                  and len(i.raw_data) > INLINE_MAX_BYTES]
        assert not inline, (entry["file"], inline)
        assert (demo_external / entry["file"]).stat().st_size < 200_000  # structure only
    data = (demo_external / WEIGHTS_FILE).stat().st_size
    external = [size for size in _weight_sizes(DEMO_CKPT) if size > INLINE_MAX_BYTES]
    assert sum(external) <= data < sum(external) + ALIGNMENT * len(external), data  # once each, aligned


def test_verify_holds_it_to_pytorch(demo_external):
    result = CliRunner().invoke(export_main, ["verify", "--model", str(demo_external), "--checkpoint", str(DEMO_CKPT),
                                              "--input", str(SAMPLES)])
    assert result.exit_code == 0, result.output
    assert "parity OK" in result.output


def test_a_load_opens_its_prepacked_graphs_and_hashes_nothing_stamped(demo_external, tmp_path, caplog, monkeypatch):
    """Export stamped the shared file with the rest: the load reads none of the directory to check it, and the
    translations are those of the load that hashes everything and opens the directory's own graphs."""
    hashed = []
    real = stamps_module.file_sha256
    monkeypatch.setattr(stamps_module, "file_sha256", lambda path: hashed.append(path) or real(path))
    with caplog.at_level(logging.INFO):
        cached = [r.text for r in Translator.load(demo_external).translate(TEXTS, DecodeOptions(beam_size=4))]
    assert "opened from its pre-packed graphs" in caplog.text and hashed == []
    monkeypatch.setenv("TFM_PREPACKED_GRAPHS", "off")
    copy = Path(shutil.copytree(demo_external, tmp_path / "copy", ignore=shutil.ignore_patterns(PREPACKED_DIR)))
    plain = Translator.load(copy).translate(TEXTS, DecodeOptions(beam_size=4))
    assert cached == [r.text for r in plain]


def test_the_export_check_reads_the_weights_where_they_lie(demo_external, caplog, monkeypatch):
    """Export's own check against PyTorch on this layout hashes nothing the export stamped, opens no pre-packed graph
    (the weights read where they lie: none packed or folded into a copy), and gives both sessions of the contract's
    decoder the one mapped tied table; its differences are within the tolerance."""
    hashed = []
    real = stamps_module.file_sha256
    monkeypatch.setattr(stamps_module, "file_sha256", lambda path: hashed.append(path) or real(path))
    with caplog.at_level(logging.INFO):
        worst = check_parity(load_checkpoint(DEMO_CKPT), demo_external)
    assert hashed == [] and "pre-packed graphs" not in caplog.text
    assert worst <= DEFAULT_TOLERANCE.atol
    backend = open_backend(demo_external, CONCAT, PARITY_OPTIONS).backend
    table = load_checkpoint(DEMO_CKPT).config.tied_table
    assert [tuple(value.shape()) for value in backend.shared.values()] == [table]


@pytest.fixture(scope="module")
def quantized(demo_external, tmp_path_factory) -> dict[str, Path]:
    """int8 dynamic, int8 static (calibrated on 64 sentences) and fp16, made from the external directory."""
    root = tmp_path_factory.mktemp("external-precisions")
    calibration = root / "calibration.txt"
    calibration.write_text("\n".join(CALIBRATION.read_text().splitlines()[:64]) + "\n")
    made = {"int8-dynamic": ["--precision", "int8", "--mode", "dynamic"],
            "int8-static": ["--precision", "int8", "--calibration", str(calibration)],
            "fp16": ["--precision", "fp16"]}
    for name, args in made.items():
        result = CliRunner().invoke(export_main, ["quantize", "--model", str(demo_external), *args,
                                                  "--output", str(root / name)])
        assert result.exit_code == 0, result.output
    return {name: root / name for name in made}


@pytest.mark.parametrize("precision", ["int8-dynamic", "int8-static", "fp16"])
def test_quantize_keeps_the_layout_and_meets_verify_floors(quantized, precision):
    directory = quantized[precision]
    manifest = read_manifest(directory)
    assert {entry.get(DATA_KEY) for entry in manifest["graphs"].values()} == {WEIGHTS_FILE}
    assert sorted(p.name for p in directory.glob("*.data")) == [WEIGHTS_FILE]
    result = CliRunner().invoke(export_main, ["verify", "--model", str(directory), "--input", str(SAMPLES)])
    assert result.exit_code == 0, result.output


def test_int8_stores_the_decoder_weights_once_for_all_its_step_graphs(quantized, demo_external):
    """decoder_step and decoder_step_search quantize the same weights to the same bytes: stored once."""
    data = (quantized["int8-dynamic"] / WEIGHTS_FILE).stat().st_size
    assert data < 0.4 * (demo_external / WEIGHTS_FILE).stat().st_size


def test_generate_wraps_the_shared_weights_and_decodes_as_tfm_run(demo_external, tmp_path):
    """write_generate_dir holds generate.onnx to the decoding loop itself (check_generate); here tfm-run on the
    new directory through generate.onnx against tfm-run on the source directory, greedy and beam 4."""
    out = tmp_path / "gen"
    write_generate_dir(demo_external, out, progress=False)
    assert json.loads((out / "manifest.json").read_text())["generate"]["file"] == "generate.onnx"
    assert (out / "generate.onnx").stat().st_size < 500_000  # the weights stay in the shared file
    for beam in ("1", "4"):
        got, want = (CliRunner().invoke(run_main, ["translate", "--model", str(model), "--beam-size", beam,
                                                   *backend, *TEXTS[:16]])
                     for model, backend in ((out, ("--backend", "onnxruntime-generate")), (demo_external, ())))
        assert got.exit_code == want.exit_code == 0, (got.output, want.output)
        assert got.output == want.output


def test_bench_times_it(demo_external, tmp_path):
    result = CliRunner().invoke(run_main, ["bench", "--model", str(demo_external), "--backends", "ort-fp32",
                                           "--batch-sizes", "2", "--beam-sizes", "1", "--output-length", "8",
                                           "--repeats", "2", "--min-time", "0", "--json", str(tmp_path / "b.json")])
    assert result.exit_code == 0, result.output
    [row] = json.loads((tmp_path / "b.json").read_text())["backends"]["ort-fp32"]["rows"]
    assert row["tokens_per_s"] > 0


def test_check_builds_it_in_tensorrt_rtx(demo_external):
    pytest.importorskip("tensorrt_rtx_bindings", reason="TensorRT-RTX (the rtx extra) is not installed")
    result = CliRunner().invoke(export_main, ["check", "--model", str(demo_external)])
    assert result.exit_code == 0, result.output


@pytest.fixture
def threshold_at(monkeypatch):
    """The external layout's threshold lowered (protobuf's 2 GB are beyond a test's models): the tiny and demo
    models count as large."""
    from tfm_export.graphs import pipeline, saving

    def lower(size: int) -> None:
        for module in (pipeline, saving):
            monkeypatch.setattr(module, "EXTERNAL_DATA_BYTES", size)
    return lower


def test_auto_takes_the_external_layout_past_the_threshold_and_inline_is_refused_there(threshold_at, tmp_path):
    threshold_at(1 << 20)  # the demo's 5.8 MB of weights are past it
    result = CliRunner().invoke(export_main, ["onnx", "--checkpoint", str(DEMO_CKPT), "--output",
                                              str(tmp_path / "inline"), "--weights", "inline"])
    assert result.exit_code == 1 and result.output.count("\n") == 1, result.output
    assert "--weights inline" in result.output and "use --weights external" in result.output
    assert not list(tmp_path.iterdir())  # refused before any work
    result = CliRunner().invoke(export_main, ["onnx", "--checkpoint", str(DEMO_CKPT), "--output",
                                              str(tmp_path / "auto")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "auto" / WEIGHTS_FILE).is_file()
    assert sorted(p.name for p in (tmp_path / "auto" / PREPACKED_DIR).iterdir()) == ["stamps.json"]  # no pre-packing


def test_a_translation_this_machine_cannot_hold_is_refused_before_loading(demo_external, monkeypatch):
    """The encoder's files and the largest decoder's, the shared weights file once, and RUN_EXTRA_BYTES: one byte
    short of that is one line before any session is opened; exactly that translates."""
    from tfm_export.runtime import backends
    weights = (demo_external / WEIGHTS_FILE).stat().st_size
    graphs = {p.name: p.stat().st_size for p in demo_external.glob("*.onnx")}
    needed = weights + graphs["encoder.onnx"] + max(v for k, v in graphs.items() if k != "encoder.onnx") \
        + backends.RUN_EXTRA_BYTES
    args = ["translate", "--model", str(demo_external), "seven"]
    monkeypatch.setattr(backends, "total_memory_bytes", lambda: needed - 1)
    result = CliRunner().invoke(run_main, args)
    assert result.exit_code == 1 and result.output.count("\n") == 1, result.output
    assert f"needs about {needed / 1e9:.1f} GB of memory" in result.output and "quantize it" in result.output
    monkeypatch.setattr(backends, "total_memory_bytes", lambda: needed)
    result = CliRunner().invoke(run_main, args)
    assert result.exit_code == 0 and result.output.strip(), result.output


def test_a_quantization_this_machine_cannot_hold_is_refused_before_any_work(demo_external, monkeypatch, tmp_path):
    """The largest graph's weights (their lengths in its structure), the tied table twice and the extra: the needed
    bytes against a machine that has one byte less; nothing is written."""
    import math

    from tfm_export.artifacts.model_dir import ModelDir
    from tfm_export.core.config import ModelConfig
    from tfm_export.graphs.onnx_io import graph_weight_bytes
    from tfm_export.precision import pipeline
    manifest, directory = read_manifest(demo_external), ModelDir.read(demo_external)
    largest = max(graph_weight_bytes(directory, graph) for graph in manifest["graphs"])
    assert largest > 0.3 * (demo_external / WEIGHTS_FILE).stat().st_size
    needed = largest + 2 * 4 * math.prod(ModelConfig.from_dict(manifest["model"]).tied_table) \
        + pipeline.QUANTIZE_EXTRA_BYTES
    monkeypatch.setattr(pipeline, "total_memory_bytes", lambda: needed - 1)
    result = CliRunner().invoke(export_main, ["quantize", "--model", str(demo_external), "--precision", "int8",
                                              "--mode", "dynamic", "--output", str(tmp_path / "int8")])
    assert result.exit_code == 1 and result.output.count("\n") == 1, result.output
    assert f"needs about {needed / 1e9:.1f} GB of memory" in result.output and "larger machine" in result.output
    assert not list(tmp_path.iterdir())


def test_a_model_this_machine_cannot_hold_is_refused_before_any_work(monkeypatch, tmp_path):
    from tfm_export.graphs import saving
    monkeypatch.setattr(saving, "total_memory_bytes", lambda: 1 << 30)  # a 1 GB machine: the extra alone is more
    result = CliRunner().invoke(export_main, ["onnx", "--checkpoint", str(DEMO_CKPT), "--output", str(tmp_path / "m")])
    assert result.exit_code == 1 and result.output.count("\n") == 1, result.output
    assert "needs about 1.6 GB of memory" in result.output and "this machine has 1.1 GB" in result.output
    assert not list(tmp_path.iterdir())


def test_a_disk_that_fills_mid_export_leaves_nothing(tmp_path):
    """A tmpfs holding the weights once (the check before any work passes) but not the whole directory."""
    mount = tmp_path / "small"
    mount.mkdir()
    size = sum(_weight_sizes(DEMO_CKPT)) + 8192  # the weights, not their alignment, graphs and manifest too
    if subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount)],
                      capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (not root?)")
    try:
        result = CliRunner().invoke(export_main, ["onnx", "--checkpoint", str(DEMO_CKPT), "--output",
                                                  str(mount / "m"), "--weights", "external"])
        assert result.exit_code == 1 and result.output.count("\n") == 1, result.output
        assert "No space left on device" in result.output and "nothing was written" in result.output
        assert list(mount.iterdir()) == []
        unmounted = subprocess.run(["umount", str(mount)], capture_output=True, text=True)
        assert unmounted.returncode == 0, f"a file on the full disk is still open: {unmounted.stderr}"
    finally:
        if os.path.ismount(mount):
            subprocess.run(["umount", "--lazy", str(mount)], capture_output=True)
