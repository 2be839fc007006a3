"""`tfm-export verify` says what users need: no demand for what the directory already holds, near-ties told
apart from real divergences, and the sentences a quantized model translates differently.

Oracles: the reference model's own logits (a near-tie is defined by them), a graph broken on purpose, and the
fp32 and int8 directories translated one by one through Translator.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from click.testing import CliRunner
from conftest import DEMO_CKPT, REPO, tiny_config
from onnx import numpy_helper
from seed_oracle import save_seed_checkpoint, seed_settings, seed_state_dict, seed_vocab

from tfm_export import DecodeOptions, Translator
from tfm_export.cli.export_cli import main as export_main
from tfm_export.core.config import ModelConfig
from tfm_export.core.files import file_sha256
from tfm_export.graphs.inputs import random_sources
from tfm_export.graphs.parity import Tolerance
from tfm_export.graphs.pipeline import export_model_dir
from tfm_export.model import reference_decoding
from tfm_export.model.loading import load_checkpoint
from tfm_export.model.synthetic import random_checkpoint
from tfm_export.verify.fp32 import near_tie


def test_seed_export_is_verified_with_the_directory_tokenizer(tmp_path):
    """A seed checkpoint carries no vocabulary, but the model directory exported from it does."""
    opt = seed_settings(n_layers=1)
    save_seed_checkpoint(tmp_path / "seed.chkpt", opt, seed_state_dict(opt))
    (tmp_path / "vocab.txt").write_text("\n".join(seed_vocab(opt.src_vocab_size)))
    export_model_dir(load_checkpoint(tmp_path / "seed.chkpt", [tmp_path / "vocab.txt"]), tmp_path / "model",
                     progress=False)
    args = ["verify", "--model", str(tmp_path / "model"), "--samples", "2", "--steps", "2", "--beam-size", "2"]
    result = CliRunner().invoke(export_main, [*args, "--checkpoint", str(tmp_path / "seed.chkpt")])
    assert result.exit_code == 0, result.output
    assert "parity OK" in result.output
    result = CliRunner().invoke(export_main, args)  # the manifest names the checkpoint, not where it was
    assert result.exit_code == 1
    assert f"was exported from seed.chkpt (sha256 {file_sha256(tmp_path / 'seed.chkpt')[:12]}...); pass it as " \
           "--checkpoint PATH" in result.output


@pytest.fixture(scope="module")
def tiny_reference(tmp_path_factory):
    """A random tiny model, a source, the reference's greedy decode of it, and its logits along that decode."""
    ckpt = load_checkpoint(random_checkpoint(tiny_config(src_vocab_size=40, trg_vocab_size=40),
                                             tmp_path_factory.mktemp("tie")))
    src = random_sources(40, 1, 8, seed=1, pad=ckpt.config.src_pad_idx)
    want = reference_decoding.greedy_decode(ckpt.model, torch.from_numpy(src), 12)[0].tokens
    with torch.no_grad():
        logits = ckpt.model(torch.from_numpy(src), torch.tensor([[ckpt.rules.start, *want]]))[0]
    return ckpt, src[0], want, logits


def test_a_divergence_is_a_near_tie_only_within_the_tolerance(tiny_reference):
    ckpt, src, want, logits = tiny_reference
    step = 1
    runner_up = int(logits[step].topk(2).indices[1])
    gap = float(logits[step, want[step]] - logits[step, runner_up])
    got = (*want[:step], runner_up, *want[step + 1:])
    assert gap > 0
    assert near_tie(ckpt, src, got, want, True, 12, Tolerance(atol=gap * 1.01, rtol=0))
    assert not near_tie(ckpt, src, got, want, True, 12, Tolerance(atol=gap * 0.99, rtol=0))
    worst = int(logits[step].argmin())  # a token the reference rates last: never a tie at any sane tolerance
    assert not near_tie(ckpt, src, (*want[:step], worst), want, True, 12, Tolerance())


