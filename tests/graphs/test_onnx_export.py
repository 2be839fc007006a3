"""ONNX export: the graph contract, parity with PyTorch step by step, decodes token-identical."""

from __future__ import annotations

import json
import shutil

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from click.testing import CliRunner
from onnx import numpy_helper
from onnxruntime.capi import onnxruntime_pybind11_state as ort_errors
from support.backends import assert_stepwise_parity, concat_backend, step_backend
from support.common import DEMO_CKPT, listing, tiny_config, unwritable_dir
from support.seed_oracle import save_seed_checkpoint, seed_settings, seed_state_dict, seed_vocab

from tfm_export.artifacts.model_dir import SHARED, ModelDirError, read_manifest
from tfm_export.artifacts.staging import staged_directory
from tfm_export.cli.export_cli import main as export_main
from tfm_export.core.batching import pad_batch
from tfm_export.core.config import ModelConfig
from tfm_export.core.errors import InputTextError, TfmExportError
from tfm_export.core.graph_spec import CONTRACT_GRAPHS, DEFAULT_OPSET, Graph, contract_specs
from tfm_export.core.tokenizer import BOS_ID, EOS_ID
from tfm_export.demo import numbers as demo_numbers
from tfm_export.graphs.inputs import random_sources
from tfm_export.graphs.onnx_io import save_graph
from tfm_export.graphs.pipeline import export_model_dir
from tfm_export.model import reference_decoding
from tfm_export.model.checkpoint import file_sha256
from tfm_export.model.loading import load_checkpoint
from tfm_export.model.synthetic import random_checkpoint
from tfm_export.runtime import decoding
from tfm_export.runtime.backends import INPLACE
from tfm_export.runtime.step_graph import FUSED, SEARCH


def make_ckpt(directory, cfg: ModelConfig, seed: int = 0):
    return load_checkpoint(random_checkpoint(cfg, directory, seed))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    base = tmp_path_factory.mktemp("tiny")
    ckpt = make_ckpt(base / "ckpt", tiny_config(n_position=40))
    export_model_dir(ckpt, base / "model", progress=False)
    return ckpt, base / "model"


@pytest.fixture(scope="module")
def again(tiny, tmp_path_factory):
    """The module's one second export of the same checkpoint: through the command line, with --force over a copy
    of the first (an export of ours, which --force replaces)."""
    ckpt, model = tiny
    out = tmp_path_factory.mktemp("again") / "m"
    shutil.copytree(model, out)
    result = CliRunner().invoke(export_main, ["onnx", "--checkpoint", str(ckpt.path), "--output", str(out), "--force"])
    return result, out


@pytest.fixture(scope="module")
def demo(demo_onnx):
    return load_checkpoint(DEMO_CKPT), demo_onnx


@pytest.mark.parametrize("batch", [1, 4])
def test_tiny_parity_step_by_step(tiny, batch):
    assert_stepwise_parity(*tiny, batch)


@pytest.mark.slow
def test_base_config_parity_step_by_step(base_onnx):
    for batch in (1, 4):
        assert_stepwise_parity(*base_onnx, batch)


def test_graphs_follow_the_contract(tiny):
    ckpt, directory = tiny
    specs = contract_specs(ckpt.config)
    for graph in CONTRACT_GRAPHS:
        proto = onnx.load(str(directory / graph.filename))
        onnx.checker.check_model(proto, full_check=True)
        spec = specs[graph]
        shapes = {v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]
                  for v in [*proto.graph.input, *proto.graph.output]}
        assert [v.name for v in proto.graph.input] == [t.name for t in spec.inputs]
        assert [v.name for v in proto.graph.output] == [t.name for t in spec.outputs]
        assert all(shapes[t.name] == list(t.shape) for t in [*spec.inputs, *spec.outputs])
        ids = [v for v in proto.graph.input if v.name == "input_ids"][0]
        assert ids.type.tensor_type.elem_type == onnx.TensorProto.INT64
        assert not {"If", "Loop", "Scan"} & {n.op_type for n in proto.graph.node}
        assert next(o.version for o in proto.opset_import if o.domain == "") == DEFAULT_OPSET
        meta = {p.key: p.value for p in proto.metadata_props}
        assert meta["tfm_export.source_checkpoint_sha256"] == ckpt.sha256
        assert ModelConfig.from_json(meta["tfm_export.config"]) == ckpt.config


