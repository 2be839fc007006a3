"""fp16 and int8 model directories: what the graphs contain, how close they stay to fp32, bad input."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from click.testing import CliRunner
from onnx import numpy_helper
from onnxruntime.quantization import QuantType, quantize_dynamic
from support.backends import concat_backend, step_backend
from support.common import CALIBRATION, REPO, listing, tiny_config, unwritable_dir
from support.hf_oracle import randomize

from tfm_export.artifacts.model_dir import SHARED, read_manifest
from tfm_export.cli.export_cli import main as export_main
from tfm_export.core.config import ModelConfig
from tfm_export.core.graph_spec import CONTRACT_GRAPHS, DEFAULT_OPSET, Graph
from tfm_export.demo import numbers as demo_numbers
from tfm_export.graphs.export import export_all
from tfm_export.model.huggingface import load_hf_directory
from tfm_export.model.loading import load_checkpoint
from tfm_export.model.synthetic import random_checkpoint
from tfm_export.model.transformer import Transformer
from tfm_export.precision.fp16 import to_fp16
from tfm_export.precision.int8 import (
    _quiet_onnxruntime_quantizer,
    fold_weight_transposes,
    logits_nodes,
    quantize_dynamic_graph,
    quantize_matmuls_dynamic,
)
from tfm_export.precision.pipeline import Calibration, quantize_model_dir
from tfm_export.runtime import decoding
from tfm_export.runtime.backends import DEVICE, INPLACE
from tfm_export.runtime.step_graph import SEARCH
from tfm_export.runtime.translator import DecodeOptions, Translator
from tfm_export.verify.precision import compare_decodes


def _graph(directory, graph: Graph) -> onnx.ModelProto:
    return onnx.load(str(directory / graph.filename))


def _producers(proto):
    return {out: node for node in proto.graph.node for out in node.output}


@pytest.mark.parametrize("graph", list(CONTRACT_GRAPHS))
def test_int8_static_has_qdq_around_matmuls_and_none_around_layernorm_softmax(variants, graph):
    proto = _graph(variants["int8-static"], graph)
    producers = _producers(proto)
    inits = {i.name: numpy_helper.to_array(i) for i in proto.graph.initializer}
    logits = logits_nodes(proto)
    matmuls = [n for n in proto.graph.node if n.op_type == "MatMul" and n.name not in logits]
    assert matmuls and len(logits) == (graph is Graph.DECODER_STEP)
    for node in [n for n in proto.graph.node if n.name in logits]:  # float hidden state x int8 weight
        activation, weight = (producers.get(name) for name in node.input)
        assert activation.op_type == "LayerNormalization"
        assert weight.op_type == "DequantizeLinear" and inits[weight.input[0]].dtype == np.int8
    weights = 0
    for node in matmuls:
        sources = [producers.get(name) for name in node.input]
        assert all(s is not None and s.op_type == "DequantizeLinear" for s in sources), node.name
        for dq in sources:
            if dq.input[0] in inits:  # a weight: int8, per output channel, zero point 0
                weights += 1
                assert inits[dq.input[0]].dtype == np.int8 and inits[dq.input[1]].size > 1
                assert all(not inits[z].any() for z in dq.input[2:] if z)
            else:  # an activation: DequantizeLinear(QuantizeLinear(x))
                assert producers[dq.input[0]].op_type == "QuantizeLinear"
    assert weights >= 2
    for node in proto.graph.node:  # these compute on float inputs (a Q after them belongs to the next MatMul)
        if node.op_type in ("LayerNormalization", "Softmax", "Add"):
            assert all(producers.get(i) is None or producers[i].op_type != "DequantizeLinear"
                       for i in node.input), node.name
    zero_points = [inits[n.input[2]] for n in proto.graph.node
                   if n.op_type in ("QuantizeLinear", "DequantizeLinear") and len(n.input) > 2 and n.input[2]]
    assert zero_points and all(not z.any() and z.dtype == np.int8 for z in zero_points)  # symmetric int8


def test_int8_graphs_store_no_float_matrices(variants):
    """Every 2-D weight, embeddings and the tied projection included, is int8 (the position table stays float)."""
    for name in ("int8-static", "int8-dynamic"):
        for graph in CONTRACT_GRAPHS:
            floats = [i.name for i in _graph(variants[name], graph).graph.initializer
                      if i.data_type == onnx.TensorProto.FLOAT and len(i.dims) == 2]
            assert floats == [], (name, graph, floats)


def test_int8_dynamic_search_step_shares_the_encoders_int8_table(variants):
    """decoder_step_search's embedding reads the encoder's own int8 table (per-row scales), kept once in its
    .data file and given to both sessions: zeroing that one array changes both graphs' outputs. Its projection
    keeps its own int8 W^T, which only the MatMul reads (so ONNX Runtime can free it once prepacked)."""
    directory = variants["int8-dynamic"]
    manifest = read_manifest(directory)
    [entry] = manifest["graphs"][SEARCH.value][SHARED]
    assert entry["dtype"] == "int8" and entry["shape"] == list(ModelConfig.from_dict(manifest["model"]).tied_table)
    proto = onnx.load(str(directory / SEARCH.filename), load_external_data=False)
    readers = [n.op_type for n in proto.graph.node if entry["name"] in n.input]
    assert readers and set(readers) == {"Gather"}
    backend = step_backend(directory, INPLACE)
    src, first = np.array([[2, 5, 6, 7, 3]]), np.array([[2]])
    encoded = backend.run_encoder(src)["last_hidden_state"]
    logits = backend.run_step(backend.encode(src), first)[1]
    backend.sessions.shared[entry["name"]].numpy()[:] = 0
    assert not np.allclose(backend.run_encoder(src)["last_hidden_state"], encoded)
    assert not np.allclose(backend.run_step(backend.encode(src), first)[1], logits)


def test_int8_dynamic_folds_the_logits_scale_into_the_weight_scales(tmp_path):
    """A projection scaled by d_model ** -0.5 ("prj") computes its logits in one quantized MatMul: the scalar
    joins the weight's per-channel scales, and the logits equal ONNX Runtime's quantizer's unfolded graph's."""
    ckpt = load_checkpoint(random_checkpoint(tiny_config(scale_emb_or_prj="prj"), tmp_path / "ckpt"))
    step = export_all(ckpt.model, DEFAULT_OPSET, variants=False)[Graph.DECODER_STEP]  # the contract's graphs only
    folded = quantize_dynamic_graph(copy.deepcopy(step), int8_embeddings=False)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("tfm_export.precision.int8.fold_output_scales", lambda proto: proto)
        plain = quantize_dynamic_graph(copy.deepcopy(step), int8_embeddings=False)
    scalars = {i.name for i in plain.graph.initializer if not i.dims}
    assert _producers(plain)["logits"].op_type == "Mul" and _producers(plain)["logits"].input[1] in scalars
    producers = _producers(folded)
    assert producers[producers["logits"].input[0]].op_type == "Cast"
    assert len(folded.graph.node) == len(plain.graph.node) - 1
    rng = np.random.default_rng(0)
    feeds = {"input_ids": np.array([[2], [5]]), "encoder_attention_mask": np.ones((2, 3), np.int64)}
    for name in [i.name for i in plain.graph.input if i.name.startswith("past_key_values")]:
        feeds[name] = rng.standard_normal((2, 2, 1 if ".decoder." in name else 3, 8)).astype(np.float32)
    got, want = (ort.InferenceSession(m.SerializeToString()).run(["logits"], feeds)[0] for m in (folded, plain))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_int8_dynamic_weights_are_onnxruntimes_quantizers_to_the_bit(tmp_path):
    """quantize_matmuls_dynamic against onnxruntime.quantization.quantize_dynamic itself, on a step graph with a
    column of zeros (scale 1.0), one all positive (the range widened to hold 0) and one of huge values: the same
    nodes, the same int8 weights, scales and zero points, and the same logits to the bit."""
    ckpt = load_checkpoint(random_checkpoint(tiny_config(), tmp_path / "ckpt"))
    step = fold_weight_transposes(export_all(ckpt.model, DEFAULT_OPSET, variants=False)[Graph.DECODER_STEP])
    weight = next(i for i in step.graph.initializer if len(i.dims) == 2 and i.dims[1] >= 3
                  and any(n.op_type == "MatMul" and n.input[1] == i.name for n in step.graph.node))
    values = numpy_helper.to_array(weight).copy()
    values[:, 0], values[:, 1], values[:, 2] = 0.0, np.abs(values[:, 1]) + 0.5, values[:, 2] * 1e30
    weight.CopyFrom(numpy_helper.from_array(values, weight.name))
    onnx.save(step, tmp_path / "fp32.onnx")
    with _quiet_onnxruntime_quantizer():
        quantize_dynamic(str(tmp_path / "fp32.onnx"), str(tmp_path / "int8.onnx"), op_types_to_quantize=["MatMul"],
                         per_channel=True, weight_type=QuantType.QInt8)
    theirs, ours = onnx.load(tmp_path / "int8.onnx"), quantize_matmuls_dynamic(copy.deepcopy(step))

    def nodes(proto):
        return sorted((n.op_type, *n.input, "->", *n.output) for n in proto.graph.node)

    def weights(proto):
        return {i.name: numpy_helper.to_array(i) for i in proto.graph.initializer}
    assert nodes(ours) == nodes(theirs) and any(n[0] == "MatMulInteger" for n in nodes(ours))
    mine, library = weights(ours), weights(theirs)
    assert mine.keys() == library.keys()
    for name, array in library.items():
        assert mine[name].dtype == array.dtype and np.array_equal(mine[name], array), name
    assert mine[f"{weight.name}_scale"][0] == 1.0
    feeds = {"input_ids": np.array([[2], [5]]), "encoder_attention_mask": np.ones((2, 3), np.int64)}
    rng = np.random.default_rng(0)
    for name in [i.name for i in step.graph.input if i.name.startswith("past_key_values")]:
        feeds[name] = rng.standard_normal((2, 2, 1 if ".decoder." in name else 3, 8)).astype(np.float32)
    got, want = (ort.InferenceSession(m.SerializeToString()).run(["logits"], feeds)[0] for m in (ours, theirs))
    assert np.array_equal(got, want)


def test_int8_dynamic_quantizes_weights_at_run_time(variants):
    ops = {n.op_type for n in _graph(variants["int8-dynamic"], Graph.DECODER_STEP).graph.node}
    assert {"DynamicQuantizeLinear", "MatMulInteger"} <= ops and "QuantizeLinear" not in ops


def _io_types(proto) -> dict[str, int]:
    return {v.name: v.type.tensor_type.elem_type for v in [*proto.graph.input, *proto.graph.output]}


def test_fp16_io_types(variants):
    f32, f16, i64 = onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.INT64
    for graph in CONTRACT_GRAPHS:
        kept = _io_types(_graph(variants["fp16-io"], graph))
        assert set(kept.values()) == {f32, i64}  # --keep-io-types: the fp32 contract exactly
        default = _io_types(_graph(variants["fp16"], graph))
        for name, kind in default.items():
            want = i64 if kind == i64 else f32 if name == "logits" else f16
            assert kind == want, name


def test_fp16_keeps_layernorm_softmax_residuals_and_logits_in_fp32(variants):
    proto = onnx.shape_inference.infer_shapes(_graph(variants["fp16"], Graph.DECODER_STEP))
    types = {v.name: v.type.tensor_type.elem_type for v in [*proto.graph.value_info, *proto.graph.output]}
    for node in proto.graph.node:
        if node.op_type in ("LayerNormalization", "Softmax"):
            assert types[node.output[0]] == onnx.TensorProto.FLOAT, node.name
    matmuls = [n for n in proto.graph.node if n.op_type == "MatMul"]
    assert sum(types[n.output[0]] == onnx.TensorProto.FLOAT16 for n in matmuls) >= len(matmuls) - 1
    weights = [i.data_type for i in proto.graph.initializer if len(i.dims) == 2]
    assert weights.count(onnx.TensorProto.FLOAT16) >= len(weights) - 1  # the logits weight may stay fp32
    manifest = json.loads((variants["fp16"] / "manifest.json").read_text())
    kept = manifest["fp16"]["kept_fp32"]["decoder_step"]
    assert kept["MatMul (logits)"] == 1 and kept["LayerNormalization"] == 10 and kept["Add (residual)"] >= 9


def test_manifest_records_precision_calibration_and_parent(variants):
    from tfm_export.artifacts.model_dir import ModelDir
    for directory in variants.values():  # each record, copied from its parent's, reads back as the JSON on disk
        assert ModelDir.read(directory).manifest.to_dict() == json.loads((directory / "manifest.json").read_text())
    parent = json.loads((variants["fp32"] / "manifest.json").read_text())
    manifest = json.loads((variants["int8-static"] / "manifest.json").read_text())
    assert manifest["precision"] == "int8" and manifest["int8"]["mode"] == "static"
    calibration = manifest["int8"]["calibration"]
    assert calibration["sentences"] == 500 and calibration["unknown_token_rate"] == 0
    import hashlib
    assert calibration["sha256"] == hashlib.sha256(CALIBRATION.read_bytes()).hexdigest()
    assert set(manifest["int8"]["kept_float"]["encoder"]) >= {"LayerNormalization", "Softmax", "Add"}
    assert manifest["parent"]["graphs_sha256"] == {g: e["sha256"] for g, e in parent["graphs"].items()}
    for graph in CONTRACT_GRAPHS:  # the same contract: names and axes
        for side in ("inputs", "outputs"):
            strip = [(t["name"], t["shape"]) for t in manifest["graphs"][graph.value][side]]
            assert strip == [(t["name"], t["shape"]) for t in parent["graphs"][graph.value][side]]
    tokenizer = "tokenizer.json"
    assert (variants["int8-static"] / tokenizer).read_bytes() == (variants["fp32"] / tokenizer).read_bytes()
    for name in ("int8-static", "int8-dynamic", "fp16"):  # each says once what it does, of graphs it has
        made = json.loads((variants[name] / "manifest.json").read_text())
        notes = made["optimizations"]
        assert len(notes) == len(set(notes))
        shares = SEARCH.value in made["graphs"]
        assert shares == (name != "int8-static") == (SEARCH.value not in made.get("optimizations_not_applied", {}))
        assert any(n.startswith(f"{SEARCH.value} keeps") for n in notes) == shares


def test_calibration_texts_never_contain_a_test_number():
    held_out = {demo_numbers.english(n) for n in demo_numbers.held_out_numbers()}
    lines = CALIBRATION.read_text().splitlines()
    assert len(lines) == 500 and not held_out & set(lines)


def test_held_out_files_match_the_test_numbers():
    pairs = demo_numbers.held_out_pairs()
    assert (REPO / "models/demo/heldout.en.txt").read_text().splitlines() == [en for en, _ in pairs]
    assert (REPO / "models/demo/heldout.fr.txt").read_text().splitlines() == [fr for _, fr in pairs]


def _exact_match(directory) -> float:
    pairs = demo_numbers.held_out_pairs()
    out = Translator.load(directory).translate([en for en, _ in pairs], DecodeOptions(batch_size=100))
    return demo_numbers.exact_match([t.text for t in out], [fr for _, fr in pairs])[0]


def test_int8_loses_at_most_one_point_of_exact_match(variants):
    fp32 = _exact_match(variants["fp32"])
    for name in ("int8-static", "int8-dynamic"):
        assert _exact_match(variants[name]) >= fp32 - 0.01, name


@pytest.mark.parametrize("name", ["fp16", "fp16-io"])
def test_fp16_keeps_token_agreement_with_fp32(variants, name):
    texts = [en for en, _ in demo_numbers.held_out_pairs()]
    greedy = compare_decodes(Translator.load(variants[name]), Translator.load(variants["fp32"]), texts, 1, None)[0]
    assert greedy.agreement.rate >= 0.995 and greedy.token_rate >= 0.995


def test_verify_compares_with_the_parent_and_writes_a_report(variants, tmp_path):
    result = CliRunner().invoke(export_main, [
        "verify", "--model", str(variants["int8-dynamic"]), "--input", str(REPO / "models/demo/samples.en.txt"),
        "--report", str(tmp_path / "report")])
    assert result.exit_code == 0, result.output
    assert "decoder_step logits" in result.output and "int8 OK against fp32" in result.output
    report = (tmp_path / "report" / "precision-report.md").read_text()
    assert "| greedy |" in report and "| beam 4 |" in report
    for png in ("errors-encoder.png", "errors-decoder_step.png"):
        assert (tmp_path / "report" / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_verify_references_give_exact_match_and_bleu(variants, tmp_path):
    pairs = demo_numbers.held_out_pairs()[:50]
    (tmp_path / "en.txt").write_text("\n".join(en for en, _ in pairs) + "\n")
    (tmp_path / "fr.txt").write_text("\n".join(fr for _, fr in pairs) + "\n")
    result = CliRunner().invoke(export_main, ["verify", "--model", str(variants["fp16"]), "--input",
                                              str(tmp_path / "en.txt"), "--references", str(tmp_path / "fr.txt")])
    assert result.exit_code == 0, result.output
    greedy = next(line for line in result.output.splitlines() if line.startswith("| greedy |"))
    rates = []
    for name in ("fp32", "fp16"):
        out = Translator.load(variants[name]).translate([en for en, _ in pairs])
        rates.append(100 * demo_numbers.exact_match([t.text for t in out], [fr for _, fr in pairs])[0])
    assert f"| {rates[0]:.1f}% -> {rates[1]:.1f}% |" in greedy


def test_runtime_runs_fp16_cache_tensors(variants):
    """The runtime feeds an fp16 graph fp16 cache tensors (an empty past of the right dtype included)."""
    from support.backends import concat_backend
    assert concat_backend(variants["fp16"]).cache_dtype == np.float16
    assert concat_backend(variants["fp16-io"]).cache_dtype == np.float32
    texts = ["forty-two", "one thousand and one"]
    assert [t.text for t in Translator.load(variants["fp16"]).translate(texts)] == ["quarante-deux", "mille un"]


def _quantize(args):
    return CliRunner().invoke(export_main, ["quantize", *args])


@pytest.mark.parametrize("args, message", [
    (["--precision", "int8"], "needs --calibration FILE: sentences in the model's source language, one per line "
                              "(calibration/README.md); or pass --mode dynamic for int8 without calibration"),
    (["--precision", "int8", "--calibration", "missing.txt"], "missing.txt: cannot read input"),
    (["--precision", "int8", "--calibration", "empty.txt"], "empty.txt: has no non-empty lines"),
    (["--precision", "int8", "--mode", "dynamic", "--calibration", "empty.txt"], "--calibration is only used by"),
    (["--precision", "fp16", "--calibration", "empty.txt"], "--calibration is only used by"),
])
def test_bad_quantize_requests_are_one_line_errors(demo_onnx, tmp_path, monkeypatch, args, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "empty.txt").write_text("\n  \n")
    before = listing(tmp_path)
    result = _quantize(["--model", str(demo_onnx), "--output", "out", *args])
    assert result.exit_code == 1, result.output
    assert len(result.output.strip().splitlines()) == 1 and message in result.output
    assert listing(tmp_path) == before


def test_unknown_precision_is_a_usage_error(demo_onnx, tmp_path):
    result = _quantize(["--model", str(demo_onnx), "--precision", "int4", "--output", str(tmp_path / "o")])
    assert result.exit_code == 2 and "'int4' is not one of 'fp16', 'int8'" in result.output


def test_quantizing_a_quantized_model_is_refused(variants, tmp_path):
    result = _quantize(["--model", str(variants["int8-dynamic"]), "--precision", "fp16", "--output",
                        str(tmp_path / "o")])
    assert result.exit_code == 1 and "is already int8; quantize the fp32 model directory" in result.output


def test_calibration_in_another_language_warns_loudly(demo_onnx, tmp_path):
    (tmp_path / "de.txt").write_text("zweiundvierzig\neinhundert und eins\n")
    cli = Path(sys.executable).parent / "tfm-export"  # the real command: its warning must reach stderr
    result = subprocess.run([str(cli), "quantize", "--model", str(demo_onnx), "--precision", "int8", "--calibration",
                             str(tmp_path / "de.txt"), "--output", str(tmp_path / "o")], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "WARNING" in result.stderr and "100% of its tokens are unknown to the model's source vocabulary" \
        in result.stderr
    manifest = json.loads((tmp_path / "o" / "manifest.json").read_text())
    assert manifest["int8"]["calibration"]["unknown_token_rate"] == 1.0


@pytest.mark.parametrize("args, message", [
    (["--precision", "int8", "--mode", "dynamic", "--keep-io-types"], "--keep-io-types is only for --precision fp16"),
    (["--precision", "int8", "--calibration", str(CALIBRATION), "--calibration-max-length", "500"],
     "--calibration-max-length 500 is beyond the model's 200 target positions"),
    (["--precision", "int8", "--calibration-max-length", "5"],
     "--calibration-max-length is only for --precision int8"),
    (["--precision", "int8", "--mode", "dynamic", "--calibration-max-length", "5"],
     "--mode static, with --calibration"),
    (["--precision", "fp16", "--mode", "dynamic"], "--mode is only for --precision int8"),
])
def test_options_that_do_not_fit_are_refused(demo_onnx, tmp_path, args, message):
    result = _quantize(["--model", str(demo_onnx), "--output", str(tmp_path / "o"), *args])
    assert result.exit_code == 1 and message in result.output and len(result.output.strip().splitlines()) == 1
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("damage, message", [
    (lambda m: m["tokenizer"].update(source="../elsewhere.json"), "'../elsewhere.json' is not a plain file name"),
    (lambda m: m.update(precision=None), "has an invalid precision"),
    (lambda m: m.update(optimizations=None), "has an invalid optimizations"),
])
def test_damaged_manifests_are_one_line_errors(demo_onnx, tmp_path, damage, message):
    import shutil
    copy = tmp_path / "model"
    shutil.copytree(demo_onnx, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    damage(manifest)
    (copy / "manifest.json").write_text(json.dumps(manifest))
    before = listing(tmp_path)
    result = _quantize(["--model", str(copy), "--precision", "fp16", "--output", str(tmp_path / "o")])
    assert result.exit_code == 1 and message in result.output and len(result.output.strip().splitlines()) == 1
    assert listing(tmp_path) == before


def test_verify_refuses_a_manifest_without_parent(variants, tmp_path):
    import shutil
    copy = tmp_path / "model"
    shutil.copytree(variants["fp16"], copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["parent"] = "x"
    (copy / "manifest.json").write_text(json.dumps(manifest))
    result = CliRunner().invoke(export_main, ["verify", "--model", str(copy), "--input",
                                              str(REPO / "models/demo/samples.en.txt")])
    assert result.exit_code == 1 and "names no fp32 parent" in result.output
    result = _quantize(["--model", str(copy), "--precision", "int8", "--output", str(tmp_path / "o")])
    assert result.exit_code == 1 and result.output.strip().splitlines() == [
        f"Error: {copy}: is already fp16; quantize the fp32 model directory (its fp32 parent) instead"]


def test_fp16_logits_are_not_rounded_to_fp16(variants):
    """The logits projection is fp32 and nothing rounds its output through fp16 on the way out."""
    from support.backends import concat_backend
    backend = concat_backend(variants["fp16"])
    state = backend.encode(np.array([[2, 10, 11, 12, 3]]))
    _, logits = backend.run_step(state, np.array([[2]]))
    assert not np.array_equal(logits, logits.astype(np.float16).astype(np.float32))
    proto = _graph(variants["fp16"], Graph.DECODER_STEP)
    producers = _producers(proto)
    cast = producers["logits"]
    assert cast.op_type != "Cast" or producers[cast.input[0]].op_type != "Cast"


def test_fp16_directories_carry_the_fused_step_which_decodes_as_their_search_step(variants):
    """The fused step is made in fp16 too (for CUDA, `--fused`): on the CPU, its 200 held-out decodes (beam 4) are
    the fp16 decoder_step_search's, in place and in the device backend's fixed shapes."""
    from tfm_export.demo import numbers as demo_numbers
    from tfm_export.runtime import DecodeOptions, Translator
    from tfm_export.runtime.backends import open_backend
    from tfm_export.runtime.step_graph import FUSED, StepOptions
    texts = [en for en, _ in demo_numbers.held_out_pairs()[:200]]
    decoded = {}
    for cache, fused in ((INPLACE, False), (INPLACE, True), (DEVICE, True)):
        opened = open_backend(variants["fp16"], cache, step=StepOptions(fused=fused))
        graph = opened.backend.decoder.get_modelmeta().custom_metadata_map["tfm_export.graph"]
        assert graph == (FUSED if fused else SEARCH).value
        decoded[cache, fused] = [t.ids for t in Translator.of(opened).translate(texts, DecodeOptions(beam_size=4))]
    assert decoded[INPLACE, True] == decoded[INPLACE, False] == decoded[DEVICE, True]
    assert read_manifest(variants["fp16"])["graphs"][FUSED.value]["inputs"][5]["name"] == "total_sequence_length"


def test_the_device_backend_runs_fp16_caches(variants):
    """The GPU path's backend (all memory in OrtValues, here on the CPU) with an fp16 cache: as the contract's step."""
    from tfm_export.graphs.inputs import random_sources
    src = random_sources(88, 3, 8, seed=1)
    plain, device = concat_backend(variants["fp16"]), step_backend(variants["fp16"], DEVICE)
    assert device.sessions.cache_dtype == np.float16
    for search in (decoding.greedy, lambda b, s, n: [h[0] for h in decoding.beam_search(b, s, 3, n)]):
        assert [h.tokens for h in search(device, src, 10)] == [h.tokens for h in search(plain, src, 10)]


def test_unwritable_output_leaves_nothing(demo_onnx, tmp_path):
    with unwritable_dir(tmp_path / "ro"):
        result = _quantize(["--model", str(demo_onnx), "--precision", "fp16", "--output", str(tmp_path / "ro" / "o")])
    assert result.exit_code == 1 and "not writable" in result.output
    assert listing(tmp_path / "ro") == []


def test_verify_of_a_quantized_dir_needs_input_and_the_right_parent(variants, demo_onnx, tmp_path):
    model = str(variants["fp16"])
    result = CliRunner().invoke(export_main, ["verify", "--model", model])
    assert result.exit_code == 1 and "--input FILE is required" in result.output
    samples = str(REPO / "models/demo/samples.en.txt")
    result = CliRunner().invoke(export_main, ["verify", "--model", model, "--input", samples,
                                              "--reference", str(variants["fp16-io"])])
    assert result.exit_code == 1 and "is not the fp32 directory" in result.output


@pytest.mark.slow
def test_base_config_int8_is_at_least_3_5x_smaller(base_variants):
    fp32 = base_variants["fp32"]
    for mode in ("int8-static", "int8-dynamic"):
        for graph in CONTRACT_GRAPHS:
            ratio = (fp32 / graph.filename).stat().st_size / (base_variants[mode] / graph.filename).stat().st_size
            assert ratio >= 3.5, (mode, graph, ratio)


def test_static_graphs_run_with_folded_qdq_on_cpu(variants):
    """ONNX Runtime's x86 kernels would dequantize every weight per call; folded, the same Q/DQ model runs."""
    from support.backends import concat_backend
    entry = "session.disable_quant_qdq"
    static, dynamic = concat_backend(variants["int8-static"]), concat_backend(variants["int8-dynamic"])
    assert static.decoder.get_session_options().get_session_config_entry(entry) == "1"
    with pytest.raises(RuntimeError, match="does not have configuration with key"):  # never set
        dynamic.decoder.get_session_options().get_session_config_entry(entry)


