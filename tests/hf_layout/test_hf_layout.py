"""`tfm-export hf`: the layout's graphs held to PyTorch on the first step and with the past fed back, its JSON files,
and the one-line refusals that write nothing."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import onnx
import pytest
from click.testing import CliRunner
from support.common import DEMO_CKPT

from tfm_export.artifacts.model_dir import ModelDir
from tfm_export.cli.export_cli import main as export_main
from tfm_export.core.files import file_sha256
from tfm_export.graphs.hf_graphs import ENCODER_HIDDEN_STATES
from tfm_export.hf_layout import export_hf
from tfm_export.hf_layout.parity import HfParityError, check_view, from_directory, sample
from tfm_export.hf_layout.tokenizer_view import TokenizerViewError, js_tokenizer
from tfm_export.hf_layout.view import HfViewError, check_expressible


@pytest.fixture(scope="module")
def view(demo_onnx, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("hf") / "view"
    made = export_hf(demo_onnx, out, checkpoint=DEMO_CKPT)
    assert made.parity[0] == "against PyTorch:" and len(made.parity) == 7
    return out


def test_the_layout_has_the_files_both_libraries_read(view):
    names = {str(p.relative_to(view)) for p in view.rglob("*") if p.is_file()}
    assert names == {"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                     "manifest.json", "onnx/encoder_model.onnx", "onnx/decoder_model_merged.onnx",
                     "onnx/decoder_model.onnx", "onnx/decoder_with_past_model.onnx", "onnx/generation_config.json"}
    assert (view / "onnx" / "generation_config.json").read_text() == (view / "generation_config.json").read_text()
    config = json.loads((view / "config.json").read_text())
    assert (config["model_type"], config["d_model"], config["decoder_layers"]) == ("marian", 128, 3)
    generation = json.loads((view / "generation_config.json").read_text())
    assert (generation["decoder_start_token_id"], generation["eos_token_id"], generation["bad_words_ids"]) == \
        (2, 3, [[1]])


def test_the_merged_decoder_takes_hidden_states_and_an_empty_past(view):
    graph = onnx.load(str(view / "onnx" / "decoder_model_merged.onnx"), load_external_data=False).graph
    inputs = [i.name for i in graph.input if i.name not in {t.name for t in graph.initializer}]
    assert inputs[:3] == ["input_ids", "encoder_attention_mask", ENCODER_HIDDEN_STATES]
    assert "present.0.encoder.key" in [o.name for o in graph.output]
    assert not {n.op_type for n in graph.node} & {"If", "Loop"}


def test_a_wrong_merged_decoder_fails_its_check(view, demo_onnx, tmp_path):
    """The check can fail: a merged decoder that gives layer 0 layer 1's cross keys is caught at step 1."""
    broken = tmp_path / "view"
    shutil.copytree(view, broken)
    path = broken / "onnx" / "decoder_model_merged.onnx"
    model = onnx.load(str(path))
    concat = {n.output[0]: n for n in model.graph.node if n.op_type == "Concat" and n.output[0].startswith("present")}
    concat["present.0.encoder.key"].input[1] = concat["present.1.encoder.key"].input[1]
    onnx.save(model, str(path))
    model_dir = ModelDir.read(demo_onnx)
    src, trg = sample(model_dir.config)
    with pytest.raises(HfParityError, match="decoder_model_merged step 1"):
        check_view(broken, model_dir.config, "fp32", from_directory(model_dir, src, trg), src, trg)