def test_every_weight_is_stored_once(tiny):
    for graph in CONTRACT_GRAPHS:
        proto = onnx.load(str(tiny[1] / graph.filename))
        seen = set()
        for init in proto.graph.initializer:
            arr = numpy_helper.to_array(init)
            if arr.size < 16:
                continue  # shape constants
            for form in (arr, arr.T) if arr.ndim == 2 else (arr,):
                assert form.tobytes() not in seen, f"{graph.filename}: {init.name} duplicates another weight"
            seen.add(arr.tobytes())


def test_axis_names_never_shared_by_two_lengths(tiny):
    _, directory = tiny
    manifest = json.loads((directory / "manifest.json").read_text())
    axes: dict[str, set[str]] = {}  # symbol -> which tensors' which axis, across the contract's two graphs
    for graph in (manifest["graphs"][g.value] for g in CONTRACT_GRAPHS):
        for t in graph["inputs"] + graph["outputs"]:
            side = "source" if "encoder" in t["name"] or t["name"] in ("attention_mask", "last_hidden_state") \
                else "target"
            if graph["file"] == "encoder.onnx" and t["name"] == "input_ids":
                side = "source"
            for position, symbol in enumerate(t["shape"]):
                if isinstance(symbol, str):
                    axes.setdefault(symbol, set()).add("batch" if position == 0 else side)
    assert axes == {"batch_size": {"batch"}, "encoder_sequence_length": {"source"},
                    "decoder_sequence_length": {"target"}, "past_decoder_sequence_length": {"target"},
                    "past_decoder_sequence_length + decoder_sequence_length": {"target"}}


def test_manifest_records_what_consumers_need(tiny):
    ckpt, directory = tiny
    m = json.loads((directory / "manifest.json").read_text())
    assert m["special_tokens"] == {"unk": 0, "pad": 1, "bos": 2, "eos": 3}
    assert m["limits"]["max_source_length"] == 40 and m["precision"] == "fp32" and m["opset"] == DEFAULT_OPSET
    # the checkpoint by name and hash: no path of the machine that exported it (the directory is shipped)
    assert m["source_checkpoint"] == {"file": "ckpt.pt", "sha256": ckpt.sha256, "format": "tfm-export"}
    assert str(ckpt.path.parent.parent) not in (directory / "manifest.json").read_text()
    for graph in CONTRACT_GRAPHS:
        assert m["graphs"][graph.value]["sha256"] == file_sha256(directory / graph.filename)
    assert sorted(p.name for p in directory.iterdir()) == [
        ".tfm-cache", "decoder_step.onnx", "decoder_step_search.onnx", "decoder_step_search.onnx.data",
        "decoder_step_search_fused.onnx", "decoder_step_search_fused.onnx.data", "encoder.onnx", "manifest.json",
        "tokenizer.json"]  # .tfm-cache: the pre-packed graphs (runtime.prepacked_graphs)
    for graph in ("decoder_step_search", "decoder_step_search_fused"):
        assert m["graphs"][graph]["sha256"] == file_sha256(directory / f"{graph}.onnx")
    assert m["optimizations"]


@pytest.mark.parametrize("graph", [SEARCH, FUSED])
def test_the_tied_table_is_one_memory_for_both_sessions(tiny, graph):
    """decoder_step_search and its fused twin keep the tied embedding table in their .data files (standard external
    data), and the runtime gives that one array to the encoder's and the decoder's sessions: zeroing it changes both
    graphs' outputs, so neither reads a copy of its own."""
    ckpt, directory = tiny
    entries = read_manifest(directory)["graphs"][graph.value][SHARED]
    table = "model.encoder.src_word_emb.weight"  # one parameter: its first name in the model, in every graph
    assert [(e["name"], e["shape"]) for e in entries] == [(table, [13, 16])]
    assert table in {i.name for i in onnx.load(str(directory / "encoder.onnx")).graph.initializer}
    plain = ort.InferenceSession(str(directory / graph.filename))  # reads the .data itself
    assert plain.get_inputs()[0].name == "input_ids"
    backend = step_backend(directory, INPLACE, fused=graph is FUSED)
    src = np.array([[2, 5, 6, 7, 3]])
    before = backend.run_encoder(src)["last_hidden_state"]
    logits = backend.run_step(backend.encode(src), np.array([[2]]))[1]
    backend.sessions.shared[table].numpy()[:] = 0
    assert not np.allclose(backend.run_encoder(src)["last_hidden_state"], before)
    assert not np.allclose(backend.run_step(backend.encode(src), np.array([[2]]))[1], logits)
    fresh = step_backend(directory, INPLACE, fused=graph is FUSED)
    assert np.allclose(fresh.run_step(fresh.encode(src), np.array([[2]]))[1], logits)