@pytest.mark.parametrize("mode", ["static", "dynamic"])
def test_float_embeddings_keep_the_tables_float(demo_onnx, tmp_path, mode):
    from tfm_export.trt.compat import check_model_dir
    texts = CALIBRATION.read_text().splitlines()[:64]
    calibration = Calibration(CALIBRATION, texts) if mode == "static" else None
    manifest = quantize_model_dir(demo_onnx, tmp_path / mode, "int8", mode, calibration, progress=False,
                                  float_embeddings=True)
    assert manifest.int8["embeddings"] == "float (--float-embeddings)"
    for graph in CONTRACT_GRAPHS:
        proto = _graph(tmp_path / mode, graph)
        inits = {i.name: i for i in proto.graph.initializer}
        gathers = [n for n in proto.graph.node if n.op_type == "Gather" and n.input[0] in inits
                   and len(inits[n.input[0]].dims) == 2 and inits[n.input[0]].dims[0] > 1]
        assert gathers and all(inits[n.input[0]].data_type == onnx.TensorProto.FLOAT for n in gathers)
    if mode == "static":
        assert check_model_dir(tmp_path / mode).errors() == []
    result = CliRunner().invoke(export_main, ["quantize", "--model", str(demo_onnx), "--precision", "fp16",
                                              "--float-embeddings", "--output", str(tmp_path / "x")])
    assert result.exit_code == 1 and "--float-embeddings is only for --precision int8" in result.output


