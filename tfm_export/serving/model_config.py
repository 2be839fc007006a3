"""config.pbtxt files, built as Triton's own protobuf message (tritonclient's `model_config_pb2`) and written in
protobuf text format: every field name and enum is Triton's, and the text is what tritonserver parses."""

from __future__ import annotations

from dataclasses import dataclass

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from .contract import TEXT_INPUTS, TEXT_OUTPUTS, NativeGraph, TritonTensor

DATA_TYPES = {"bytes": mc.TYPE_STRING, "int64": mc.TYPE_INT64, "int32": mc.TYPE_INT32, "float32": mc.TYPE_FP32,
              "float16": mc.TYPE_FP16}
KINDS = {"cpu": mc.ModelInstanceGroup.KIND_CPU, "gpu": mc.ModelInstanceGroup.KIND_GPU}
# How long the dynamic batcher holds a request for others to join its batch; small next to one decode.
QUEUE_DELAY_US = 2000


@dataclass(frozen=True)
class Deployment:
    """What every model of a repository shares: rows per execution, instances per device, the device."""

    max_batch: int
    instances: int
    device: str  # "cpu" or "gpu"


def python_model(name: str, deployment: Deployment, parameters: dict[str, str]) -> str:
    """The text model (translator or BLS): Python backend, TEXT in, translations out, dynamic batching."""
    config = _base(name, deployment, TEXT_INPUTS, TEXT_OUTPUTS)
    config.backend = "python"
    config.dynamic_batching.max_queue_delay_microseconds = QUEUE_DELAY_US
    for key, value in parameters.items():
        config.parameters[key].string_value = value
    return text_format.MessageToString(config)


def native_model(name: str, graph: NativeGraph, deployment: Deployment, file_name: str, engine: bool) -> str:
    """An encoder or decoder_step model on the onnxruntime backend (a graph) or TensorRT (an engine). No dynamic
    batching: the BLS model already sends whole batches, and steps of different past lengths could not merge."""
    config = _base(name, deployment, graph.inputs, graph.outputs)
    if engine:
        config.platform = "tensorrt_plan"
    else:
        config.backend = "onnxruntime"
    config.default_model_filename = file_name
    return text_format.MessageToString(config)


def _base(name: str, deployment: Deployment, inputs: tuple[TritonTensor, ...],
          outputs: tuple[TritonTensor, ...]) -> mc.ModelConfig:
    config = mc.ModelConfig(name=name, max_batch_size=deployment.max_batch)
    for tensors, field in ((inputs, config.input), (outputs, config.output)):
        for tensor in tensors:
            field.add(name=tensor.name, data_type=DATA_TYPES[tensor.dtype], dims=list(tensor.dims))
    config.instance_group.add(count=deployment.instances, kind=KINDS[deployment.device])
    return config
