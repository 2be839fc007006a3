"""generate.onnx: ONNX Runtime's BeamSearch op over our graphs, held to the reference decoders, and its command,
backend (runtime/backends/generate.py: its tests live here, beside the export, on the same fixture), directory,
refusals and tokenizer."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from support.backends import concat_backend, generate_searcher
from support.common import DEMO_CKPT, REPO, listing, modules_after, tiny_config
from tokenizers import Tokenizer

from tfm_export import DecodeOptions, Translator
from tfm_export.cli.export_cli import main as export_main
from tfm_export.cli.run_cli import main as run_main
from tfm_export.core.batching import pad_batch
from tfm_export.core.files import file_sha256
from tfm_export.core.sources import source_ids
from tfm_export.core.token_rules import SEED_RULES
from tfm_export.core.tokenizer import load_tokenizer
from tfm_export.core.variants import PRESETS
from tfm_export.demo import numbers as demo_numbers
from tfm_export.graphs.generate_dir import write_generate_dir
from tfm_export.graphs.inputs import random_sources
from tfm_export.graphs.pipeline import export_model_dir
from tfm_export.model import reference_decoding
from tfm_export.model.loading import load_checkpoint
from tfm_export.model.synthetic import random_checkpoint
from tfm_export.runtime import decoding
from tfm_export.runtime.counts import WorkCounts
from tfm_export.runtime.search import SearchOptions

HELD_OUT = [en for en, _ in demo_numbers.held_out_pairs()]


@pytest.fixture(scope="module")
def demo_ckpt():
    return load_checkpoint(DEMO_CKPT)


def demo_sources(ckpt, texts):
    return pad_batch([source_ids(ckpt.vocab.source, t) for t in texts])


def test_greedy_is_token_identical_to_the_reference_decoder(demo_generate, demo_ckpt):
    src = demo_sources(demo_ckpt, HELD_OUT[:200])
    got = generate_searcher(demo_generate).search(src, SearchOptions(40), SEED_RULES)
    want = reference_decoding.greedy_decode(demo_ckpt.model, torch.from_numpy(src), 40)
    assert [h[0].tokens for h in got] == [h.tokens for h in want]
    assert [h[0].score for h in got] == pytest.approx([h.score for h in want], abs=1e-3)
    assert all(h[0].finished for h in got)


@pytest.mark.parametrize("length_penalty", [1.0, 0.6])
def test_beam_search_agrees_with_the_reference_decoder(demo_generate, demo_ckpt, length_penalty):
    """The op stops by its own rule (it keeps searching while a running beam could still win), so agreement is
    measured, not assumed; the hypotheses both find get the same normalized score."""
    src = demo_sources(demo_ckpt, HELD_OUT[200:300])
    got = generate_searcher(demo_generate).search(src, SearchOptions(40, 4, length_penalty), SEED_RULES)
    want = reference_decoding.beam_search(demo_ckpt.model, torch.from_numpy(src), 4, 40, length_penalty)
    same = [g[0].tokens == w[0].tokens for g, w in zip(got, want, strict=True)]
    assert sum(same) >= 99
    both = [(g[0].normalized_score, w[0].normalized_score) for g, w, s in zip(got, want, same, strict=True) if s]
    assert [g for g, _ in both] == pytest.approx([w for _, w in both], abs=1e-3)


TINY_VARIANTS = {  # the demo model has a shared vocabulary and a tied projection
    "untied embeddings and projection, d_k != d_v": dict(src_vocab_size=17, trg_vocab_size=17, d_k=8, d_v=4,
                                                         embs_share_weight=False, proj_share_weight=False),
    # Transformer variants: RoPE angles and relative-bias buckets come from the past length inside the subgraph
    "modern (pre-norm, RMSNorm, SwiGLU, RoPE)": PRESETS["modern"],  # make test-slow
    "T5-like (pre-norm, RMSNorm, GeGLU, relative bias)": dict(PRESETS["t5"], relative_buckets=8,
                                                              relative_max_distance=20),
}


@pytest.mark.parametrize("variant", [pytest.param(v, marks=pytest.mark.slow if v.startswith("modern") else ())
                                     for v in TINY_VARIANTS])
def test_tiny_models_decode_as_the_reference_and_the_loop(tmp_path, variant):
    """Greedy against the reference decoder (padded batch, cut at max_length); beam search with </s> barred to the
    end (no stopping rule decides) against the decoding loop, n-best lists included."""
    cfg = tiny_config(**TINY_VARIANTS[variant])
    ckpt = load_checkpoint(random_checkpoint(cfg, tmp_path / "ckpt"))
    export_model_dir(ckpt, tmp_path / "model", progress=False)
    write_generate_dir(tmp_path / "model", tmp_path / "generate", progress=False)
    backend = generate_searcher(tmp_path / "generate")
    src = random_sources(cfg.src_vocab_size, 6, 12, seed=1)
    got = backend.search(src, SearchOptions(9), SEED_RULES)
    want = reference_decoding.greedy_decode(ckpt.model, torch.from_numpy(src), 9)
    assert [(h[0].tokens, h[0].finished) for h in got] == [(h.tokens, h.finished) for h in want]
    assert [h[0].score for h in got] == pytest.approx([h.score for h in want], abs=1e-4)
    loop = concat_backend(tmp_path / "generate")
    got_b = backend.search(src, SearchOptions(8, 3, n_best=3, min_length=8), SEED_RULES)
    want_b = decoding.beam_search(loop, src, 3, 8, n_best=3, min_length=8)
    assert [[h.tokens for h in g] for g in got_b] == [[h.tokens for h in w] for w in want_b]
    assert [h.score for g in got_b for h in g] == pytest.approx([h.score for w in want_b for h in w], abs=1e-4)


def test_the_command_writes_a_complete_directory(demo_onnx, tmp_path):
    out = tmp_path / "generate"
    result = CliRunner().invoke(export_main, ["generate", "--model", str(demo_onnx), "--output", str(out)])
    assert result.exit_code == 0, result.output
    assert "generate.onnx" in result.output and "early_stopping 0" in result.output
    assert listing(out) == sorted([*listing(demo_onnx), "generate.onnx"])  # every graph the directory lists
    manifest, source = (json.loads((d / "manifest.json").read_text()) for d in (out, demo_onnx))
    entry = manifest.pop("generate")
    assert manifest == source  # the model directory's own entries, graph hashes included, hold unchanged
    assert entry["sha256"] == file_sha256(out / "generate.onnx") and entry["max_length"] == 201
    assert [t["name"] for t in entry["inputs"]] == ["input_ids", "max_length", "min_length", "num_beams",
                                                   "num_return_sequences", "length_penalty"]
    lines = HELD_OUT[:40] + ["", "forty-two"]
    outputs = [CliRunner().invoke(run_main, ["translate", "--model", str(out), *args], input="\n".join(lines) + "\n")
               for args in (["--backend", "onnxruntime-generate"], [])]
    assert outputs[0].exit_code == 0 and outputs[0].output == outputs[1].output
    assert outputs[0].output.split("\n")[-3:] == ["", "quarante-deux", ""]


def test_written_tokenizer_wraps_sources_in_bos_and_eos(demo_generate):
    """Other languages' tokenizer libraries get the model's source ids from encode(text) alone; ours asks for no
    special tokens and wraps them itself, as before."""
    ours = load_tokenizer(demo_generate / "tokenizer.json")
    shipped = load_tokenizer(DEMO_CKPT.parent / "tokenizer.json")
    library = Tokenizer.from_file(str(demo_generate / "tokenizer.json"))
    texts = HELD_OUT[:300] + ["  Forty-Two ", "one thousand, one", "ÉCOLE été", "unknown words"]
    assert [library.encode(t).ids for t in texts] == [[2, *shipped.encode(t), 3] for t in texts]  # <s> ... </s>
    assert [ours.encode(t) for t in texts] == [shipped.encode(t) for t in texts]


def test_fp16_and_int8_directories_generate_as_their_loop(variants, tmp_path):
    """fp16 with fp32 inputs/outputs and both int8 modes: the command's own closing check compares the graph with
    the decoding loop over the same directory; translations of real inputs agree too (one input per call on both
    sides: int8 dynamic graphs quantize activations with each call's own range)."""
    for name in ("fp16-io", "int8-dynamic", "int8-static"):
        write_generate_dir(variants[name], tmp_path / name, progress=False)
        texts = HELD_OUT[:30]
        generate, loop = (Translator.load(tmp_path / name, backend=b) for b in ("onnxruntime-generate", "onnxruntime"))
        got, want = generate.translate(texts), loop.translate(texts, DecodeOptions(batch_size=1))  # one per call
        assert [r.ids for r in got] == [r.ids for r in want], name


def test_a_directory_the_op_cannot_take_is_refused_saying_why(variants, tmp_path):
    before = listing(tmp_path)
    result = CliRunner().invoke(export_main, ["generate", "--model", str(variants["fp16"]),
                                              "--output", str(tmp_path / "out")])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1
    assert "float16 KV cache but returns float32 logits" in result.output and "--keep-io-types" in result.output
    assert listing(tmp_path) == before


def test_bad_directories_are_one_line_errors(demo_onnx, tmp_path):
    (tmp_path / "engines").mkdir()
    (tmp_path / "engines" / "manifest.json").write_text('{"format": "tfm-export-engines", "format_version": 1}')
    cases = {str(tmp_path / "missing"): "model directory not found",
             str(tmp_path / "engines"): "holds TensorRT engines, not ONNX graphs"}
    for model, message in cases.items():
        result = CliRunner().invoke(export_main, ["generate", "--model", model, "--output", str(tmp_path / "o")])
        assert result.exit_code == 1 and message in result.output and not (tmp_path / "o").exists()
    result = CliRunner().invoke(run_main, ["translate", "--model", str(demo_onnx), "--backend",
                                           "onnxruntime-generate", "x"])
    assert result.exit_code == 1 and "has no generate.onnx; make one with `tfm-export generate" in result.output


@pytest.mark.parametrize("name", ["generate.onnx", "decoder_step.onnx", "decoder_step_search.onnx.data",
                                  "tokenizer.json"])
def test_a_damaged_file_of_a_generate_directory_is_refused(demo_generate, tmp_path, name):
    """generate.onnx holds its own copy of the graphs, yet the directory is refused whole, as the loop's backends
    refuse it: a damaged graph it does not run, or the tokenizer, is one line too."""
    model = tmp_path / "model"
    shutil.copytree(demo_generate, model)
    data = bytearray((model / name).read_bytes())
    data[-1] ^= 1
    (model / name).write_bytes(bytes(data))
    result = CliRunner().invoke(run_main, ["translate", "--model", str(model), "--backend", "onnxruntime-generate",
                                           "forty-two"])
    assert result.exit_code == 1 and result.output.strip().splitlines() == [
        f"Error: {model / name}: sha256 differs from manifest.json (file changed or damaged); export the model again "
        "with `tfm-export onnx`"]


def test_max_length_and_n_best_follow_the_loop(demo_generate):
    texts = HELD_OUT[:12]
    generate, loop = (Translator.load(demo_generate, backend=b) for b in ("onnxruntime-generate", "onnxruntime"))
    short = DecodeOptions(max_length=3)
    assert [r.ids for r in generate.translate(texts, short)] == [r.ids for r in loop.translate(texts, short)]
    best = generate.translate(texts, DecodeOptions(beam_size=4, n_best=3))
    assert all(len(r.n_best) == 3 and (r.n_best[0].text, r.n_best[0].log_prob) == (r.text, r.score) for r in best)
    assert all(len({a.text for a in r.n_best}) == 3 for r in best)  # three different hypotheses


def test_inputs_go_one_per_call_unless_made_with_early_stopping(demo_onnx, tmp_path):
    """With early_stopping 0, ONNX Runtime checks a batched input's stopping rule on another input's scores, so
    the backend sends one input per call; a graph made with --early-stopping decodes a batch in one call."""
    src = random_sources(88, 5, 10, seed=2)
    per_input = generate_searcher(_generate_dir(demo_onnx, tmp_path / "default"))
    per_input.counts = WorkCounts()
    per_input.search(src, SearchOptions(20), SEED_RULES)
    assert per_input.counts.runs == 5
    result = CliRunner().invoke(export_main, ["generate", "--model", str(demo_onnx), "--output",
                                              str(tmp_path / "early"), "--early-stopping"])
    assert result.exit_code == 0, result.output
    batched = generate_searcher(tmp_path / "early")
    batched.counts = WorkCounts()
    got = batched.search(src, SearchOptions(20), SEED_RULES)
    assert batched.counts.runs == 1
    assert [h[0].tokens for h in got] == [h.tokens for h in decoding.greedy(concat_backend(demo_onnx), src, 20)]


def _generate_dir(model, out):
    write_generate_dir(model, out, progress=False)
    return out


def test_generate_and_its_backend_load_what_they_need_only(demo_generate, tmp_path):
    code = (f"from tfm_export.cli.export_cli import main\n"
            f"main(['generate', '--model', {str(demo_generate)!r}, '--output', {str(tmp_path / 'o')!r}], "
            "standalone_mode=False)")
    assert "torch" not in modules_after(code)
    code = (f"from tfm_export.cli.run_cli import main\n"
            f"main(['translate', '--model', {str(demo_generate)!r}, '--backend', 'onnxruntime-generate', "
            "'forty-two'], standalone_mode=False)")
    assert not modules_after(code) & {"torch", "onnx"}


def test_scores_are_summed_log_probabilities(demo_generate):
    texts = HELD_OUT[:20]
    generate, loop = (Translator.load(demo_generate, backend=b) for b in ("onnxruntime-generate", "onnxruntime"))
    for options in (DecodeOptions(), DecodeOptions(beam_size=4, length_penalty=0.6)):
        got, want = generate.translate(texts, options), loop.translate(texts, options)
        pairs = [(g.score, w.score) for g, w in zip(got, want, strict=True) if g.ids == w.ids]
        assert len(pairs) >= 19
        assert [g for g, _ in pairs] == pytest.approx([w for _, w in pairs], abs=1e-3)
        assert np.all(np.array([g for g, _ in pairs]) < 0)


def test_the_contract_documents_generate_onnx_and_its_python_example_runs(demo_generate):
    """docs/graph-contract.md names every input, output and subgraph tensor of generate.onnx, and its Python
    example translates as written."""
    from tfm_export.core.config import ModelConfig
    from tfm_export.core.generate_spec import INPUTS, OUTPUTS, decoder_inputs, decoder_outputs, encoder_outputs
    doc = (REPO / "docs" / "graph-contract.md").read_text()
    cfg = ModelConfig(src_vocab_size=10, trg_vocab_size=10, n_layers=1)
    for name in [t.name for t in (*INPUTS, *OUTPUTS)] + decoder_inputs(cfg) + decoder_outputs(cfg) + \
            encoder_outputs(cfg):
        assert f"`{name.replace('_0', '_{i}')}" in doc, name
    section = doc[doc.index("Python (`onnxruntime`, `tokenizers`):"):]
    code = section[section.index("```python") + len("```python"):section.index("```", section.index("```python") + 3)]
    result = subprocess.run([sys.executable, "-c", code.replace('"build/demo-generate"', repr(str(demo_generate)))],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "soixante et onze mille quatre-vingts\n"


def test_an_onnx_runtime_older_than_the_subgraph_format_is_one_line(demo_generate, monkeypatch):
    """ONNX Runtime 1.21.1 refuses the graph with an error about subgraph inputs; the backend says what to do."""
    import onnxruntime
    monkeypatch.setattr(onnxruntime, "__version__", "1.21.1")
    result = CliRunner().invoke(run_main, ["translate", "--model", str(demo_generate), "--backend",
                                           "onnxruntime-generate", "forty-two"])
    assert result.exit_code == 1 and len(result.output.strip().splitlines()) == 1
    assert "needs ONNX Runtime 1.22 or later (this is 1.21.1" in result.output


def test_quantizing_a_generate_directory_leaves_generate_onnx_behind(demo_generate, tmp_path):
    """The quantized directory has new graphs, so the parent's generate.onnx (and its manifest entry) stay behind."""
    result = CliRunner().invoke(export_main, ["quantize", "--model", str(demo_generate), "--precision", "int8",
                                              "--mode", "dynamic", "--output", str(tmp_path / "int8")])
    assert result.exit_code == 0, result.output
    assert "generate" not in json.loads((tmp_path / "int8" / "manifest.json").read_text())
    assert not (tmp_path / "int8" / "generate.onnx").exists()
