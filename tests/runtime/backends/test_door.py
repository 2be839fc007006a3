"""The door (runtime/backends/__init__.py): what a path is decided once, the one table of backends by name and the
default chosen for a path and device, and what it opened handed back with the searcher."""

from __future__ import annotations

import json
import shutil

import pytest

from tfm_export.artifacts.manifest import ENGINE_FORMAT, MANIFEST
from tfm_export.artifacts.model_dir import ModelDir
from tfm_export.core.errors import TfmExportError
from tfm_export.runtime.backends import (
    BACKENDS,
    CONCAT,
    DEVICE,
    GENERATE,
    INPLACE,
    ONNXRUNTIME,
    TENSORRT,
    TORCH,
    Given,
    backend_names,
    classify,
    default_for,
    open_backend,
)


def test_a_path_is_classified_once(flat, tmp_path):
    """A checkpoint file, a model directory, an engine directory by its manifest's format, and a directory without
    a manifest (a Hugging Face model's): each its own Given, and each backend refuses the others in one line."""
    ckpt, model = flat
    source = tmp_path / "hf"
    source.mkdir()
    (source / "config.json").write_text("{}")
    engines = tmp_path / "engines"
    shutil.copytree(model, engines)
    manifest = json.loads((engines / MANIFEST).read_text())
    (engines / MANIFEST).write_text(json.dumps({**manifest, "format": ENGINE_FORMAT}))
    assert [classify(p) for p in (ckpt.path, model, engines, source)] == [
        Given.CHECKPOINT, Given.MODEL_DIR, Given.ENGINE_DIR, Given.MODEL_SOURCE_DIR]
    with pytest.raises(TfmExportError, match="not a tfm-export model directory"):
        open_backend(source)  # by default ONNX Runtime's opener, which says what the directory is not
    with pytest.raises(TfmExportError, match="is a checkpoint"):
        open_backend(ckpt.path, "onnxruntime")
    with pytest.raises(TfmExportError, match="is a model directory; the torch backend takes"):
        open_backend(model, "torch")


def test_opened_hands_back_the_directory_it_opened(flat):
    ckpt, model = flat
    for backend in (CONCAT, INPLACE):
        opened = open_backend(model, backend)
        assert isinstance(opened.source, ModelDir) and opened.source.path == model
    assert open_backend(ckpt.path, "torch").source is None  # a checkpoint: no directory


def test_one_table_names_each_backend_and_default_for_picks_by_directory_and_device(flat, tmp_path):
    """Six concrete backends by name. default_for: TensorRT for engines, PyTorch for a checkpoint, else ONNX
    Runtime's step backend: in place on the CPU, on the device on a GPU, the contract's concat cache where the
    directory has no decoder_step_search. Each name opens its own backend class, on the device the options give."""
    _, model = flat
    assert set(BACKENDS) == {CONCAT, INPLACE, DEVICE, GENERATE, TENSORRT, TORCH}
    assert backend_names() == [ONNXRUNTIME, *BACKENDS]
    assert [default_for(model, Given.MODEL_DIR, device) for device in (None, "cpu", "cuda")] == [INPLACE, INPLACE,
                                                                                                 DEVICE]
    assert [default_for(model, given, "cpu") for given in (Given.ENGINE_DIR, Given.CHECKPOINT)] == [TENSORRT, TORCH]
    no_search = tmp_path / "no-search"
    shutil.copytree(model, no_search)
    manifest = json.loads((no_search / MANIFEST).read_text())
    for graph in ("decoder_step_search", "decoder_step_search_fused"):
        del manifest["graphs"][graph]
        del manifest["files"][f"{graph}.onnx.data"]
        for name in (f"{graph}.onnx", f"{graph}.onnx.data"):
            (no_search / name).unlink()
    (no_search / MANIFEST).write_text(json.dumps(manifest))
    assert default_for(no_search, Given.MODEL_DIR, "cpu") == CONCAT
    assert type(open_backend(no_search).backend).__name__ == "ConcatBackend"
    opened = {name: open_backend(model, name).backend for name in (ONNXRUNTIME, CONCAT, INPLACE, DEVICE)}
    assert {name: type(b).__name__ for name, b in opened.items()} == {
        ONNXRUNTIME: "InPlaceBackend", CONCAT: "ConcatBackend", INPLACE: "InPlaceBackend", DEVICE: "DeviceBackend"}
    assert opened[DEVICE].device == "cpu"  # the GPU path rehearsed: the device is the options', nowhere else
    with pytest.raises(TfmExportError, match=f"unknown backend 'in-place'; choose one of {ONNXRUNTIME}, {CONCAT}"):
        open_backend(model, "in-place")
