"""The classic model's artifacts are byte-identical to the last recording of them.

The sha256s below were recorded when the export moved to torch.onnx's TorchScript exporter (graphs.export: the
classic demo's 1,000 held-out numbers then decoded exactly as before, greedy and beam 4, and int8 static's
calibrated scales kept their count and their sum to 1e-9), by exporting the shipped demo checkpoint (opset 17),
quantizing that export (the `variants` fixture's four precisions, same arguments) and exporting the seed-format
checkpoint built here. int8 dynamic's were recorded again when precision.int8 took over ONNX Runtime's dynamic
quantizer: its graphs then held the same nodes and bit-identical initializers as before, only in another order.
Any drift in the classic path (a traced op more or less, a renamed node, a changed manifest
field in the graph metadata) changes them. The exporter's output also depends on the library versions, so the
hashes are only compared under the versions they were recorded with; after an upgrade, rerun these exports at the
commit that recorded them and record again.

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
from tfm_export.core.graph_spec import CONTRACT_GRAPHS
from tfm_export.graphs.pipeline import export_model_dir
from tfm_export.model.loading import load_checkpoint

RECORDED_WITH = {"torch": "2.13.0+cpu", "onnx": "1.23.2", "onnxscript": "0.7.2", "onnxruntime": "1.32.0"}
DEMO = {
    "fp32": ("fba7fb0c2627b59df9c813990628d37cf56f0f994696a0dfb2d3fcb10e06f9b9",
             "cc9b0e710cd2ccc39fc0e5e7988a6e0f02eca80e7195ae77a07110fe325f3e2e"),
    "int8-dynamic": ("33f432edb57b04eae6608844e7fadde51f2afe4dda40bece288c59e7d87deebd",
                     "cf0463f2b38c7b474eb23c108aab1559526279f5307182aa3856e08a6c8add73"),
    "fp16": ("1e687a8782558c610429d4229d1582f699fa7c2e68d8d0cf55d21eb6a310f24a",
             "8b04d8d2f008b4256110fbc236d6317da1292d4ef15b86b15af4749379ce94c7"),
    "fp16-io": ("b1431c24744fce3e88aa2788861b1b51cdd9a6b16d1b6e9d1321caf81d48893a",
                "51d148d487bbfd0643316c5cdf823111ded3b53ff7f7410e25051fda842a747a"),
}
# int8 static: (sha256 with the activation scales zeroed, number of those scales, their sum) per graph
CALIBRATED = (("c8305bdad58225786c5c0820464a5c28fe6cf1c9db3142a8107961208e60779e", 25, 0.9004316101782024),
              ("929ba04731b4b3bd7785e17602ee85d881dd3e850e2a33578feb0fd14c9fa70c", 42, 1.670529805123806))
SEED = ("9b8e5da30307b1608bc6bd2d558f63000ec3884f0a81269150c76ce6c830a680",
        "fcd4a579bb2c816be7e25b84da88a04119cb2f79843fe1fd4593869d8ca997cf")


@pytest.fixture
def recorded_libraries() -> None:
    found = {name: importlib.metadata.version(name) for name in RECORDED_WITH}
    if found != RECORDED_WITH:
        pytest.skip(f"the classic hashes were recorded with {RECORDED_WITH}, this environment has {found}; the "
                    "exporter's bytes differ between versions (re-record them as the module docstring says)")


def _hashes(directory) -> tuple[str, str]:
    return tuple(file_sha256(directory / g.filename) for g in CONTRACT_GRAPHS)


@pytest.mark.parametrize("precision", DEMO)
def test_demo_exports_byte_identically_to_its_recording(variants, precision, recorded_libraries):
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
    for graph, (digest, count, total) in zip(CONTRACT_GRAPHS, CALIBRATED, strict=True):
        got = _calibrated(variants["int8-static"] / graph.filename)
        assert got[:2] == (digest, count) and got[2] == pytest.approx(total, rel=1e-5), graph


def test_seed_checkpoint_exports_byte_identically_to_its_recording(tmp_path, recorded_libraries):
    opt = seed_settings(d_k=3, d_v=5)
    (tmp_path / "seed").mkdir()
    save_seed_checkpoint(tmp_path / "seed" / "seed.chkpt", opt, seed_state_dict(opt))
    (tmp_path / "seed" / "vocab.txt").write_text("\n".join(seed_vocab(11)) + "\n")
    ckpt = load_checkpoint(tmp_path / "seed" / "seed.chkpt", [tmp_path / "seed" / "vocab.txt"])
    export_model_dir(ckpt, tmp_path / "model", progress=False)
    assert _hashes(tmp_path / "model") == SEED