def test_export_is_deterministic(tiny, again):
    result, out = again
    assert result.exit_code == 0, result.output
    hashes = [{g: manifest["graphs"][g]["sha256"] for g in manifest["graphs"]}
              for manifest in (read_manifest(tiny[1]), read_manifest(out))]
    assert hashes[0] == hashes[1] and Graph.DECODER_STEP.value in hashes[0]


@pytest.mark.slow
def test_opset_18_works(tmp_path):
    ckpt = make_ckpt(tmp_path / "ckpt", tiny_config(n_position=32))
    export_model_dir(ckpt, tmp_path / "a", opset=18, progress=False)
    proto = onnx.load(str(tmp_path / "a" / "decoder_step.onnx"))
    assert next(o.version for o in proto.opset_import if o.domain == "") == 18
    assert "LayerNormalization" in {n.op_type for n in proto.graph.node}
    assert_stepwise_parity(ckpt, tmp_path / "a", 2)
    from tfm_export.trt.compat import check_model_dir
    errors = [f"{f.release}: {f.message}" for f in check_model_dir(tmp_path / "a").errors()]
    assert errors and all(e.startswith("TensorRT 8.6: opset 18 is outside the parser's 9..17") for e in errors)


def test_demo_decodes_are_token_identical_to_reference(demo):
    ckpt, directory = demo
    backend = concat_backend(directory)
    texts = [en for en, _ in demo_numbers.held_out_pairs()[:200]]
    src = pad_batch([[BOS_ID, *ckpt.vocab.source.encode(t), EOS_ID] for t in texts])
    got = decoding.greedy(backend, src, 40)
    want = reference_decoding.greedy_decode(ckpt.model, torch.from_numpy(src), 40)
    assert [h.tokens for h in got] == [h.tokens for h in want]
    assert [h.score for h in got] == pytest.approx([h.score for h in want], abs=1e-3)
    got_b = decoding.beam_search(backend, src, 4, 40)
    want_b = reference_decoding.beam_search(ckpt.model, torch.from_numpy(src), 4, 40)
    assert [h[0].tokens for h in got_b] == [h[0].tokens for h in want_b]


SEED_VARIANTS = {
    "shared vocab, prj": dict(scale_emb_or_prj="prj"),
    "split vocab, emb, d_k*n_head != d_model": dict(embs_share_weight=False, src_vocab_size=9, trg_vocab_size=14,
                                                    scale_emb_or_prj="emb", d_k=5, d_v=3, n_head=3),
    "no sharing, none": dict(proj_share_weight=False, embs_share_weight=False, scale_emb_or_prj="none"),
}


# make test exports the variant that differs most (split vocabularies, odd head sizes); make test-slow the others
@pytest.mark.parametrize("variant", [pytest.param(v, marks=() if v.startswith("split") else pytest.mark.slow)
                                     for v in SEED_VARIANTS])
def test_seed_checkpoints_decode_identically(tmp_path, variant):
    opt = seed_settings(n_layers=2, **SEED_VARIANTS[variant])
    save_seed_checkpoint(tmp_path / "seed.chkpt", opt, seed_state_dict(opt))
    vocabs = []
    for side, size in (("src", opt.src_vocab_size), ("trg", opt.trg_vocab_size)):
        (tmp_path / f"{side}.txt").write_text("\n".join(seed_vocab(size)))
        vocabs.append(tmp_path / f"{side}.txt")
    ckpt = load_checkpoint(tmp_path / "seed.chkpt", vocabs if not opt.embs_share_weight else vocabs[:1])
    export_model_dir(ckpt, tmp_path / "model", progress=False)
    backend = concat_backend(tmp_path / "model")
    src = random_sources(opt.src_vocab_size, 24, 10, seed=3)
    got = decoding.greedy(backend, src, 12)
    want = reference_decoding.greedy_decode(ckpt.model, torch.from_numpy(src), 12)
    assert [h.tokens for h in got] == [h.tokens for h in want]
    got_b = decoding.beam_search(backend, src, 4, 12)
    want_b = reference_decoding.beam_search(ckpt.model, torch.from_numpy(src), 4, 12)
    assert [h[0].tokens for h in got_b] == [h[0].tokens for h in want_b]


