"""Fixtures shared by every test package (the helpers themselves live in `support`): the demo model exported once,
its precisions, the base config, and one thread for PyTorch."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))  # the test helpers: `support`

from support.common import CALIBRATION, DEMO_CKPT, made_once, tiny_config  # noqa: E402

from tfm_export.core.config import ModelConfig  # noqa: E402
from tfm_export.model.transformer import Transformer  # noqa: E402


@pytest.fixture(autouse=True)
def _single_thread():
    torch.set_num_threads(1)  # deterministic and fair on a shared 2-core machine


@pytest.fixture
def tiny_model() -> Transformer:
    torch.manual_seed(0)
    return Transformer(tiny_config()).eval()


@pytest.fixture(scope="session")
def demo_onnx(tmp_path_factory) -> Path:
    """The demo checkpoint exported once per test run (shared by the xdist workers: tests copy it to change it)."""
    from tfm_export.graphs.pipeline import export_model_dir
    from tfm_export.model.loading import load_checkpoint
    def make(root: Path) -> None:
        root.mkdir(parents=True)
        export_model_dir(load_checkpoint(DEMO_CKPT), root / "model", progress=False)
    return made_once(tmp_path_factory, "demo-onnx", make) / "model"


@pytest.fixture(scope="session")
def demo_external(tmp_path_factory) -> Path:
    """The demo checkpoint exported with every graph's weights in one external file (`--weights external`, the
    layout of models past 2 GB), with its pre-packed graphs (which that layout makes only when asked), once per
    test run."""
    from tfm_export.graphs.pipeline import export_model_dir
    from tfm_export.model.loading import load_checkpoint

    def make(root: Path) -> None:
        root.mkdir(parents=True)
        export_model_dir(load_checkpoint(DEMO_CKPT), root / "model", progress=False, external_data=True,
                         prepacked=True)
    return made_once(tmp_path_factory, "demo-external", make) / "model"


@pytest.fixture(scope="session")
def demo_generate(demo_onnx, tmp_path_factory) -> Path:
    """The demo model directory plus generate.onnx, made once per test session."""
    from tfm_export.graphs.generate_dir import write_generate_dir

    def make(root: Path) -> None:
        root.mkdir(parents=True)
        write_generate_dir(demo_onnx, root / "model", progress=False)
    return made_once(tmp_path_factory, "demo-generate", make) / "model"


@pytest.fixture(scope="session")
def base_onnx(tmp_path_factory):
    """The base config (d_model 512, 8 heads, 6+6 layers, vocab 32,000, random weights): (checkpoint, export)."""
    from tfm_export.graphs.pipeline import export_model_dir
    from tfm_export.model.checkpoint import CHECKPOINT_FILE
    from tfm_export.model.loading import load_checkpoint
    from tfm_export.model.synthetic import random_checkpoint

    def make(root: Path) -> None:
        ckpt = random_checkpoint(ModelConfig(src_vocab_size=32000, trg_vocab_size=32000), root / "ckpt")
        export_model_dir(load_checkpoint(ckpt), root / "model", progress=False)
    root = made_once(tmp_path_factory, "base", make)
    return load_checkpoint(root / "ckpt" / CHECKPOINT_FILE), root / "model"


@pytest.fixture(scope="session")
def variants(demo_onnx, tmp_path_factory) -> dict[str, Path]:
    """The demo model in every precision, made once: int8 static/dynamic, fp16, fp16 with fp32 I/O."""
    from tfm_export.precision.pipeline import Calibration, quantize_model_dir
    texts = CALIBRATION.read_text().splitlines()
    made = {"int8-static": dict(precision="int8", calibration=Calibration(CALIBRATION, texts)),
            "int8-dynamic": dict(precision="int8", mode="dynamic"),
            "fp16": dict(precision="fp16"),
            "fp16-io": dict(precision="fp16", keep_io_types=True)}

    def make(root: Path) -> None:
        root.mkdir(parents=True)
        for name, kwargs in made.items():
            quantize_model_dir(demo_onnx, root / name, progress=False, **kwargs)
    root = made_once(tmp_path_factory, "precision", make)
    return {"fp32": demo_onnx, **{name: root / name for name in made}}


@pytest.fixture(scope="session")
def base_variants(base_onnx, tmp_path_factory) -> dict[str, Path]:
    """The base config in fp32, fp16, int8 static (calibrated on 16 random-word sentences) and int8 dynamic."""
    from tfm_export.model.synthetic import random_texts
    from tfm_export.precision.pipeline import Calibration, quantize_model_dir
    ckpt, fp32 = base_onnx
    names = ("int8-static", "int8-dynamic", "fp16")

    def make(root: Path) -> None:
        texts = random_texts(ckpt.config, 16)
        root.mkdir(parents=True)
        (root / "calib.txt").write_text("\n".join(texts) + "\n")
        for name, kwargs in zip(names, (dict(precision="int8", calibration=Calibration(root / "calib.txt", texts,
                                                                                        max_length=4)),
                                        dict(precision="int8", mode="dynamic"), dict(precision="fp16")), strict=True):
            quantize_model_dir(fp32, root / name, progress=False, **kwargs)
    root = made_once(tmp_path_factory, "base-precision", make)
    return {"fp32": fp32, **{name: root / name for name in names}}
