"""The classic model's artifacts are byte-identical to those made before the variant options existed.

The sha256s below were recorded at commit 1d584dd (the last commit with only the classic model) by
exporting the shipped demo checkpoint (opset 17), quantizing that export (the `variants` fixture's four
precisions, same arguments) and exporting the seed-format checkpoint built here. Any drift in the classic
path (a traced op more or less, a renamed node, a changed manifest field in the graph metadata) changes
them. The exporter's output also depends on the library versions, so the hashes are only compared under
the versions they were recorded with; after an upgrade, check out 1d584dd, rerun these exports, record.

Static int8's activation scales are maxima of activations that ONNX Runtime computed during calibration, so their
last bits are the machine's rounding (another CPU's kernels): those graphs are compared byte for byte with the
scales zeroed, and the scales by their count and sum within 1e-5 (recorded from the same bytes as the hashes).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper
from support.seed_oracle import save_seed_checkpoint, seed_settings, seed_state_dict, seed_vocab

from tfm_export.core.files import file_sha256
from tfm_export.core.graph_spec import Graph
from tfm_export.graphs.pipeline import export_model_dir
from tfm_export.model.loading import load_checkpoint

RECORDED_WITH = {"torch": "2.13.0+cpu", "onnx": "1.23.2", "onnxscript": "0.7.2", "onnxruntime": "1.32.0"}
DEMO = {
    "fp32": ("08ddd6491a4d90bf9a0d4562ed29f0a73dc0b1fbd78489afad6ddb4ee683d464",
             "9626f4a6b7a0d01a912b80bea01cbbd8f2bbf84b488eae94fee65c112d1de6c3"),
    "int8-dynamic": ("bee412040f3b07d0c40c97ad6d0dcc1233b441c289e3d10e0f86267504317f35",
                     "abdde388f7c7a3f39557389ee9097833f69458b5752355aef48fc2680cac2d7f"),
    "fp16": ("4bf1ae4a05a12bd53f9ad1927f923fb93fa05414fe193ec78f6117a9e43af90a",
             "5ab8dd3bec9b54c2cbbb7b48fc3e3565260f6ca8941fc88f19c9514cd28d4c2b"),
    "fp16-io": ("a04ba38d9e7f74c0a67dfed97432be8a178fa8c4253700606f4b7630a072581e",
                "d98fc4f239d55d56789bb1ff07a1361456126a420c1d8d483f7057ee110f7231"),
}
# int8 static: (sha256 with the activation scales zeroed, number of those scales, their sum) per graph
CALIBRATED = (("158df4a48cb4f7d45bc8442a376c26f58ff59fad6a25bbaa910138677ae31b15", 25, 0.9004316101782024),
              ("3d80a9e70de4b5af7894ae55d2223b7e95074efff1101e93a563897b4039f3d1", 42, 1.6705298032611609))
# re-recorded at 1d584dd when seed_state_dict took NumPy's generator: torch.randn's numbers depend on the CPU's kernels
SEED = ("0d7a003aa48211b15028f4151211719a0365512a470725e37710afb0a930a4ed",
        "4d2837ed999d965d78102e8e73e815bb0125b7608c2c13b882597c138042092f")


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


def _calibrated(path: Path) -> tuple[str, int, float]:
    """A statically quantized graph as CALIBRATED records it: activations' QuantizeLinear scales taken out."""
    model = onnx.load(path)
    inits = {i.name: i for i in model.graph.initializer}
    names = sorted({n.input[1] for n in model.graph.node if n.op_type == "QuantizeLinear" and n.input[0] not in inits})
    scales = [float(numpy_helper.to_array(inits[name])) for name in names]
    for name in names:
        inits[name].CopyFrom(numpy_helper.from_array(np.zeros_like(numpy_helper.to_array(inits[name])), name))
    return hashlib.sha256(model.SerializeToString()).hexdigest(), len(scales), sum(scales)


def test_demo_int8_static_is_identical_but_for_its_calibrated_scales(variants, recorded_libraries):
    for graph, (digest, count, total) in zip(Graph, CALIBRATED, strict=True):
        got = _calibrated(variants["int8-static"] / graph.filename)
        assert got[:2] == (digest, count) and got[2] == pytest.approx(total, rel=1e-5), graph


def test_seed_checkpoint_exports_byte_identically_to_before_the_variants(tmp_path, recorded_libraries):
    opt = seed_settings(d_k=3, d_v=5)
    (tmp_path / "seed").mkdir()
    save_seed_checkpoint(tmp_path / "seed" / "seed.chkpt", opt, seed_state_dict(opt))
    (tmp_path / "seed" / "vocab.txt").write_text("\n".join(seed_vocab(11)) + "\n")
    ckpt = load_checkpoint(tmp_path / "seed" / "seed.chkpt", [tmp_path / "seed" / "vocab.txt"])
    export_model_dir(ckpt, tmp_path / "model", progress=False)
    assert _hashes(tmp_path / "model") == SEED
