"""`tfm-export triton` without a server: what the repository holds, what its configs declare (read back through
Triton's own protobuf), one-line errors that write nothing, and the request handling the server-side model uses."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import onnxruntime as ort
import pytest
import yaml
from click.testing import CliRunner
from support.common import REPO, listing
from support.triton_server import read_config
from tritonclient.grpc import model_config_pb2 as mc

from tfm_export.artifacts.manifest import ENGINE_FORMAT, ENGINE_FORMAT_VERSION
from tfm_export.artifacts.model_dir import read_manifest
from tfm_export.cli.export_cli import main as export_main
from tfm_export.core.errors import InputTextError
from tfm_export.core.files import file_sha256
from tfm_export.core.token_rules import SEED_RULES
from tfm_export.runtime.translator import DecodeOptions, Translator
from tfm_export.serving.requests import (
    TextRequest,
    decode_options,
    decode_texts,
    parse_request,
    request_parameters,
    translate_requests,
)
from tfm_export.serving.triton_model import load_translator

TYPES = {"int64": mc.TYPE_INT64, "int32": mc.TYPE_INT32, "float32": mc.TYPE_FP32, "float16": mc.TYPE_FP16}


def triton(*args: str | Path):
    return CliRunner().invoke(export_main, ["triton", *map(str, args)])


def _tensors(config_tensors) -> list[tuple[str, int, list[int]]]:
    return [(t.name, t.data_type, list(t.dims)) for t in config_tensors]


def _from_manifest(tensors: list[dict], dtype=lambda name, declared: declared) -> list[tuple[str, int, list[int]]]:
    return [(t["name"], TYPES[dtype(t["name"], t["dtype"])], [d if isinstance(d, int) else -1 for d in t["shape"][1:]])
            for t in tensors]


def test_translator_layout_holds_the_model_directory_and_a_config(demo_onnx, tmp_path):
    result = triton("--model", demo_onnx, "--output", tmp_path / "repo", "--max-batch", "16", "--instances", "2")
    assert result.exit_code == 0, result.output
    manifest = read_manifest(demo_onnx)
    copied = sorted(["manifest.json", "tokenizer.json", "encoder.onnx", "decoder_step.onnx",  # every listed file
                     "decoder_step_search.onnx", "decoder_step_search.onnx.data", "decoder_step_search_fused.onnx",
                     "decoder_step_search_fused.onnx.data"])
    assert listing(tmp_path / "repo") == sorted(["manifest.json", "translator", "translator/config.pbtxt",
                                                 "translator/1", "translator/1/model.py", "translator/1/model",
                                                 *(f"translator/1/model/{f}" for f in copied)])
    for graph in ("encoder", "decoder_step", "decoder_step_search", "decoder_step_search_fused"):
        assert file_sha256(tmp_path / f"repo/translator/1/model/{graph}.onnx") == manifest["graphs"][graph]["sha256"]
    config = read_config(tmp_path / "repo/translator/config.pbtxt")
    assert (config.name, config.backend, config.max_batch_size) == ("translator", "python", 16)
    assert _tensors(config.input) == [("TEXT", mc.TYPE_STRING, [1])]
    assert [t.name for t in config.output] == ["TRANSLATION", "SCORE", "N_BEST", "N_BEST_SCORES", "N_BEST_COUNT"]
    assert config.HasField("dynamic_batching")
    assert [(g.count, g.kind) for g in config.instance_group] == [(2, mc.ModelInstanceGroup.KIND_CPU)]
    assert {k: v.string_value for k, v in config.parameters.items()} == {
        "layout": "translator", "device": "cpu", "model_directory": "model", "tool_version": "0.1.0"}
    for generated in ("translator/config.pbtxt", "translator/1/model.py"):
        text = (tmp_path / "repo" / generated).read_text()
        assert str(tmp_path) not in text and str(demo_onnx) not in text and str(REPO) not in text
    assert "from tfm_export.serving.triton_model import TritonPythonModel" in \
        (tmp_path / "repo/translator/1/model.py").read_text()


def test_bls_layout_native_configs_follow_the_manifest(demo_onnx, tmp_path):
    result = triton("--model", demo_onnx, "--output", tmp_path / "repo", "--layout", "bls", "--name", "numbers")
    assert result.exit_code == 0, result.output
    manifest = read_manifest(demo_onnx)
    assert sorted(p.name for p in (tmp_path / "repo").iterdir()) == ["manifest.json", "numbers",
                                                                    "numbers_decoder_step", "numbers_encoder"]
    assert sorted(p.name for p in (tmp_path / "repo/numbers/1/model").iterdir()) == ["manifest.json",
                                                                                    "tokenizer.json"]
    bls = read_config(tmp_path / "repo/numbers/config.pbtxt")
    assert {k: v.string_value for k, v in bls.parameters.items()}.items() >= {
        "layout": "bls", "encoder_model": "numbers_encoder", "decoder_step_model": "numbers_decoder_step"}.items()
    assert bls.max_batch_size == 64
    for graph in ("encoder", "decoder_step"):
        config = read_config(tmp_path / f"repo/numbers_{graph}/config.pbtxt")
        assert (config.backend, config.default_model_filename, config.max_batch_size) == (
            "onnxruntime", f"{graph}.onnx", 64)
        assert not config.HasField("dynamic_batching")
        assert _tensors(config.input) == _from_manifest(manifest["graphs"][graph]["inputs"])
        assert _tensors(config.output) == _from_manifest(manifest["graphs"][graph]["outputs"])
        assert file_sha256(tmp_path / f"repo/numbers_{graph}/1/{graph}.onnx") == manifest["graphs"][graph]["sha256"]


def _engine_dir(directory: Path, demo_onnx: Path, tensorrt: str = "10.3.0", precision: str = "fp16") -> Path:
    """An engine directory as `tfm-export trt` lays it out, with stand-in plan bytes (never run: no TensorRT)."""
    directory.mkdir()
    manifest = read_manifest(demo_onnx)
    engines = {}
    for graph in ("encoder", "decoder_step"):
        (directory / f"{graph}.plan").write_bytes(f"plan of {graph}".encode())
        engines[graph] = {"file": f"{graph}.plan", "sha256": file_sha256(directory / f"{graph}.plan")}
    shutil.copyfile(demo_onnx / "tokenizer.json", directory / "tokenizer.json")
    (directory / "manifest.json").write_text(json.dumps({
        "format": ENGINE_FORMAT, "format_version": ENGINE_FORMAT_VERSION, "model": manifest["model"],
        "tokenizer": manifest["tokenizer"], "files": manifest["files"], "special_tokens": manifest["special_tokens"],
        "limits": {"max_batch": 16, "max_source_length": 100, "max_target_length": 120}, "precision": precision,
        "tensorrt": {"target": "tensorrt", "tensorrt": tensorrt, "gpu": "Orin", "compute_capability": "8.7"},
        "engines": engines, "source": {}}))
    return directory


@pytest.mark.parametrize("tensorrt, ids", [("10.3.0", "int64"), ("8.6.2", "int32")])
def test_engine_directories_become_tensorrt_plan_models(demo_onnx, tmp_path, tensorrt, ids):
    engines = _engine_dir(tmp_path / "engines", demo_onnx, tensorrt)
    result = triton("--model", engines, "--output", tmp_path / "repo", "--layout", "bls")
    assert result.exit_code == 0, result.output
    assert "max batch 16 rows" in result.output and "on gpu" in result.output
    manifest = read_manifest(demo_onnx)

    def dtype(name: str, declared: str) -> str:  # fp16 engines: fp16 cache and hidden state, fp32 logits
        return ids if declared == "int64" else "float16" if name != "logits" else declared
    for graph in ("encoder", "decoder_step"):
        config = read_config(tmp_path / f"repo/translator_{graph}/config.pbtxt")
        assert (config.platform, config.default_model_filename, config.max_batch_size) == (
            "tensorrt_plan", f"{graph}.plan", 16)
        assert [(g.count, g.kind) for g in config.instance_group] == [(1, mc.ModelInstanceGroup.KIND_GPU)]
        assert _tensors(config.input) == _from_manifest(manifest["graphs"][graph]["inputs"], dtype)
        assert _tensors(config.output) == _from_manifest(manifest["graphs"][graph]["outputs"], dtype)
    translator = triton("--model", engines, "--output", tmp_path / "repo2", "--max-batch", "8")
    assert translator.exit_code == 0, translator.output
    assert (tmp_path / "repo2/translator/1/model/encoder.plan").read_bytes() == b"plan of encoder"


def _int8_static(demo_onnx: Path, directory: Path) -> Path:
    """The demo directory's manifest declaring int8 static graphs: what the bls check reads."""
    shutil.copytree(demo_onnx, directory)
    manifest = read_manifest(directory)
    manifest.update(precision="int8", int8={"mode": "static"})
    (directory / "manifest.json").write_text(json.dumps(manifest))
    return directory


