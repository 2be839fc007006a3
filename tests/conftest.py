from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))  # test helpers such as seed_oracle

from tfm_export.core.config import ModelConfig  # noqa: E402
from tfm_export.model.transformer import Transformer  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
DEMO_CKPT = REPO / "models" / "demo" / "ckpt.pt"
CALIBRATION = REPO / "calibration" / "demo.en.txt"


@pytest.fixture(autouse=True)
def _single_thread():
    torch.set_num_threads(1)  # deterministic and fair on a shared 2-core machine


def tiny_config(**overrides) -> ModelConfig:
    base = dict(src_vocab_size=13, trg_vocab_size=13, d_model=16, d_inner=32, n_layers=2, n_head=2, d_k=8,
                d_v=8, n_position=32)
    base.update(overrides)
    return ModelConfig(**base)


@pytest.fixture
def tiny_model() -> Transformer:
    torch.manual_seed(0)
    return Transformer(tiny_config()).eval()


@pytest.fixture(scope="session")
def demo_onnx(tmp_path_factory) -> Path:
    """The demo checkpoint exported once per test session."""
    from tfm_export.graphs.pipeline import export_model_dir
    from tfm_export.model.loading import load_checkpoint
    out = tmp_path_factory.mktemp("demo-onnx") / "model"
    export_model_dir(load_checkpoint(DEMO_CKPT), out, progress=False)
    return out


@pytest.fixture(scope="session")
def demo_generate(demo_onnx, tmp_path_factory) -> Path:
    """The demo model directory plus generate.onnx, made once per test session."""
    from tfm_export.graphs.generate_dir import write_generate_dir
    out = tmp_path_factory.mktemp("demo-generate") / "model"
    write_generate_dir(demo_onnx, out, progress=False)
    return out


def made_once(tmp_path_factory, name: str, make: Callable[[Path], None]) -> Path:
    """A directory made once per test run and shared by the xdist workers: the first to ask makes it, the others
    wait for it. Base-size models take a minute or more each to export and quantize."""
    from filelock import FileLock
    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent  # this run's own directory, above each worker's
    path, made = shared / name, shared / f"{name}.made"
    with FileLock(f"{path}.lock"):
        if not made.exists():
            shutil.rmtree(path, ignore_errors=True)
            make(path)
            made.touch()
    return path


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
    root = tmp_path_factory.mktemp("precision")
    texts = CALIBRATION.read_text().splitlines()
    made = {"fp32": demo_onnx}
    for name, kwargs in {"int8-static": dict(precision="int8", calibration=Calibration(CALIBRATION, texts)),
                         "int8-dynamic": dict(precision="int8", mode="dynamic"),
                         "fp16": dict(precision="fp16"),
                         "fp16-io": dict(precision="fp16", keep_io_types=True)}.items():
        quantize_model_dir(demo_onnx, root / name, progress=False, **kwargs)
        made[name] = root / name
    return made


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


def listing(directory: Path) -> list[str]:
    """Every path under a directory, to show that a failed command wrote nothing."""
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*"))


@contextlib.contextmanager
def unwritable_dir(path: Path):
    """A directory nobody may write into, root included (immutable flag), else by permissions."""
    path.mkdir(parents=True, exist_ok=True)
    immutable = subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode == 0
    if not immutable:
        path.chmod(0o500)
    try:
        probe = path / ".probe"
        try:
            probe.touch()
        except OSError:
            pass
        else:
            probe.unlink()
            pytest.skip("cannot make a directory unwritable here (root without chattr)")
        yield path
    finally:
        if immutable:
            subprocess.run(["chattr", "-i", str(path)], check=True)
        else:
            path.chmod(0o700)