def test_sigterm_leaves_no_staging_directory(demo_onnx, tmp_path):
    """kill/timeout/a cancelled CI job unwind like Ctrl-C: the hidden staging directory is removed."""
    import signal
    import time
    texts = CALIBRATION.read_text().splitlines()
    (tmp_path / "big.txt").write_text("\n".join(texts * 20) + "\n")
    command = [str(Path(sys.executable).parent / "tfm-export"), "quantize", "--model", str(demo_onnx),
               "--precision", "int8", "--calibration", str(tmp_path / "big.txt"), "--output", str(tmp_path / "out")]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not list(tmp_path.glob(".out.*.partial")) and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert process.poll() is None, "quantize ended before it could be interrupted"
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 130 and "interrupted" in err and "Traceback" not in err
    assert listing(tmp_path) == ["big.txt"]


def test_a_damaged_graph_with_a_matching_hash_is_one_line(demo_onnx, tmp_path):
    import shutil

    from tfm_export.artifacts.manifest import write_manifest
    from tfm_export.artifacts.model_dir import read_manifest
    from tfm_export.core.files import file_sha256
    damaged = tmp_path / "damaged"
    shutil.copytree(demo_onnx, damaged)
    graph = damaged / Graph.DECODER_STEP.filename
    graph.write_bytes(graph.read_bytes()[:100_000])
    manifest = read_manifest(damaged)
    manifest["graphs"]["decoder_step"]["sha256"] = file_sha256(graph)
    write_manifest(damaged, manifest)
    for args in (["check", "--model", str(damaged)], ["inspect", "--model", str(damaged)],
                 ["quantize", "--model", str(damaged), "--precision", "fp16", "--output", str(tmp_path / "q")]):
        result = CliRunner().invoke(export_main, args)
        assert result.exit_code == 1 and "Traceback" not in result.output, (args, result.output)
        assert result.output.strip().splitlines()[-1].endswith("not a readable ONNX graph (DecodeError); export the "
                                                              "model again"), (args, result.output)
    assert not (tmp_path / "q").exists()