def _bad_inputs(demo_onnx: Path, tmp_path: Path) -> dict[str, tuple[list, str]]:
    (tmp_path / "empty").mkdir()
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "keep.txt").write_text("mine")
    engines = _engine_dir(tmp_path / "engines", demo_onnx)
    swapped = _engine_dir(tmp_path / "swapped", demo_onnx)
    (swapped / "encoder.plan").write_bytes(b"another plan")
    out = str(tmp_path / "repo")
    edited = {  # engine manifest fields read without a type check (AttributeError, ValueError) or not at all
        "int8": ({"int8": "static"}, "invalid int8"),
        "tensorrt version": ({"tensorrt": {"target": "tensorrt", "tensorrt": "x.y"}}, "invalid tensorrt.tensorrt"),
        "max_batch": ({"limits": {"max_batch": True, "max_source_length": 100, "max_target_length": 120}},
                      "invalid limits.max_batch"),
        "special_tokens": ({"special_tokens": [1]}, "special_tokens differ from the seed layout"),
        "token_rules": ({"token_rules": "seed"}, "token_rules must have exactly the fields")}
    for name, (fields, _) in edited.items():
        directory = _engine_dir(tmp_path / f"engines {name}", demo_onnx)
        manifest = json.loads((directory / "manifest.json").read_text())
        (directory / "manifest.json").write_text(json.dumps({**manifest, **fields}))
    return {**{f"engine manifest {name}": (["--model", tmp_path / f"engines {name}", "--output", out, "--layout",
                                            "bls"], message) for name, (_, message) in edited.items()},
        "not a directory": (["--model", REPO / "models/demo/ckpt.pt", "--output", out], "is a file, not a model"),
        "missing": (["--model", tmp_path / "nowhere", "--output", out], "model directory not found"),
        "no manifest": (["--model", tmp_path / "empty", "--output", out], "this is not a tfm-export model directory"),
        "output exists": (["--model", demo_onnx, "--output", tmp_path / "taken"], "pass --force to replace it"),
        "bad name": (["--model", demo_onnx, "--output", out, "--name", "../x"], "--name '../x': use letters"),
        "int8 static bls": (["--model", _int8_static(demo_onnx, tmp_path / "int8"), "--output", out, "--layout",
                             "bls"], "int8 static (Q/DQ) graphs; Triton's onnxruntime backend cannot"),
        "engines on cpu": (["--model", engines, "--output", out, "--device", "cpu"], "which run only on a GPU"),
        "batch above profile": (["--model", engines, "--output", out, "--max-batch", "32"],
                                "--max-batch 32 exceeds the engines' profile (16 rows)"),
        "swapped plan": (["--model", swapped, "--output", out], "sha256 differs from manifest.json"),
    }


