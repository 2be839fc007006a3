"""Stand-in for Triton's onnxruntime backend, which the nvidia-pytriton server lacks: a Python-backend model that
runs the native model's graph with ONNX Runtime, taking and returning exactly the tensors its config declares.
Copied into a repository as the encoder's and decoder_step's model.py by the serving tests, so that the bls
layout's own Python model (the decoding loop over BLS calls) runs against a real server here."""

import json
from pathlib import Path

import onnxruntime as ort
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        graph = Path(args["model_repository"]) / args["model_version"] / config["parameters"]["graph_file"][
            "string_value"]
        self.session = ort.InferenceSession(str(graph), providers=["CPUExecutionProvider"])
        self.inputs = [i["name"] for i in config["input"]]
        self.outputs = [o["name"] for o in config["output"]]

    def execute(self, requests):
        responses = []
        for request in requests:
            feeds = {n: pb_utils.get_input_tensor_by_name(request, n).as_numpy() for n in self.inputs}
            values = self.session.run(self.outputs, feeds)
            tensors = [pb_utils.Tensor(n, v) for n, v in zip(self.outputs, values, strict=True)]
            responses.append(pb_utils.InferenceResponse(tensors))
        return responses