def test_verify_refuses_fp32_only_options_on_quantized_directories(variants):
    samples = str(REPO / "models" / "demo" / "samples.en.txt")
    result = CliRunner().invoke(export_main, ["verify", "--model", str(variants["int8-static"]), "--input", samples,
                                              "--samples", "5", "--atol", "0.1"])
    assert result.exit_code == 1 and "--samples, --atol: for fp32 directories only" in result.output


def test_output_inside_or_equal_to_the_model_directory_is_refused(demo_onnx):
    before = listing(demo_onnx)
    for output, message in ((demo_onnx / "sub", "is inside the input"), (demo_onnx, "is the input itself")):
        result = _quantize(["--model", str(demo_onnx), "--precision", "fp16", "--output", str(output), "--force"])
        assert result.exit_code == 1 and message in result.output, result.output
    assert listing(demo_onnx) == before


# --- the maths under the converters, against hand computations -----------------------------------------------

def _feeds_layer_norm(name: str, readers: dict[str, list[onnx.NodeProto]], types: dict[str, int]) -> bool:
    """Read by a LayerNormalization directly or through a float -> float Cast (a copy)."""
    return any(r.op_type == "LayerNormalization" or (
        r.op_type == "Cast" and types.get(r.output[0]) == onnx.TensorProto.FLOAT
        and _feeds_layer_norm(r.output[0], readers, types)) for r in readers.get(name, []))