def test_bad_input_is_one_line_and_writes_nothing(demo_onnx, tmp_path):
    cases = _bad_inputs(demo_onnx, tmp_path)
    before = listing(tmp_path)
    for name, (args, message) in cases.items():
        result = triton(*args)
        assert result.exit_code == 1, (name, result.output)
        assert len(result.output.strip().splitlines()) == 1 and message in result.output, (name, result.output)
        assert "Traceback" not in result.output
    assert listing(tmp_path) == before  # no repository, no staging leftovers, "taken" untouched


def test_force_replaces_an_existing_repository(demo_onnx, tmp_path):
    assert triton("--model", demo_onnx, "--output", tmp_path / "repo", "--layout", "bls").exit_code == 0
    result = triton("--model", demo_onnx, "--output", tmp_path / "repo", "--force")
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in (tmp_path / "repo").iterdir()) == ["manifest.json", "translator"]


def test_help_explains_every_option():
    result = CliRunner().invoke(export_main, ["triton", "--help"])
    assert result.exit_code == 0
    for option in ("--model", "--output", "--name", "--layout", "--max-batch", "--instances", "--device", "--force"):
        assert option in result.output


def test_server_side_modules_load_neither_torch_nor_onnx():
    """What model.py imports inside the server needs only the runtime-only install (no tritonclient either)."""
    code = ("import sys, tfm_export.serving.triton_model, tfm_export.serving.bls; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'onnx', 'tritonclient', 'google'}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert out.stdout.strip() == "[]"


# --- the request handling of the server-side model, against the Translator called directly ---------------------

def test_request_texts_and_parameters_are_checked(demo_onnx):
    translator = Translator.load(demo_onnx).bounded(32)
    assert decode_texts(np.array([[b"forty-two"], [b"eighty"]], dtype=object)) == (
        "forty-two", "eighty")
    given = request_parameters('{"beam_size": 4, "n_best": 2, "length_penalty": 1, "max_length": 50}')
    options = decode_options(given, translator)
    assert options == DecodeOptions(beam_size=4, length_penalty=1.0, max_length=50, batch_size=32, n_best=2)
    assert decode_options({}, translator) == DecodeOptions(beam_size=1, length_penalty=1.0, batch_size=32)
    for parameters, message in (({"beam_size": True}, "beam_size must be a whole number, got True"),
                                ({"n_best": 1.5}, "n_best must be a whole number, got 1.5"),
                                ({"target_lang": 5}, "target_lang must be a language code (a string), got 5"),
                                ({"length_penalty": float("nan")}, "length_penalty nan is outside -10..10"),
                                ({"length_penalty": 11}, "length_penalty 11 is outside -10..10"),
                                ({"max_length": 201}, "max_length 201 is outside 1..200"),
                                ({"beam_size": 2, "n_best": 3}, "n_best 3 is outside 1..2: it may not exceed "
                                                                "beam_size")):
        with pytest.raises(InputTextError, match=re.escape(message)):
            decode_options(request_parameters(parameters), translator)


def test_grouped_requests_equal_one_translator_call_each(demo_onnx):
    """Requests with different options share a batch: each still gets exactly what its own call would give, and
    an error stays with its request."""
    translator = Translator.load(demo_onnx)
    greedy, beam = DecodeOptions(batch_size=8), DecodeOptions(beam_size=4, n_best=2, batch_size=8)
    requests = [TextRequest(("forty-two", "eighty"), greedy), InputTextError("bad"),
                TextRequest(("seven hundred and one",), beam), TextRequest(("ninety-nine thousand",), greedy)]
    results = translate_requests(translator, requests)
    assert results[1] is requests[1]
    for request, result in zip(requests, results, strict=True):
        if isinstance(request, TextRequest):
            own = translator.translate(request.texts, request.options)
            assert [_untimed(t) for t in result] == [_untimed(t) for t in own]


def test_requests_keep_their_languages_apart(demo_onnx, tmp_path):
    """Language codes reach the Translator as the request named them, the source as the source and the target as
    the target. The stand-in multilingual directory is the demo's, whose rules name two of its French words as
    target language codes, which the first generated token must be."""
    model = tmp_path / "model"
    shutil.copytree(demo_onnx, model)
    manifest = json.loads((model / "manifest.json").read_text())
    manifest["token_rules"] = {**SEED_RULES.to_dict(), "languages": ["sept", "huit"], "language_rule": "forced_bos"}
    (model / "manifest.json").write_text(json.dumps(manifest))
    translator = Translator.load(model).bounded(8)
    raw = np.array([[b"forty-two"], [b"eighty"]], dtype=object)
    request = parse_request(translator, raw, '{"target_lang": "huit"}')
    assert request.languages == (None, "huit")
    [result] = translate_requests(translator, [request])
    want = translator.with_languages(None, "huit").translate(request.texts, request.options)
    assert [_untimed(t) for t in result] == [_untimed(t) for t in want]
    assert all(t.text.startswith("huit") for t in want)  # the code acts
    with pytest.raises(InputTextError, match="source_lang: this model's sources carry no language code"):
        parse_request(translator, raw, '{"source_lang": "huit"}')


def _local_bls(repository: Path) -> SimpleNamespace:
    """What the bls layout's Python model asks of Triton (pb_utils: Tensor, InferenceRequest.exec,
    get_output_tensor_by_name), each native model answered by an ONNX Runtime session of the graph the repository
    holds for it: the bls decoding loop runs without a server."""
    sessions = {path.parents[1].name: ort.InferenceSession(str(path)) for path in repository.glob("*/1/*.onnx")}

    def tensor(name: str, value: np.ndarray) -> SimpleNamespace:
        return SimpleNamespace(name=name, is_cpu=lambda: True, as_numpy=lambda: value)

    def request(model_name: str, requested_output_names: list[str], inputs: list) -> SimpleNamespace:
        def run() -> SimpleNamespace:
            names = list(requested_output_names)
            values = sessions[model_name].run(names, {t.name: t.as_numpy() for t in inputs})
            return SimpleNamespace(has_error=lambda: False, values=dict(zip(names, values, strict=True)))
        return SimpleNamespace(exec=run)
    return SimpleNamespace(Tensor=tensor, InferenceRequest=request,
                           get_output_tensor_by_name=lambda response, name: tensor(name, response.values[name]))


@pytest.mark.parametrize("layout", ["translator", "bls"])
def test_both_layouts_decode_by_the_directorys_token_rules(demo_onnx, tmp_path, layout):
    """A directory's token_rules (a pretrained model's ids and generation defaults; here a default length of 2
    tokens) reach the served Translator in either layout as Translator.load reads them: both layouts dropped them
    and decoded with the seed's rules. The server-side model is loaded as Triton loads it, from its config."""
    model = tmp_path / "model"
    shutil.copytree(demo_onnx, model)
    manifest = json.loads((model / "manifest.json").read_text())
    manifest["token_rules"] = {**SEED_RULES.to_dict(), "max_new_tokens": 2}
    (model / "manifest.json").write_text(json.dumps(manifest))
    assert triton("--model", model, "--output", tmp_path / "repo", "--layout", layout).exit_code == 0
    config = read_config(tmp_path / "repo/translator/config.pbtxt")
    parameters = {k: v.string_value for k, v in config.parameters.items()}
    served = load_translator(tmp_path / "repo/translator/1" / parameters["model_directory"], parameters,
                             config.max_batch_size, _local_bls(tmp_path / "repo"), None)
    texts = ["seven hundred and seventy-one", "forty-two", "eighty thousand and one"]
    want = [t.ids for t in Translator.load(model).translate(texts)]
    assert [t.ids for t in served.translate(texts)] == want and {len(ids) for ids in want} == {2}
    assert want != [t.ids for t in Translator.load(demo_onnx).translate(texts)]


def _untimed(translation) -> tuple:
    return translation.text, translation.ids, translation.score, translation.n_best


def test_kserve_example_serves_the_repository_from_its_storage():
    """The shipped manifest: its runtime's server reads /mnt/models (where KServe puts storageUri), the
    InferenceService selects that runtime, and its image installs the runtime with the NumPy the stub needs."""
    runtime, service = yaml.safe_load_all((REPO / "examples/kserve/inferenceservice.yaml").read_text())
    assert (runtime["kind"], service["kind"]) == ("ServingRuntime", "InferenceService")
    container = runtime["spec"]["containers"][0]
    assert container["args"][0] == "tritonserver" and "--model-repository=/mnt/models" in container["args"]
    model = service["spec"]["predictor"]["model"]
    assert model["runtime"] == runtime["metadata"]["name"]
    assert model["modelFormat"]["name"] in [f["name"] for f in runtime["spec"]["supportedModelFormats"]]
    assert service["spec"]["predictor"]["minReplicas"] >= 2
    dockerfile = (REPO / "examples/kserve/Dockerfile").read_text()
    assert "FROM nvcr.io/nvidia/tritonserver:" in dockerfile and '"tfm-export" "numpy<2"' in dockerfile
