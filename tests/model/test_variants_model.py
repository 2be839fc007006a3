"""The variant family in PyTorch: every option and combination against an independent NumPy oracle and
against CTranslate2's own implementation; names, config validation and one-line errors."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from support.common import listing, tiny_config
from support.variant_cases import CASES, case_config, save_varied_checkpoint, varied_model
from support.variant_oracle import VariantOracle, t5_bucket

from tfm_export.cli.export_cli import main as export_main
from tfm_export.core.config import ModelConfig
from tfm_export.core.errors import CheckpointError, TfmExportError
from tfm_export.core.variants import ACTIVATIONS, CLASSIC, PRESETS
from tfm_export.model.cache import ConcatCache
from tfm_export.model.loading import load_checkpoint
from tfm_export.model.positions import relative_buckets
from tfm_export.model.synthetic import random_checkpoint
from tfm_export.model.transformer import Transformer

SRC = np.array([[2, 5, 6, 7, 8, 9, 10, 3], [2, 8, 4, 3, 1, 1, 1, 1]])
TRG = np.array([[2, 4, 9, 5, 11, 12, 6, 7, 8, 10], [2, 6, 12, 1, 1, 1, 1, 1, 1, 1]])


@pytest.mark.parametrize("case", CASES)
def test_every_option_and_combination_matches_the_numpy_oracle(case):
    model = varied_model(case_config(case))
    with torch.no_grad():
        got = model(torch.from_numpy(SRC), torch.from_numpy(TRG)).double().numpy()
    oracle = VariantOracle(model.state_dict(), dataclasses.asdict(model.config))
    np.testing.assert_allclose(got, oracle.forward(SRC, TRG), atol=1e-4, rtol=1e-4)


def test_the_oracle_tells_options_apart():
    """The comparison above can fail: the same weights read with one option changed give other logits."""
    model = varied_model(case_config("deepnorm"))
    cfg = dataclasses.asdict(model.config)
    want = VariantOracle(model.state_dict(), cfg).forward(SRC, TRG)
    for change in (dict(deepnorm_alpha=1.0), dict(norm="rmsnorm"), dict(activation="swish")):
        other = VariantOracle(model.state_dict(), {**cfg, **change}).forward(SRC, TRG)
        assert np.abs(other - want).max() > 1e-2, change


@pytest.mark.parametrize("case", CASES)
def test_cached_steps_equal_the_full_forward(case):
    model = varied_model(case_config(case))
    src, trg = torch.from_numpy(SRC), torch.from_numpy(TRG)
    cfg = model.config
    with torch.no_grad():
        full = model(src, trg)
        enc, src_mask = model.encode(src)
        cross = model.decoder.cross_keys_values(enc)
        past = [(enc.new_zeros(2, cfg.n_head, 0, cfg.d_k), enc.new_zeros(2, cfg.n_head, 0, cfg.d_v))] * cfg.n_layers
        steps = []
        for t in range(trg.size(1)):
            x, past = model.decoder.step(trg[:, t:t + 1], ConcatCache(past), cross, src_mask)
            steps.append(model.project(x))
    real = torch.from_numpy(TRG != 1)[..., None]  # padded target positions differ by design (the pad mask)
    assert torch.allclose(torch.cat(steps, 1) * real, full * real, atol=1e-4)


def test_seed_names_stay_and_new_parts_get_plain_names():
    def names(case):
        return set(varied_model(case_config(case)).state_dict())
    classic = set(varied_model(tiny_config()).state_dict())
    modern = names("modern")
    assert "encoder.final_norm.weight" in modern and "decoder.final_norm.weight" in modern
    assert "encoder.layer_stack.0.pos_ffn.w_3.weight" in modern
    assert "encoder.layer_stack.0.slf_attn.layer_norm.weight" in modern  # the seed's name, now before the sublayer
    assert not any("pos_table" in n or "rotary" in n or n == "encoder.layer_norm.weight" for n in modern)
    assert "decoder.layer_stack.1.enc_attn.sandwich_norm.bias" in names("sandwich")
    relative = names("relative")
    assert {n for n in relative if "relative" in n} == {"encoder.relative_attention_bias.weight",
                                                        "decoder.relative_attention_bias.weight"}
    assert "encoder.layer_stack.0.slf_attn.w_qs.bias" in names("attention bias")
    assert not any(n.endswith("w_1.bias") for n in names("no ffn bias"))
    # every seed part that a variant keeps has the seed's name: only the named new parts are added
    added = {n for case in CASES for n in names(case)} - classic
    assert {n.split(".")[-2] if "layer_stack" in n else n.split(".")[1] for n in added} <= {
        "final_norm", "sandwich_norm", "w_3", "relative_attention_bias", "w_qs", "w_ks", "w_vs", "fc"}


@pytest.mark.parametrize("buckets, distance", [(32, 128), (8, 20), (6, 9)])
def test_relative_buckets_are_t5s(buckets, distance):
    relative = np.arange(-300, 301)
    for bidirectional in (True, False):
        want = t5_bucket(torch.from_numpy(relative), bidirectional, buckets, distance).numpy()
        assert (relative_buckets(relative, bidirectional, buckets, distance) == want).all()


def test_rope_turns_consecutive_pairs_by_the_configured_base():
    model = varied_model(case_config("rope"))
    cos, sin = model.encoder.rotary(3, 2)  # positions 3 and 4
    d = model.config.d_k
    assert torch.allclose(cos[1, 4], torch.tensor(np.cos(4 * 100.0 ** (-4 / d)), dtype=torch.float32))
    assert torch.equal(cos[:, 0::2], cos[:, 1::2]) and torch.equal(sin[:, 0::2], sin[:, 1::2])
    assert "encoder.rotary.cos" not in model.state_dict()  # computed, never stored


def test_config_serialises_classic_as_before_and_variants_completely():
    classic = tiny_config()
    assert not set(CLASSIC) & set(classic.to_dict())
    assert ModelConfig.from_dict(classic.to_dict()) == classic
    modern = tiny_config(**PRESETS["modern"])
    assert set(CLASSIC) <= set(modern.to_dict())
    assert ModelConfig.from_json(modern.to_json()) == modern


@pytest.mark.parametrize("bad, message", [
    (dict(norm="batchnorm"), "norm must be one of layernorm, rmsnorm, got 'batchnorm'"),
    (dict(placement="middle"), "placement must be one of post, pre, sandwich, deepnorm"),
    (dict(activation="tanh"), "activation must be one of " + ", ".join(ACTIVATIONS)),
    (dict(positions="alibi"), "positions must be one of sinusoid, learned, rope, relative"),
    (dict(positions="rope", d_k=5), "d_k must be even (got 5)"),
    (dict(placement="deepnorm", deepnorm_alpha=0.0), "deepnorm_alpha must be a positive finite number, got 0.0"),
    (dict(placement="deepnorm", deepnorm_alpha=-2), "deepnorm_alpha must be a positive finite number"),
    (dict(deepnorm_alpha=2.0), "deepnorm_alpha only applies with placement 'deepnorm'"),
    (dict(rope_base=500.0), "rope_base only applies with positions 'rope'"),
    (dict(positions="relative", relative_buckets=7), "relative_buckets must be even and at least 4"),
    (dict(embedding_norm="yes"), "embedding_norm must be true or false"),
    (dict(norm_eps=0), "norm_eps must be a positive finite number"),
])
def test_impossible_variant_configs_are_refused(bad, message):
    with pytest.raises(CheckpointError, match=message.replace("(", r"\(").replace(")", r"\)")):
        tiny_config(**bad)


def _rewrite(path, change) -> None:
    data = torch.load(path, weights_only=True)
    change(data)
    torch.save(data, path)


@pytest.mark.parametrize("change, message", [
    (lambda d: d["config"].update(norm="scalenorm"), "norm must be one of layernorm, rmsnorm, got 'scalenorm'"),
    (lambda d: d["config"].update(activation="relu"), "unexpected encoder.layer_stack.0.pos_ffn.w_3.weight"),
    (lambda d: d["config"].update(relative_buckets=16),
     "encoder.relative_attention_bias.weight has shape (8, 2), the config needs (16, 2)"),
    (lambda d: d["config"].update(placement="deepnorm", deepnorm_alpha=-1.0), "deepnorm_alpha must be a positive"),
])
def test_checkpoints_that_do_not_fit_their_config_are_one_line_errors(tmp_path, change, message):
    path = save_varied_checkpoint(case_config("t5-like"), tmp_path / "ckpt")
    _rewrite(path, change)
    out = tmp_path / "out"
    result = CliRunner().invoke(export_main, ["onnx", "--checkpoint", str(path), "--output", str(out)])
    assert result.exit_code == 1 and message in result.output and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1
    assert not out.exists() and listing(tmp_path) == ["ckpt", "ckpt/ckpt.pt", "ckpt/tokenizer.json"]


def test_random_checkpoint_takes_presets_and_single_flags(tmp_path):
    out = tmp_path / "m"
    args = ["random-checkpoint", "--output", str(out), "--d-model", "16", "--heads", "2", "--layers", "1", "--ffn",
            "24", "--vocab-size", "12", "--preset", "t5", "--activation", "swiglu", "--attention-bias",
            "--relative-buckets", "8"]
    result = CliRunner().invoke(export_main, args)
    assert result.exit_code == 0, result.output
    cfg = load_checkpoint(out / "ckpt.pt").config
    assert (cfg.norm, cfg.placement, cfg.positions, cfg.activation, cfg.attention_bias, cfg.relative_buckets) == \
        ("rmsnorm", "pre", "relative", "swiglu", True, 8)
    deep = CliRunner().invoke(export_main, [*args[:11], "--placement", "deepnorm", "--output", str(tmp_path / "d")])
    assert deep.exit_code == 0 and load_checkpoint(tmp_path / "d" / "ckpt.pt").config.deepnorm_alpha == 2 ** 0.25


@pytest.mark.parametrize("flags, message", [
    (["--norm", "foo"], "norm must be one of layernorm, rmsnorm, got 'foo'"),
    (["--preset", "modern", "--d-model", "24", "--heads", "8"], "d_k must be even (got 3)"),
    (["--placement", "deepnorm", "--deepnorm-alpha", "0"], "deepnorm_alpha must be a positive finite number"),
    (["--positions", "relative", "--relative-buckets", "3"], "relative_buckets must be even"),
])
def test_bad_architecture_flags_are_one_line_errors_and_write_nothing(tmp_path, flags, message):
    result = CliRunner().invoke(export_main, ["random-checkpoint", "--output", str(tmp_path / "m"), "--d-model",
                                              "16", "--heads", "2", "--vocab-size", "12", *flags])
    assert result.exit_code == 1 and message in result.output and "Traceback" not in result.output
    assert not (tmp_path / "m").exists()


@pytest.mark.parametrize("flags, message", [
    (["--positions", "alibi"], "positions must be one of sinusoid, learned, rope, relative, got 'alibi'"),
    (["--placement", "deepnorm", "--deepnorm-alpha", "-1"], "deepnorm_alpha must be a positive finite number"),
])
def test_train_demo_refuses_bad_architecture_flags_before_training(tmp_path, flags, message):
    result = CliRunner().invoke(export_main, ["train-demo", "--output", str(tmp_path / "m"), "--steps", "1",
                                              "--preset", "modern", *flags])
    assert result.exit_code == 1 and message in result.output and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1 and not (tmp_path / "m").exists()


ctranslate2 = pytest.importorskip("ctranslate2")


@pytest.mark.parametrize("case", [c for c in CASES if "deepnorm" not in c])
def test_ctranslate2_scores_every_expressible_variant_as_we_do(tmp_path, case):
    """CTranslate2's own implementation of RMSNorm, RoPE, GLUs, relative bias and pre/sandwich norms is a
    second, independent oracle: its log-probabilities of a forced target equal the model's."""
    from tfm_export.bench.ctranslate2 import convert_to_ctranslate2
    ckpt = load_checkpoint(save_varied_checkpoint(case_config(case, n_position=40), tmp_path / "ckpt"))
    translator = ctranslate2.Translator(str(convert_to_ctranslate2(ckpt, tmp_path / "ct2")), device="cpu")
    tokens = ckpt.vocab.source.tokens()
    words = [[[tokens[i] for i in row if i > 3] for row in rows] for rows in (SRC, TRG)]
    scored = translator.score_batch(*words)
    with torch.no_grad():
        for row, result in enumerate(scored):
            src = torch.tensor([[2] + [i for i in SRC[row] if i > 3] + [3]])
            trg = [i for i in TRG[row] if i > 3]
            logp = torch.log_softmax(ckpt.model(src, torch.tensor([[2] + trg])), -1)[0]
            want = logp[torch.arange(len(trg) + 1), torch.tensor([*trg, 3])].numpy()
            assert np.abs(np.array(result.log_probs) - want).max() < 2e-3, (case, result.log_probs, want)