def test_fp16_residual_adds_are_float_in_the_graph_itself(variants):
    """Not the manifest's own count: every Add that feeds a LayerNormalization computes in fp32 in the graph, and
    so do its inputs (a cast-down-and-up round trip in front of it would round what was kept)."""
    for graph in CONTRACT_GRAPHS:
        proto = onnx.shape_inference.infer_shapes(_graph(variants["fp16"], graph))
        types = {v.name: v.type.tensor_type.elem_type for v in [*proto.graph.input, *proto.graph.value_info]}
        types.update({i.name: i.data_type for i in proto.graph.initializer})
        readers: dict[str, list[onnx.NodeProto]] = {}
        for node in proto.graph.node:
            for name in node.input:
                readers.setdefault(name, []).append(node)
        residual = [n for n in proto.graph.node
                    if n.op_type == "Add" and _feeds_layer_norm(n.output[0], readers, types)]
        assert len(residual) >= 4, graph
        for node in residual:
            assert types[node.output[0]] == onnx.TensorProto.FLOAT, node.name
            assert all(types.get(i, onnx.TensorProto.FLOAT) == onnx.TensorProto.FLOAT for i in node.input), node.name


@pytest.mark.parametrize("mode", ["int8-static", "int8-dynamic"])
def test_int8_embedding_rows_dequantize_within_half_a_step_of_the_float_table(variants, mode):
    """table_int8[i] * scale[i] is within scale[i] / 2 of the fp32 table, and scale[i] is max |row i| / 127."""
    from tfm_export.artifacts.model_dir import ModelDir
    from tfm_export.graphs.onnx_io import load_graph
    fp32 = load_graph(ModelDir.read(variants["fp32"]), "encoder")
    quantized = _graph(variants[mode], Graph.ENCODER).graph
    values = {i.name: numpy_helper.to_array(i) for i in quantized.initializer}
    producers = {out: node for node in quantized.node for out in node.output}
    gathered = [n.input[0] for n in quantized.node if n.op_type == "Gather" and n.input[1] == "input_ids"]
    if len(gathered) == 1:  # Gather(DequantizeLinear(table_int8, scale), ids): TensorRT's layout
        dequantize = producers[gathered[0]]
        assert dequantize.op_type == "DequantizeLinear", dequantize.op_type
        q, scale = values[dequantize.input[0]], values[dequantize.input[1]]
        rows_axis = next((a.i for a in dequantize.attribute if a.name == "axis"), 1)
    else:  # Gather(table_int8, ids) * Gather(scale, ids): only the gathered rows are dequantized
        q = next(values[t] for t in gathered if values[t].dtype == np.int8)
        scale = next(values[t] for t in gathered if values[t].dtype == np.float32)
        rows_axis = 0
    assert q.dtype == np.int8 and scale.dtype == np.float32
    fp32_gather = next(n for n in fp32.graph.node if n.op_type == "Gather" and n.input[1] == "input_ids")
    table = next(numpy_helper.to_array(i) for i in fp32.graph.initializer if i.name == fp32_gather.input[0])
    assert q.shape == table.shape and scale.shape == (q.shape[rows_axis],)
    reference = table if rows_axis == 0 else table.T
    q = q if rows_axis == 0 else q.T
    dequantized = q * np.expand_dims(scale, 1)
    assert np.allclose(scale, np.abs(reference).max(axis=1) / 127, rtol=1e-6)
    assert (np.abs(dequantized - reference) <= np.expand_dims(scale, 1) / 2 + 1e-7).all()