def test_a_beam_output_is_a_near_tie_only_when_the_reference_scores_it_as_high(tiny_reference):
    """Beam outputs are ranked by mean log-probability: one that loses gap/length of it against the reference's
    is a near-tie only under a tolerance of at least that; one the reference scores higher always is."""
    ckpt, src, want, logits = tiny_reference
    assert len(want) == 12  # cut at the length limit: no </s> after the last token to score
    last = len(want) - 1
    runner_up = int(logits[last].topk(2).indices[1])
    got = (*want[:last], runner_up)
    loss = float(logits[last, want[last]] - logits[last, runner_up]) / len(want)
    assert near_tie(ckpt, src, got, want, False, 12, Tolerance(atol=loss * 1.01, rtol=0))
    assert not near_tie(ckpt, src, got, want, False, 12, Tolerance(atol=loss * 0.99, rtol=0))
    assert near_tie(ckpt, src, want, got, False, 12, Tolerance(atol=0, rtol=0))


def _perturbed(directory: Path, target: Path) -> Path:
    """The directory with the rows of the decoder step's largest weight in reverse order, and the manifest's hash
    updated: a graph that loads and passes every integrity check but computes something else."""
    shutil.copytree(directory, target)
    graph = target / "decoder_step.onnx"
    model = onnx.load(graph)
    weight = max(model.graph.initializer, key=lambda t: np.prod(t.dims))
    weight.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(weight)[::-1].copy(), weight.name))
    onnx.save(model, graph)
    manifest = json.loads((target / "manifest.json").read_text())
    manifest["graphs"]["decoder_step"]["sha256"] = file_sha256(graph)
    (target / "manifest.json").write_text(json.dumps(manifest))
    return target


def test_a_wrong_graph_still_fails_and_its_divergences_are_not_ties(demo_onnx, tmp_path):
    args = ["--checkpoint", str(DEMO_CKPT), "--samples", "4", "--steps", "3", "--beam-size", "2"]
    ok = CliRunner().invoke(export_main, ["verify", "--model", str(demo_onnx), *args])
    assert ok.exit_code == 0, ok.output
    wrong = CliRunner().invoke(export_main, ["verify", "--model", str(_perturbed(demo_onnx, tmp_path / "m")), *args])
    assert wrong.exit_code == 1 and "parity check failed" in wrong.output
    assert "greedy, 4 random sources: 0/4 identical, 4 diverging" in wrong.output, wrong.output


@pytest.mark.slow
def test_verify_passes_a_random_base_size_t5_like_model(tmp_path):
    """Random weights at the base size make logits of ~0.05 over 32,000 tokens, so a decode of 16 random sources
    can part where the reference itself tells two tokens apart by less than float32 rounding (with weights of seed
    1, one beam-4 decode does): verify reports it as a near-tie and passes."""
    from tfm_export.core.variants import PRESETS
    config = ModelConfig(src_vocab_size=32000, trg_vocab_size=32000, **PRESETS["t5"])
    ckpt = random_checkpoint(config, tmp_path / "ckpt", seed=1)
    export_model_dir(load_checkpoint(ckpt), tmp_path / "model", progress=False)
    result = CliRunner().invoke(export_main, ["verify", "--model", str(tmp_path / "model"), "--checkpoint",
                                              str(ckpt)])
    assert result.exit_code == 0, result.output
    assert "parity OK" in result.output
    assert "near-tie" in result.output, result.output  # the case this test is for happened


def test_int8_verify_names_the_sentences_that_differ(variants, tmp_path):
    """On the 1,000 held-out numbers, int8 and fp32 translate a few differently (each directory translated on its
    own through Translator, 64 sentences a batch as verify decodes them); verify names exactly those."""
    held_out = REPO / "models" / "demo" / "heldout.en.txt"
    lines = held_out.read_text().splitlines()
    options = DecodeOptions(beam_size=1, batch_size=64)
    ours, theirs = ([t.text for t in Translator.load(variants[name]).translate(lines, options)]
                    for name in ("int8-static", "fp32"))
    differing = [(s, o, t) for s, o, t in zip(lines, ours, theirs, strict=True) if o != t]
    assert 0 < len(differing) <= 5, "choose an input where int8 differs from fp32 on 1..5 lines"
    result = CliRunner().invoke(export_main, ["verify", "--model", str(variants["int8-static"]), "--input",
                                              str(held_out), "--beam-size", "1"])
    assert result.exit_code == 0, result.output
    assert f"greedy: differs from fp32 on {len(differing)} sentence(s):" in result.output
    named = [line for line in result.output.splitlines() if line.startswith("  '")]
    assert named == [f"  {source!r} -> {mine!r} (fp32 {reference!r})" for source, mine, reference in differing]
