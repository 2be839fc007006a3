"""The Python-backend model of both layouts, loaded by the `model.py` that `tfm-export triton` writes.

It is a thin layer: TEXT and request parameters in, checked per request (`requests`), one Translator call per
group of requests that share options and languages, TRANSLATION/SCORE/N_BEST out. The translator layout's
Translator runs the copied model or engine directory as `tfm-run translate` does; the bls layout's runs the same
decoding loop over the repository's native encoder/decoder_step models (`bls`). Both are opened by the runtime's
one door (runtime.backends.open_backend), as `tfm-run`'s are. Only the runtime is imported, so the runtime-only
install is enough inside the server.
"""

from __future__ import annotations

import json
import os
import traceback
from pathlib import Path
from typing import Any

import numpy as np

from .. import __version__
from ..core.errors import InputTextError, TfmExportError
from ..runtime.session import SessionOptions
from ..runtime.translator import Translation, Translator
from .contract import N_BEST, N_BEST_COUNT, N_BEST_SCORES, SCORE, TEXT, TRANSLATION
from .requests import TextRequest, TranslationFailed, parse_request, translate_requests


class RequestCancelled(TfmExportError):
    """The client gave up on the request before it was run (its answer would go nowhere)."""


class TritonPythonModel:
    """Triton's Python-backend interface: initialize once per instance, execute per dynamic batch."""

    def initialize(self, args: dict[str, str]) -> None:
        import triton_python_backend_utils as pb_utils  # the Python backend provides it, only inside the server
        self.pb = pb_utils
        config = json.loads(args["model_config"])
        parameters = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        directory = Path(args["model_repository"]) / args["model_version"] / parameters["model_directory"]
        gpu = int(args["model_instance_device_id"]) if parameters["device"] == "gpu" else None
        if parameters.get("tool_version") != __version__:
            pb_utils.Logger.log_warn(f"{args['model_name']}: written by tfm-export {parameters.get('tool_version')}, "
                                     f"served by {__version__}")
        self.max_rows = int(config["max_batch_size"])
        self.translator = load_translator(directory, parameters, self.max_rows, pb_utils, gpu)

    def execute(self, requests: list[Any]) -> list[Any]:
        results = translate_requests(self.translator, [self._parse(r) for r in requests])
        return [self._response(r) for r in results]

    def _parse(self, request: Any) -> TextRequest | TfmExportError:
        if request.is_cancelled():
            return RequestCancelled("request cancelled by the client")
        try:
            return parse_request(self.translator, self.pb.get_input_tensor_by_name(request, TEXT).as_numpy(),
                                 request.parameters())
        except TfmExportError as exc:
            return exc

    def _response(self, result: list[Translation] | TfmExportError) -> Any:
        pb = self.pb
        if isinstance(result, TfmExportError):
            code = (pb.TritonError.INVALID_ARG if isinstance(result, InputTextError) else
                    pb.TritonError.CANCELLED if isinstance(result, RequestCancelled) else pb.TritonError.INTERNAL)
            if isinstance(result, TranslationFailed):
                pb.Logger.log_error("".join(traceback.format_exception(result.__cause__)))
            return pb.InferenceResponse(error=pb.TritonError(str(result), code))
        return pb.InferenceResponse([
            pb.Tensor(TRANSLATION, _strings([[t.text] for t in result])),
            pb.Tensor(SCORE, np.array([[t.score] for t in result], dtype=np.float32)),
            pb.Tensor(N_BEST, _strings([[a.text for a in t.n_best] for t in result])),
            pb.Tensor(N_BEST_SCORES, np.array([[a.score for a in t.n_best] for t in result], dtype=np.float32)),
            pb.Tensor(N_BEST_COUNT, np.array([[t.n_best_count] for t in result], dtype=np.int32))])


def load_translator(directory: Path, parameters: dict[str, str], max_rows: int, pb_utils: Any,
                    gpu: int | None) -> Translator:
    """The layout's Translator, built from the model directory as `tfm-run` builds it (its tokenizers, token
    rules, languages and generation defaults), bounded to `max_rows` rows (sentences x beams) per decode."""
    if parameters["layout"] == "bls":  # outputs stay on the GPU the native models answer on (Triton's numbering)
        from .bls import bls_translator
        return bls_translator(directory, parameters, pb_utils, gpu).bounded(max_rows)
    if gpu is not None:  # each instance is its own process: "cuda" is then the GPU Triton placed it on
        os.environ["CUDA_VISIBLE_DEVICES"] = str(gpu)
    device = SessionOptions(device="cuda" if gpu is not None else "cpu")
    return Translator.load(directory, session_options=device).bounded(max_rows)


def _strings(rows: list[list[str]]) -> np.ndarray:
    return np.array([[s.encode("utf-8") for s in row] for row in rows], dtype=np.object_)
