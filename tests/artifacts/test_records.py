"""The manifests' records: every manifest the writers put on disk reads back into its record and out again as the
same JSON, copies keep what a record does not model, and an entry missing a key no DirectoryKind requires reaches
the reader that checks it (one line), not a KeyError."""

from __future__ import annotations

import dataclasses
import json
import shutil

import pytest

from tfm_export.artifacts.manifest import MANIFEST, ModelDirError
from tfm_export.artifacts.model_dir import ModelDir
from tfm_export.artifacts.records import GraphEntry, ModelManifest
from tfm_export.core.graph_spec import Graph
from tfm_export.runtime.backends import open_backend


def _on_disk(directory) -> dict:
    return json.loads((directory / MANIFEST).read_text())


@pytest.mark.parametrize("fixture", ["demo_onnx", "demo_external", "demo_generate"])
def test_every_written_manifest_reads_back_as_the_same_json(request, fixture):
    """(The fp16 and int8 directories' records: test_precision's manifest test.)"""
    directory = request.getfixturevalue(fixture)
    assert ModelDir.read(directory).manifest.to_dict() == _on_disk(directory), directory


def test_the_record_carries_what_the_file_says(demo_external, demo_generate):
    """Fields by attribute, against the JSON as written: graph entries with their external weights file, the source
    checkpoint, generate.onnx's entry with the op's settings."""
    record, raw = ModelDir.read(demo_external).manifest, _on_disk(demo_external)
    assert record.precision == raw["precision"] and record.opset == raw["opset"]
    assert record.external and all(e.data_file == raw["graphs"][g]["data"] for g, e in record.graphs.items())
    assert record.source_checkpoint.sha256 == raw["source_checkpoint"]["sha256"]
    generate, raw = ModelDir.read(demo_generate).manifest.generate, _on_disk(demo_generate)["generate"]
    assert (generate.file, generate.sha256, generate.extra["op"]) == (raw["file"], raw["sha256"], raw["op"])


def test_a_copy_keeps_the_keys_a_record_does_not_model(demo_onnx):
    raw = _on_disk(demo_onnx)
    raw["from_a_later_version"] = {"kept": True}
    raw["graphs"]["encoder"]["hint"] = 1
    copy = dataclasses.replace(ModelManifest.from_dict(raw), precision="fp16")
    out = copy.to_dict()
    assert out["from_a_later_version"] == {"kept": True} and out["graphs"]["encoder"]["hint"] == 1
    assert out["precision"] == "fp16" and _on_disk(demo_onnx)["precision"] == "fp32"


def test_a_record_left_without_optional_sections_writes_none_of_them():
    entry = GraphEntry("g.onnx", "0" * 64)
    assert entry.to_dict() == {"file": "g.onnx", "sha256": "0" * 64, "inputs": [], "outputs": []}
    assert entry.data_file == "g.onnx.data"


def test_a_generate_entry_without_its_sha256_is_one_line(demo_generate, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(demo_generate, copy)
    raw = _on_disk(copy)
    del raw["generate"]["sha256"]
    (copy / MANIFEST).write_text(json.dumps(raw))
    assert ModelDir.read(copy).manifest.generate.sha256 is None
    with pytest.raises(ModelDirError, match="records no sha256"):
        open_backend(copy, "onnxruntime-generate")
    assert ModelDir.read(copy).has(Graph.ENCODER)
