"""The variant configurations the tests exercise: every option on its own, combinations that hold every option
between them (the issue's four and one for the rest), and random-weight models whose norms, biases and tables are
not at their initial values."""

from __future__ import annotations

from pathlib import Path

import torch

from support.common import made_once, tiny_config
from tfm_export.core.config import ModelConfig
from tfm_export.core.tokenizer import Vocabulary, plain_word_tokenizer
from tfm_export.core.variants import PRESETS
from tfm_export.model.checkpoint import save_checkpoint
from tfm_export.model.transformer import Transformer

SMALL_RELATIVE = dict(relative_buckets=8, relative_max_distance=20)  # log buckets and the last one within 40 tokens
OPTIONS = {
    "rmsnorm": dict(norm="rmsnorm"),
    "layernorm eps 1e-3": dict(norm_eps=1e-3),
    "pre": dict(placement="pre"),
    "sandwich": dict(placement="sandwich"),
    "deepnorm": dict(placement="deepnorm", deepnorm_alpha=1.7),
    "no embedding norm": dict(embedding_norm=False),
    "gelu": dict(activation="gelu"),
    "swish": dict(activation="swish"),
    "glu": dict(activation="glu"),
    "geglu": dict(activation="geglu"),
    "swiglu": dict(activation="swiglu"),
    "no ffn bias": dict(ffn_bias=False),
    "attention bias": dict(attention_bias=True),
    "learned positions": dict(positions="learned"),
    "rope": dict(positions="rope", rope_base=100.0),
    "relative": dict(positions="relative", **SMALL_RELATIVE),
}
COMBINATIONS = {
    "modern": PRESETS["modern"],
    "t5-like": {**PRESETS["t5"], **SMALL_RELATIVE},
    "sandwich + gelu + learned": dict(placement="sandwich", activation="gelu", positions="learned"),
    "deepnorm + swish": dict(placement="deepnorm", deepnorm_alpha=1.5, activation="swish"),
    "glu + attention bias": dict(activation="glu", attention_bias=True),
}
CASES = {**OPTIONS, **COMBINATIONS}


def case_config(name: str, **overrides) -> ModelConfig:
    """A tiny config with the case's options; 'emb' scaling, as the NumPy oracle assumes."""
    return tiny_config(scale_emb_or_prj="emb", **{**CASES[name], **overrides})


def varied_model(cfg: ModelConfig, seed: int = 0, scale: float = 1.5) -> Transformer:
    """Norms and biases away from 1 and 0, so a wrong placement or a missing bias shows, and matrices 1.5x
    their Xavier size, so greedy outputs depend on the source (Xavier-initialised tiny models repeat one
    token) while float32 stays well within 1e-4 of float64."""
    torch.manual_seed(seed)
    model = Transformer(cfg).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.copy_(1 + 0.1 * torch.randn_like(param))
            elif param.dim() == 1:
                param.copy_(0.1 * torch.randn_like(param))
            else:
                param.mul_(scale)
    return model


def save_varied_checkpoint(cfg: ModelConfig, directory: Path, seed: int = 0) -> Path:
    """ckpt.pt + tokenizer.json (tokens w0, w1, ...) of varied_model(cfg)."""
    tok = plain_word_tokenizer(["<unk>", "<blank>", "<s>", "</s>", *(f"w{i}" for i in range(cfg.src_vocab_size - 4))],
                               "random")
    directory.mkdir(parents=True, exist_ok=True)
    return save_checkpoint(varied_model(cfg, seed), Vocabulary(tok, tok), directory / "ckpt.pt")


# Seed 0's one-layer RoPE model emits the same tokens for every source, which would prove nothing about decoding.
WEIGHT_SEEDS = {"rope": 2}


def exported_case(tmp_path_factory, name: str) -> tuple[Path, Path]:
    """(checkpoint, fp32 directory) of the case's varied tiny model with 40 positions, made once per test run for
    every file that reads it (an export takes half a minute). One layer keeps the export short; relative bias and
    the combinations take two (the bias is shared by the layers)."""
    from tfm_export.graphs.pipeline import export_model_dir
    from tfm_export.model.loading import load_checkpoint

    def make(root: Path) -> None:
        layers = 2 if name in COMBINATIONS or name == "relative" else 1
        config = case_config(name, n_position=40, n_layers=layers)
        ckpt = load_checkpoint(save_varied_checkpoint(config, root / "ckpt", WEIGHT_SEEDS.get(name, 0)))
        export_model_dir(ckpt, root / "model", progress=False)
    root = made_once(tmp_path_factory, f"variant-{name}", make)
    return root / "ckpt" / "ckpt.pt", root / "model"