def test_ctranslate2_says_why_it_cannot_run_deepnorm(tmp_path):
    from tfm_export.bench.ctranslate2 import convert_to_ctranslate2, unsupported
    ckpt = load_checkpoint(save_varied_checkpoint(case_config("deepnorm"), tmp_path / "ckpt"))
    assert "DeepNorm" in unsupported(ckpt.config)
    with pytest.raises(TfmExportError, match="DeepNorm"):
        convert_to_ctranslate2(ckpt, tmp_path / "ct2")
    assert not (tmp_path / "ct2").exists()


def test_classic_checkpoint_json_has_no_variant_fields(tmp_path):
    data = torch.load(random_checkpoint(tiny_config(), tmp_path), weights_only=True)
    assert not set(CLASSIC) & set(data["config"])
    assert json.loads(json.dumps(data["config"])) == tiny_config().to_dict()


@pytest.mark.parametrize("preset", PRESETS)
def test_the_torch_backend_makes_every_tensor_on_its_models_device(preset):
    """`tfm-run translate --backend torch --device cuda` failed ("expected self and mask to be on the same device"):
    a step made its masks and position indices on the default device. With the default device set to one the
    model is not on (meta), any tensor made without its inputs' device fails here as it would on a GPU."""
    from tfm_export.runtime import decoding
    from tfm_export.runtime.backends.reference import TorchBackend
    torch.manual_seed(0)
    backend = TorchBackend(Transformer(tiny_config(n_position=24, **PRESETS[preset])).eval())
    src = np.array([[2, 5, 6, 7, 3], [2, 8, 3, 1, 1]])
    want = [decoding.greedy(backend, src, 6), decoding.beam_search(backend, src, 3, 6)]
    with torch.device("meta"):
        got = [decoding.greedy(backend, src, 6), decoding.beam_search(backend, src, 3, 6)]
    assert got == want