def test_too_long_sequences_are_clear_errors(tiny):
    ckpt, directory = tiny
    backend = concat_backend(directory)
    limit = ckpt.config.n_position
    backend.encode(random_sources(13, 1, limit, seed=0))  # exactly the limit works
    with pytest.raises(InputTextError, match=r"source of 41 tokens .* longer than the model's positions \(40\)"):
        backend.encode(random_sources(13, 1, limit + 1, seed=0))
    state = backend.encode(random_sources(13, 1, 5, seed=0))
    state, _ = backend.run_step(state, np.full((1, limit), 5))
    with pytest.raises(InputTextError, match="decoding past 40 target positions"):
        backend.run_step(state, np.full((1, 1), 5))
    raw = ort.InferenceSession(str(directory / "encoder.onnx"))  # the bare graph cannot take it either
    with pytest.raises((ort_errors.Fail, ort_errors.InvalidArgument, ort_errors.RuntimeException)):
        raw.run(None, {"input_ids": np.full((1, limit + 1), 5), "attention_mask": np.ones((1, limit + 1), np.int64)})


def test_external_data_above_the_threshold(tiny, tmp_path):
    proto = onnx.load(str(tiny[1] / "decoder_step.onnx"))
    files = save_graph(proto, tmp_path / "decoder_step.onnx", external_above=0)
    assert [f.name for f in files] == ["decoder_step.onnx", "decoder_step.onnx.data"]
    stored = onnx.load(str(tmp_path / "decoder_step.onnx"), load_external_data=False).graph.initializer
    assert any(i.data_location == onnx.TensorProto.EXTERNAL for i in stored)
    ckpt = tiny[0]
    feeds = {"input_ids": np.array([[2, 5]]), "encoder_attention_mask": np.ones((1, 3), np.int64)}
    for i, t in enumerate(contract_specs(ckpt.config)[Graph.DECODER_STEP].inputs[2:]):
        feeds[t.name] = np.random.default_rng(i).standard_normal(
            (1, 2, 0 if "decoder" in t.name else 3, 8)).astype(np.float32)
    inline = ort.InferenceSession(str(tiny[1] / "decoder_step.onnx")).run(["logits"], feeds)[0]
    external = ort.InferenceSession(str(tmp_path / "decoder_step.onnx")).run(["logits"], feeds)[0]
    np.testing.assert_array_equal(inline, external)


