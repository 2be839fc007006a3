"""What the serving tests share: the serving environment (or a skip saying why it is absent), stand-ins for the
native backends the bundled server lacks, and client calls."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from support.common import REPO
from tfm_export.core.errors import TfmExportError
from tfm_export.serving.local_server import ServerEnvironment

SERVING_VENV = REPO / ".venv-serving"
STANDIN = Path(__file__).with_name("triton_standin_model.py")


def serving_environment() -> ServerEnvironment:
    """The environment `make serving-env` builds, or a skip that says how to get it."""
    if not (SERVING_VENV / ".installed").exists():
        pytest.skip(f"{SERVING_VENV} was not built (`make serving-env`: nvidia-pytriton's tritonserver and "
                    "tfm-export's runtime); these tests need a real tritonserver")
    try:
        return ServerEnvironment.find(SERVING_VENV / "bin" / "python")
    except TfmExportError as exc:
        pytest.skip(str(exc))


def read_config(path: Path) -> mc.ModelConfig:
    return text_format.Parse(path.read_text(), mc.ModelConfig())


def stand_in_native_models(repository: Path, models: tuple[str, ...]) -> None:
    """Serve these native models with the ONNX Runtime stand-in: same name, tensors, max batch and instances;
    only the backend changes (the graph file moves from default_model_filename to a parameter)."""
    for model in models:
        config = read_config(repository / model / "config.pbtxt")
        config.parameters["graph_file"].string_value = config.default_model_filename
        config.ClearField("default_model_filename")
        config.ClearField("platform")
        config.backend = "python"
        (repository / model / "config.pbtxt").write_text(text_format.MessageToString(config))
        shutil.copyfile(STANDIN, repository / model / "1" / "model.py")


def text_input(module, texts: list[bytes], name: str = "TEXT", datatype: str = "BYTES"):
    """A TEXT input for tritonclient.http or tritonclient.grpc."""
    tensor = module.InferInput(name, [len(texts), 1], datatype)
    tensor.set_data_from_numpy(np.array([[t] for t in texts], dtype=np.object_))
    return tensor


def translate(module, client, model: str, texts: list[str], parameters: dict | None = None) -> list[str]:
    result = client.infer(model, [text_input(module, [t.encode() for t in texts])], parameters=parameters)
    return [t.decode() for t in result.as_numpy("TRANSLATION").reshape(-1)]