def test_calibration_keeps_a_uniform_sample_of_the_calls():
    """Reservoir sampling: of 20 recorded calls, 4 are kept; over many runs every call is kept about as often
    (4/20), early and late ones alike, and a kept feed is a copy (the loop reorders the cache in place)."""
    import random

    from tfm_export.precision.calibration import Traces
    counts = np.zeros(20)
    for seed in range(3000):
        traces = Traces(max_feeds=4, _rng=random.Random(seed))
        for call in range(20):
            traces.add(Graph.ENCODER, {"x": np.array([call])})
        kept = [int(f["x"][0]) for f in traces.feeds[Graph.ENCODER]]
        assert len(kept) == 4 == len(set(kept)) and traces.calls[Graph.ENCODER] == 20
        counts[kept] += 1
    assert np.abs(counts / 3000 - 0.2).max() < 0.03
    feed = {"x": np.zeros(2)}
    traces = Traces(max_feeds=2)
    traces.add(Graph.DECODER_STEP, feed)
    feed["x"][0] = 5
    assert traces.feeds[Graph.DECODER_STEP][0]["x"][0] == 0


def _adds_into_norms(proto: onnx.ModelProto) -> list[str]:
    """An fp32 graph's Adds whose sum a norm reads (a LayerNormalization, or an RMSNorm's mean of squares, Pow),
    found by the graph's structure rather than by the converter's own rule."""
    readers: dict[str, set[str]] = {}
    for node in proto.graph.node:
        for name in node.input:
            readers.setdefault(name, set()).add(node.op_type)
    return [n.name for n in proto.graph.node
            if n.op_type == "Add" and readers.get(n.output[0], set()) & {"LayerNormalization", "Pow"}]