def test_output_dir_rules(tiny, tmp_path):
    ckpt, _ = tiny
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(ModelDirError, match="out: directory is not empty; pass --force"):
        export_model_dir(ckpt, out, progress=False)
    assert listing(out) == ["keep.txt"]
    with pytest.raises(ModelDirError, match="out: is not a tfm-export directory .* even --force will not replace it"):
        export_model_dir(ckpt, out, force=True, progress=False)  # --force replaces artifacts, never the user's files
    assert listing(out) == ["keep.txt"]
    with pytest.raises(ModelDirError, match="parent directory of --output does not exist"):
        export_model_dir(ckpt, tmp_path / "no" / "such" / "dir", progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no staging directories left behind


def test_unwritable_output_is_refused_before_exporting(tiny, tmp_path):
    with unwritable_dir(tmp_path / "ro") as ro:
        result = CliRunner().invoke(export_main, ["onnx", "--checkpoint", str(tiny[0].path), "--output",
                                                  str(ro / "model")])
        assert result.exit_code == 1
        assert result.output.startswith("Error: ") and "choose a writable --output" in result.output
        assert len(result.output.strip().splitlines()) == 1
        assert listing(ro) == []


def test_verify_names_an_input_line_longer_than_the_model(tiny, tmp_path):
    ckpt, directory = tiny
    lines = tmp_path / "in.txt"
    lines.write_text("w1 w2\n" + " ".join(["w3"] * 45) + "\n")
    result = CliRunner().invoke(export_main, ["verify", "--model", str(directory), "--checkpoint", str(ckpt.path),
                                              "--input", str(lines)])
    assert result.exit_code == 1
    assert "--input line 2: 47 tokens with <s> and </s>, but the model takes at most 40" in result.output


def test_failed_export_leaves_nothing(tmp_path):
    with pytest.raises(RuntimeError, match="boom"), staged_directory(tmp_path / "model", force=False) as staging:
        (staging / "encoder.onnx").write_text("half")
        raise RuntimeError("boom")
    assert listing(tmp_path) == []


def test_force_replaces_an_export_of_ours(again):
    result, out = again
    assert result.exit_code == 0, result.output
    assert "manifest.json" in listing(out)
    assert sorted(p.name for p in out.parent.iterdir()) == ["m"]  # no staging directories left behind


def test_cli_export_inspect_verify(tiny, again):
    ckpt, _ = tiny
    runner = CliRunner()
    result, out = again
    assert result.exit_code == 0, result.output
    result = runner.invoke(export_main, ["onnx", "--checkpoint", str(ckpt.path), "--output", str(out)])
    assert result.exit_code == 1 and "directory is not empty; pass --force" in result.output
    inspect = runner.invoke(export_main, ["inspect", "--model", str(out)])
    assert inspect.exit_code == 0
    assert "past_key_values.1.decoder.value" in inspect.output and "LayerNormalization" in inspect.output
    ok = runner.invoke(export_main, ["verify", "--model", str(out), "--checkpoint", str(ckpt.path), "--samples", "4",
                                     "--steps", "5"])
    assert ok.exit_code == 0, ok.output
    assert "parity OK" in ok.output and "greedy, 4 random sources" in ok.output
    strict = runner.invoke(export_main, ["verify", "--model", str(out), "--checkpoint", str(ckpt.path), "--samples",
                                         "2", "--steps", "3", "--atol", "0", "--rtol", "0"])
    assert strict.exit_code == 1 and "parity check failed" in strict.output


def test_graph_changed_after_export_is_refused(tiny, tmp_path):
    import shutil
    copy, other = tmp_path / "copy", tmp_path / "other"
    shutil.copytree(tiny[1], copy)
    shutil.copytree(tiny[1], other)
    with open(copy / "encoder.onnx", "ab") as f:
        f.write(b"\0")
    with pytest.raises(ModelDirError, match="encoder.onnx: sha256 differs from manifest.json"):
        concat_backend(copy)
    (other / "decoder_step.onnx").unlink()
    with pytest.raises(ModelDirError, match="decoder_step.onnx: graph file of decoder_step is missing"):
        concat_backend(other)


def test_force_never_deletes_the_checkpoint_or_the_working_directory(tiny, tmp_path, monkeypatch):
    ckpt, _ = tiny
    with pytest.raises(ModelDirError, match="which replacing it would delete; choose another --output"):
        export_model_dir(ckpt, ckpt.path.parent, force=True, progress=False)
    assert ckpt.path.exists()
    monkeypatch.chdir(tmp_path)
    (tmp_path / "work.txt").write_text("keep")
    with pytest.raises(ModelDirError, match="which replacing it would delete"):
        export_model_dir(ckpt, tmp_path, force=True, progress=False)
    assert (tmp_path / "work.txt").exists()


def test_model_directory_is_readable_by_others(tiny):
    assert tiny[1].stat().st_mode & 0o755 == 0o755


def test_verify_counts_input_lines_with_blanks_and_refuses_all_blank(tiny, tmp_path):
    lines = tmp_path / "in.txt"
    lines.write_text("\n\nw1\n" + " ".join(["w3"] * 45) + "\n")
    verify = ["verify", "--model", str(tiny[1]), "--checkpoint", str(tiny[0].path), "--input", str(lines)]
    result = CliRunner().invoke(export_main, verify)
    assert result.exit_code == 1 and "--input line 4: 47 tokens" in result.output
    lines.write_text("\n  \n")
    result = CliRunner().invoke(export_main, verify)
    assert result.exit_code == 1 and "--input has no non-empty lines" in result.output


def test_graphs_carry_no_trace_of_the_build_machine(tiny):
    from support.common import REPO
    for graph in CONTRACT_GRAPHS:
        data = (tiny[1] / graph.filename).read_bytes()
        assert str(REPO).encode() not in data and b"stack_trace" not in data


@pytest.mark.parametrize("size", [1e-2, 1e-4])
def test_export_parity_refuses_graphs_that_differ_beyond_float32_noise(tiny, size):
    """The export's closing check, fed graphs of slightly different weights: an error in the logits is excused
    only within FLOAT32_NOISE_FACTOR x PyTorch's own float32 error, which a 1e-4 weight change already exceeds."""
    import copy
    import dataclasses

    from tfm_export.graphs.parity import FLOAT32_NOISE_FACTOR, float32_noise
    from tfm_export.graphs.pipeline import check_parity
    ckpt, directory = tiny
    assert check_parity(ckpt, directory) <= 1e-4
    changed = dataclasses.replace(ckpt, model=copy.deepcopy(ckpt.model))
    with torch.no_grad():
        weight = changed.model.trg_word_prj.weight  # a random change: a constant one vanishes on LayerNorm's output
        weight.add_(size * torch.randn(weight.shape, generator=torch.Generator().manual_seed(0)))
    src, trg = np.ones((1, 4), np.int64) * 5, np.ones((1, 4), np.int64) * 6
    assert FLOAT32_NOISE_FACTOR * float32_noise(changed.model, src, trg) < 1e-5
    with pytest.raises(TfmExportError, match="exported graphs differ from PyTorch"):
        check_parity(changed, directory)
