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
from onnx import numpy_helper
from support.common import DEMO_CKPT, REPO, tiny_config
from support.seed_oracle import save_seed_checkpoint, seed_settings, seed_state_dict, seed_vocab

from tfm_export import DecodeOptions, Translator
from tfm_export.cli.export_cli import main as export_main
from tfm_export.core.config import ModelConfig
from tfm_export.core.files import file_sha256
from tfm_export.core.token_rules import SEED_RULES
from tfm_export.core.variants import PRESETS
from tfm_export.graphs.inputs import random_sources
from tfm_export.graphs.parity import Tolerance
from tfm_export.graphs.pipeline import export_model_dir
from tfm_export.model import reference_decoding
from tfm_export.model.checkpoint import save_checkpoint
from tfm_export.model.loading import load_checkpoint
from tfm_export.model.synthetic import random_checkpoint, random_vocabulary
from tfm_export.model.transformer import Transformer
from tfm_export.verify.fp32 import judged, near_tie
from tfm_export.verify.precision import SHOW_DIFFERING


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


def test_greedy_and_beam_decodes_are_each_judged_by_their_own_rule(tiny_reference):
    """One decode that parts from the reference at its last token, where the reference rates the two tokens
    `gap` apart, and so loses gap/12 of mean log-probability: under a tolerance between the two it is a near-tie
    as a beam output and a divergence as a greedy one."""
    ckpt, src, want, logits = tiny_reference
    last = len(want) - 1
    runner_up = int(logits[last].topk(2).indices[1])
    got = (*want[:last], runner_up)
    gap = float(logits[last, want[last]] - logits[last, runner_up])
    tolerance = Tolerance(atol=gap / len(want) * 1.5, rtol=0)
    for greedy, beam in (([got], [want]), ([want], [got])):
        g, b = judged("", ckpt, src[None], (greedy, [want]), (beam, [want]), 4, 12, tolerance)
        assert (g.identical, g.ties, b.identical, b.ties) == ((0, 0, 1, 0) if greedy == [got] else (1, 0, 0, 1))


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


def _near_twins(config: ModelConfig, root: Path, gap: float) -> tuple[Path, Path]:
    """Two checkpoints of one random model that differ only where a near-tie needs them to: (reference, graphs).

    Token B is made a twin of A, the first token the reference decodes for verify's first random source (the same
    embedding, and the output row scaled by 1 - eps, so that B's logit trails A's by `gap` at that step). The
    graphs' checkpoint has the two output rows swapped, so its graphs rank B just ahead of A wherever the reference
    ranks A just ahead of B: what a graph within the tolerance may do on a machine whose rounding tips the other
    way, here by construction and by far more than any CPU's rounding (float32 noise in these logits is ~1e-6)."""
    torch.manual_seed(1)
    model = Transformer(config).eval()
    src = random_sources(config.src_vocab_size, 1, min(config.n_position, 24), 7, config.src_pad_idx)  # any count
    with torch.no_grad():
        logits = model(torch.from_numpy(src), torch.tensor([[SEED_RULES.start]]))[0, 0]
        a, b = (int(i) for i in logits.topk(2).indices)
        assert logits[a] > 0, "the top logit of 32,000 random ones is positive"
        eps = gap / float(logits[a])
        emb, prj = model.decoder.trg_word_emb.weight, model.trg_word_prj.weight
        emb[b] = emb[a]
        rows = prj[a].clone(), prj[a] * (1 - eps)
        paths = []
        for name, (row_a, row_b) in (("reference", rows), ("graphs", rows[::-1])):
            prj[a], prj[b] = row_a, row_b
            (root / name).mkdir()
            paths.append(save_checkpoint(model, random_vocabulary(config), root / name / "ckpt.pt"))
    return paths[0], paths[1]


@pytest.mark.slow
def test_verify_reports_a_constructed_near_tie_at_base_size(tmp_path):
    """A random base-size T5 v1.1-like model (untied head): logits of ~0.7 over 32,000 tokens. Graphs that rank
    two tokens the other way round than the reference, by 2e-5 (within the 1e-4 tolerance, 20 times float32's
    noise), part from it in the decodes that reach those tokens; verify calls each such decode a near-tie and
    passes. On any machine: the near-tie is made, not hoped for."""
    config = ModelConfig(src_vocab_size=32000, trg_vocab_size=32000, proj_share_weight=False, **PRESETS["t5"])
    reference, graphs = _near_twins(config, tmp_path, gap=2e-5)
    export_model_dir(load_checkpoint(graphs), tmp_path / "model", progress=False)
    manifest = json.loads((tmp_path / "model" / "manifest.json").read_text())
    manifest["source_checkpoint"]["sha256"] = file_sha256(reference)  # verified against the reference
    (tmp_path / "model" / "manifest.json").write_text(json.dumps(manifest))
    result = CliRunner().invoke(export_main, ["verify", "--model", str(tmp_path / "model"), "--checkpoint",
                                              str(reference), "--samples", "4", "--steps", "8"])
    assert result.exit_code == 0, result.output
    assert "parity OK" in result.output
    greedy = next(line for line in result.output.splitlines() if "greedy, 4 random sources" in line)
    assert "near-tie" in greedy, result.output  # at least source 0's decode parts at the twins


def test_int8_verify_names_the_sentences_that_differ(variants, tmp_path):
    """On the 1,000 held-out numbers, int8 and fp32 may translate a few differently (one here; each directory
    translated on its own through Translator, 64 sentences a batch as verify decodes them); verify names exactly
    those, however many (the first SHOW_DIFFERING, then how many more), and says nothing when there are none."""
    held_out = REPO / "models" / "demo" / "heldout.en.txt"
    lines = held_out.read_text().splitlines()
    options = DecodeOptions(beam_size=1, batch_size=64)
    ours, theirs = ([t.text for t in Translator.load(variants[name]).translate(lines, options)]
                    for name in ("int8-static", "fp32"))
    differing = [(s, o, t) for s, o, t in zip(lines, ours, theirs, strict=True) if o != t]
    result = CliRunner().invoke(export_main, ["verify", "--model", str(variants["int8-static"]), "--input",
                                              str(held_out), "--beam-size", "1"])
    assert result.exit_code == 0, result.output
    named = [line for line in result.output.splitlines() if line.startswith("  '")]
    assert named == [f"  {source!r} -> {mine!r} (fp32 {reference!r})"
                     for source, mine, reference in differing[:SHOW_DIFFERING]]
    more = len(differing) - SHOW_DIFFERING
    assert (f"greedy: differs from fp32 on {len(differing)} sentence(s):" in result.output) == bool(differing)
    assert (f"  ... and {more} more" in result.output) == (more > 0)