def _pre_norm_model(case: str, directory: Path) -> Transformer:
    """A tiny pre-norm model: of the variant family (RMSNorm), or read from a random mBART directory (LayerNorm,
    embedding norm, final norms)."""
    if case == "pre-norm rmsnorm":
        torch.manual_seed(0)
        return Transformer(tiny_config(placement="pre", norm="rmsnorm")).eval()
    transformers = pytest.importorskip("transformers", reason="the mBART model needs the hf extra")
    torch.manual_seed(0)
    sizes = dict(d_model=16, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2, decoder_attention_heads=2,
                 encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=32, vocab_size=50)
    hf_model = randomize(transformers.MBartForConditionalGeneration(transformers.MBartConfig(**sizes)), 1.0)
    hf_model.save_pretrained(directory)
    loaded = load_hf_directory(directory)
    model = Transformer(loaded.config)
    model.load_state_dict(loaded.state)
    return model.eval()


@pytest.mark.parametrize("case", ["pre-norm rmsnorm", "mbart"])
def test_fp16_keeps_every_residual_add_into_a_pre_norm_float(case, tmp_path):
    """In a pre-norm stack each residual sum feeds the next sublayer's norm and the next residual Add: every Add a
    norm reads computes in fp32 from fp32 inputs (by ONNX shape inference on the fp16 graph), and there are at
    least one per sublayer plus one (the embedding sum, or the last sum into the final norm)."""
    model = _pre_norm_model(case, tmp_path / "hf")
    assert model.config.placement == "pre" and model.config.n_layers == 2
    for graph, proto in export_all(model, 17, variants=False).items():
        names = _adds_into_norms(proto)
        sublayers = 2 if graph is Graph.ENCODER else 3
        assert len(names) >= sublayers * model.config.n_layers + 1, (graph, names)
        converted = onnx.shape_inference.infer_shapes(to_fp16(proto, keep_io_types=False)[0])
        types = {v.name: v.type.tensor_type.elem_type for v in [*converted.graph.input, *converted.graph.value_info,
                                                                 *converted.graph.output]}
        types.update({i.name: i.data_type for i in converted.graph.initializer})
        nodes = {n.name: n for n in converted.graph.node}
        for name in names:
            node = nodes[name]
            assert [types[t] for t in [*node.input, *node.output]] == [onnx.TensorProto.FLOAT] * 3, (graph, name)