def test_refusals_name_the_reason(demo_onnx, tmp_path):
    split = tmp_path / "split"
    shutil.copytree(demo_onnx, split)
    data = json.loads((split / "tokenizer.json").read_text())
    vocab = data["model"]["vocab"]
    first, second = sorted(vocab)[:2]
    vocab[first], vocab[second] = vocab[second], vocab[first]  # the target's ids name other words
    (split / "target.json").write_text(json.dumps(data))
    manifest = json.loads((split / "manifest.json").read_text())
    manifest["tokenizer"]["target"] = "target.json"
    manifest["files"]["target.json"] = file_sha256(split / "target.json")
    (split / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(HfViewError, match="separate source and target vocabularies"):
        check_expressible(ModelDir.read(split))
    model_dir = ModelDir.read(demo_onnx)
    narrow = dataclasses.replace(model_dir, config=dataclasses.replace(model_dir.config, d_k=16, d_v=16))
    with pytest.raises(HfViewError, match="d_model / heads = 32"):
        check_expressible(narrow)
    for rule, codes, reason in (("decoder_start", ("fr_XX",), "decoder's first input"),
                                ("forced_bos", ("french", "german"), "follow none of the patterns")):
        languages = dataclasses.replace(model_dir, rules=dataclasses.replace(
            model_dir.rules, languages=codes, language_rule=rule))
        with pytest.raises(HfViewError, match=reason):
            check_expressible(languages)
    data = json.loads((demo_onnx / "tokenizer.json").read_text())
    with pytest.raises(TokenizerViewError, match="pre_tokenizer step UnicodeScripts"):
        js_tokenizer({**data, "pre_tokenizer": {"type": "UnicodeScripts"}}, "tok.json")


def test_the_rewritten_tokenizer_splits_as_metaspace_did(demo_onnx):
    from tokenizers import Tokenizer
    data = json.loads((demo_onnx / "tokenizer.json").read_text())
    rewritten = js_tokenizer(data, "tok.json")
    assert rewritten["pre_tokenizer"]["pretokenizers"][0]["pretokenizers"][0]["split"] is False
    a, b = Tokenizer.from_str(json.dumps(data)), Tokenizer.from_str(json.dumps(rewritten))
    for text in ["forty-two", "one thousand,  two hundred", " Eighty-One "]:
        assert a.encode(text).ids == b.encode(text).ids


def test_cli_refusal_writes_nothing(demo_onnx, tmp_path):
    result = CliRunner().invoke(export_main, ["hf", "--model", str(demo_onnx), "--output", str(tmp_path / "v"),
                                              "--checkpoint", str(tmp_path / "missing.pt")])
    assert result.exit_code != 0 and "Traceback" not in result.output
    assert not (tmp_path / "v").exists()
    other = tmp_path / "other"
    shutil.copytree(demo_onnx, other)
    manifest = json.loads((other / "manifest.json").read_text())
    manifest["source_checkpoint"]["format"] = "huggingface"
    (other / "manifest.json").write_text(json.dumps(manifest))
    result = CliRunner().invoke(export_main, ["hf", "--model", str(other), "--output", str(tmp_path / "v")])
    assert result.exit_code != 0 and "does not name its Hugging Face family" in result.output
    assert not (tmp_path / "v").exists()


def test_past_the_threshold_weights_go_to_onnx_data_files_once(demo_onnx, tmp_path):
    """The external layout at the demo's size: the encoder's and the merged decoder's weights in their own
    `.onnx_data`, Optimum's pair reading the merged decoder's; held to PyTorch like the inline one."""
    made = export_hf(demo_onnx, tmp_path / "v", checkpoint=DEMO_CKPT, external_above=0)
    assert made.parity[0] == "against PyTorch:"
    onnx_dir = tmp_path / "v" / "onnx"
    assert sorted(p.name for p in onnx_dir.glob("*.onnx_data")) == ["decoder_model_merged.onnx_data",
                                                                    "encoder_model.onnx_data"]
    for name in ("decoder_model.onnx", "decoder_with_past_model.onnx"):
        graph = onnx.load(str(onnx_dir / name), load_external_data=False).graph
        locations = {e.value for t in graph.initializer for e in t.external_data if e.key == "location"}
        assert locations == {"decoder_model_merged.onnx_data"}
    config = json.loads((tmp_path / "v" / "config.json").read_text())
    assert config["transformers.js_config"]["use_external_data_format"] == {
        "encoder_model.onnx": 1, "decoder_model_merged.onnx": 1}


def test_a_directory_with_external_weights_is_copied_from_its_weights_file(demo_external, tmp_path):
    """The external layout's source (every graph's weights in weights.onnx.data): streamed chunk by chunk into the
    layout's files, and held to its own graphs."""
    made = export_hf(demo_external, tmp_path / "v", external_above=0)
    assert "own graphs" in made.parity[0]
    assert sorted(p.name for p in (tmp_path / "v" / "onnx").glob("*.onnx_data")) == [
        "decoder_model_merged.onnx_data", "encoder_model.onnx_data"]


def test_quantized_views_are_held_to_their_own_graphs(variants, tmp_path):
    made = export_hf(variants["int8-static"], tmp_path / "int8")
    assert made.parity[0].startswith("against") and "own graphs" in made.parity[0]
    assert (tmp_path / "int8" / "onnx" / "decoder_model_merged_quantized.onnx").is_file()
    with pytest.raises(Exception, match="for fp32 directories"):
        export_hf(variants["fp16"], tmp_path / "fp16", checkpoint=DEMO_CKPT)
