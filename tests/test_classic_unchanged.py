"""The classic model's artifacts are byte-identical to those made before the variant options existed.

The sha256s below were recorded at commit 1d584dd (the last commit with only the classic model) by
exporting the shipped demo checkpoint (opset 17), quantizing that export (the `variants` fixture's four
precisions, same arguments) and exporting the seed-format checkpoint built here. Any drift in the classic
path (a traced op more or less, a renamed node, a changed manifest field in the graph metadata) changes
them. The exporter's output also depends on the library versions, so the hashes are only compared under
the versions they were recorded with; after an upgrade, check out 1d584dd, rerun these exports, record.
"""

from __future__ import annotations

import importlib.metadata

import pytest
from seed_oracle import save_seed_checkpoint, seed_settings, seed_state_dict, seed_vocab

from tfm_export.core.files import file_sha256
from tfm_export.core.graph_spec import Graph
from tfm_export.graphs.pipeline import export_model_dir
from tfm_export.model.loading import load_checkpoint

RECORDED_WITH = {"torch": "2.13.0+cpu", "onnx": "1.23.2", "onnxscript": "0.7.2", "onnxruntime": "1.32.0"}
DEMO = {
    "fp32": ("08ddd6491a4d90bf9a0d4562ed29f0a73dc0b1fbd78489afad6ddb4ee683d464",
             "9626f4a6b7a0d01a912b80bea01cbbd8f2bbf84b488eae94fee65c112d1de6c3"),
    "int8-static": ("30a4c64651233764e74d9675902bf9858f543ef691260cb9fd499a3d53f45d63",
                    "88be3338a7240b4754e11bf993dfe9f741053a5494b3b712719835361000fcee"),
    "int8-dynamic": ("bee412040f3b07d0c40c97ad6d0dcc1233b441c289e3d10e0f86267504317f35",
                     "abdde388f7c7a3f39557389ee9097833f69458b5752355aef48fc2680cac2d7f"),
    "fp16": ("4bf1ae4a05a12bd53f9ad1927f923fb93fa05414fe193ec78f6117a9e43af90a",
             "5ab8dd3bec9b54c2cbbb7b48fc3e3565260f6ca8941fc88f19c9514cd28d4c2b"),
    "fp16-io": ("a04ba38d9e7f74c0a67dfed97432be8a178fa8c4253700606f4b7630a072581e",
                "d98fc4f239d55d56789bb1ff07a1361456126a420c1d8d483f7057ee110f7231"),
}
SEED = ("0969d98974aa5e0706b08a12555b9130b063d7b9b64157a2569e01fc82af12b8",
        "c95e2d87c75aec8cd6a52d22773e55a422769d0326f5a52be0291fc1f738ee78")


@pytest.fixture
def recorded_libraries() -> None:
    found = {name: importlib.metadata.version(name) for name in RECORDED_WITH}
    if found != RECORDED_WITH:
        pytest.skip(f"the classic hashes were recorded with {RECORDED_WITH}, this environment has {found}; the "
                    "exporter's bytes differ between versions (re-record them as the module docstring says)")


def _hashes(directory) -> tuple[str, str]:
    return tuple(file_sha256(directory / g.filename) for g in Graph)


@pytest.mark.parametrize("precision", DEMO)
def test_demo_exports_byte_identically_to_before_the_variants(variants, precision, recorded_libraries):
    assert _hashes(variants[precision]) == DEMO[precision]


def test_seed_checkpoint_exports_byte_identically_to_before_the_variants(tmp_path, recorded_libraries):
    opt = seed_settings(d_k=3, d_v=5)
    (tmp_path / "seed").mkdir()
    save_seed_checkpoint(tmp_path / "seed" / "seed.chkpt", opt, seed_state_dict(opt))
    (tmp_path / "seed" / "vocab.txt").write_text("\n".join(seed_vocab(11)) + "\n")
    ckpt = load_checkpoint(tmp_path / "seed" / "seed.chkpt", [tmp_path / "seed" / "vocab.txt"])
    export_model_dir(ckpt, tmp_path / "model", progress=False)
    assert _hashes(tmp_path / "model") == SEED