def _parent_weights(parent: onnx.ModelProto) -> dict[str, np.ndarray]:
    """The fp32 parent's MatMuls by a constant weight: node name -> the (in, out) matrix it multiplies by (an
    initializer, or a Transpose of one: the tied projection)."""
    inits, producers = {i.name: i for i in parent.graph.initializer}, _producers(parent)
    weights = {}
    for node in [n for n in parent.graph.node if n.op_type == "MatMul"]:
        transpose = producers.get(node.input[1])
        if node.input[1] in inits:
            weights[node.name] = numpy_helper.to_array(inits[node.input[1]])
        elif transpose is not None and transpose.op_type == "Transpose" and transpose.input[0] in inits:
            perm = next((list(a.ints) for a in transpose.attribute if a.name == "perm"), None)
            weights[node.name] = np.transpose(numpy_helper.to_array(inits[transpose.input[0]]), perm)
    return weights


def _assert_per_output_channel(q: np.ndarray, scale: np.ndarray, weight: np.ndarray, what: str) -> None:
    """int8 `q` x `scale` (one per column j) is symmetric per-output-channel int8 of `weight` (in, out):
    scale[j] = max |W[:, j]| / 127, and every value within half a step."""
    assert q.dtype == np.int8 and q.shape == weight.shape and scale.shape == (weight.shape[1],), what
    np.testing.assert_allclose(scale, np.abs(weight).max(axis=0) / 127, rtol=1e-6, err_msg=what)
    assert (np.abs(q * scale - weight) <= scale / 2 + 1e-7).all(), what


def test_int8_static_weights_are_per_output_channel_of_the_fp32_weights(variants):
    """Every MatMul weight (the tied projection's included) is DequantizeLinear(W_int8, scale, axis 1): one scale
    per output column of x @ W, as the design fixes, with scales and values held to the fp32 parent directory's
    own initializers."""
    for graph in CONTRACT_GRAPHS:
        weights = _parent_weights(_graph(variants["fp32"], graph))
        proto = _graph(variants["int8-static"], graph)
        producers, inits = _producers(proto), {i.name: numpy_helper.to_array(i) for i in proto.graph.initializer}
        nodes = {n.name: n for n in proto.graph.node}
        assert len(weights) == 3 * (6 + 2) + (graph is Graph.DECODER_STEP)  # demo: 3 layers of 6 + FFN 2 (+ logits)
        for name, weight in weights.items():
            dq = producers[nodes[name].input[1]]
            assert dq.op_type == "DequantizeLinear" and [a.i for a in dq.attribute if a.name == "axis"] == [1], name
            _assert_per_output_channel(inits[dq.input[0]], inits[dq.input[1]], weight, f"{graph.value} {name}")


def test_int8_dynamic_weights_are_per_output_channel_of_the_fp32_weights(variants):
    """MatMulInteger(x_int8, W_int8) x (x_scale x W_scale): W_scale has one entry per output column, from the fp32
    parent's initializers as above."""
    for graph in CONTRACT_GRAPHS:
        weights = _parent_weights(_graph(variants["fp32"], graph))
        proto = _graph(variants["int8-dynamic"], graph)
        producers, inits = _producers(proto), {i.name: numpy_helper.to_array(i) for i in proto.graph.initializer}
        nodes = {n.name: n for n in proto.graph.node}
        readers: dict[str, list[onnx.NodeProto]] = {}
        for node in proto.graph.node:
            for name in node.input:
                readers.setdefault(name, []).append(node)
        for name, weight in weights.items():
            node = nodes[f"{name}_quant"]  # ONNX Runtime's name for the quantized MatMul
            [cast] = readers[node.output[0]]
            [scaled] = readers[cast.output[0]]
            scales = producers[next(i for i in scaled.input if i != cast.output[0])]
            assert node.op_type == "MatMulInteger" and producers[scales.input[0]].op_type == "DynamicQuantizeLinear"
            _assert_per_output_channel(inits[node.input[1]], inits[scales.input[1]], weight, f"{graph.value} {name}")


@pytest.mark.parametrize("mode", ["int8-static", "int8-dynamic"])
def test_int8_embeddings_are_the_fp32_rows_within_half_a_step(variants, mode):
    """What each graph's embedding lookup computes (its Gather of the input ids, run alone in ONNX Runtime on 6 ids) is
    the fp32 parent's within half a step of its row's scale, max |row| / 127: whichever axis a graph gathers along
    (the decoder step reads the tied projection's W^T), its scales follow the rows."""
    for graph in [g for g in read_manifest(variants[mode])["graphs"] if g != "decoder_step_search_fused"]:
        parent = onnx.load(str(variants["fp32"] / f"{graph}.onnx"))
        gather = next(n for n in parent.graph.node if n.op_type == "Gather" and n.input[1] == "input_ids")
        axis = next((a.i for a in gather.attribute if a.name == "axis"), 0)  # 1: the tied projection's W^T
        table = next(numpy_helper.to_array(i) for i in parent.graph.initializer if i.name == gather.input[0])
        rows = table if axis == 0 else table.T
        embedded = []
        for directory in (variants["fp32"], variants[mode]):
            part = onnx.utils.Extractor(onnx.load(str(directory / f"{graph}.onnx"))).extract_model(
                ["input_ids"], [gather.output[0]])
            session = ort.InferenceSession(part.SerializeToString())
            ids = np.array([4, 60, 87, 2, 5, 4]).reshape((6, 1) if session.get_inputs()[0].shape[1] == 1 else (2, 3))
            embedded.append(np.moveaxis(session.run(None, {"input_ids": ids})[0], 0, -1) if axis else
                            session.run(None, {"input_ids": ids})[0])
        assert embedded[0].shape == embedded[1].shape == (*ids.shape, rows.shape[1])
        np.testing.assert_array_equal(embedded[0], rows[ids])
        step = np.abs(rows).max(axis=1)[ids][..., None] / 127
        assert (np.abs(embedded[1] - embedded[0]) <= step / 2 + 1e-6).all(), graph
        assert not np.array_equal(embedded[1], embedded[0]), graph  # int8 indeed
