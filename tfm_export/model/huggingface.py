"""Hugging Face model directories (what `save_pretrained` writes) read as members of the variant family.

Like CTranslate2's converters, each family is a spec: which variant options its config implies and which of its
weight names becomes which of ours. There is no second model: a Marian, M2M100/NLLB, BART, mBART or T5 checkpoint
becomes a `ModelConfig` and a state_dict of the reference Transformer. Weights are read with `safetensors`, or
from a `.bin` pickle through the same weights-only loader as every other checkpoint; `transformers` is not needed.

Where a family's maths differs from the family's options only by a constant, the constant is folded into the
weights at load time instead of becoming another option:
- T5 does not divide attention scores by sqrt(d_kv): its query weights are multiplied by sqrt(d_kv);
- an untied head with scaled embeddings: the embedding tables are multiplied by sqrt(d_model);
- fixed sinusoid tables (Marian's [sin | cos] halves, M2M100's fairseq table at offset pad + 1) and BART's learned
  table at offset 2 become a position table read from position 0 ("learned" positions, loaded not trained).
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..artifacts.manifest import HF_CONFIG_FILE as CONFIG_FILE
from ..core.config import ModelConfig
from ..core.errors import CheckpointError, first_line
from ..core.files import contained_file, file_sha256, read_json
from ..core.token_rules import (
    EARLY_STOPPING_VALUES,
    TokenRules,
    is_early_stopping,
    is_finite_number,
    is_token_id,
)
from ..core.tokenizer import Vocabulary
from ..core.variants import GATED_ACTIVATIONS
from .checkpoint import HUGGINGFACE, Checkpoint, build_model, read_checkpoint_file, validate_state_dict
from .hf_tokenizer import (
    MARIAN_CODES,
    converted_vocabulary,
    m2m100_vocabulary,
    marian_vocabulary,
    tokenizer_json,
    with_languages,
)
from .positions import fairseq_sinusoid_table, halves_sinusoid_table

GENERATION_CONFIG_FILE = "generation_config.json"
SAFETENSORS_FILE = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
PICKLE_FILE = "pytorch_model.bin"
BART_POSITION_OFFSET = 2  # BartLearnedPositionalEmbedding: the row of position t is t + 2
DEFAULT_NEW_TOKENS = 20  # generate()'s when no max_length is set anywhere
T5_DEFAULT_POSITIONS = 512  # T5 has no position limit of its own; its configs' n_positions says 512
HF_ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "swish": "swish", "silu": "swish", "gelu_new": "gelu_tanh",
                  "gelu_pytorch_tanh": "gelu_tanh", "gelu_fast": "gelu_tanh"}
# generate() settings tfm-export does not apply, with the values that mean "off"
UNAPPLIED_GENERATION = {"do_sample": (False,), "min_length": (0,), "min_new_tokens": (0,),
                        "no_repeat_ngram_size": (0,), "encoder_no_repeat_ngram_size": (0,),
                        "repetition_penalty": (1.0,), "num_beam_groups": (1,), "diversity_penalty": (0.0,),
                        "suppress_tokens": ([],), "begin_suppress_tokens": ([],), "sequence_bias": ({},),
                        "exponential_decay_length_penalty": ()}
LINKED = "copy the model directory with its files, not links to elsewhere"
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class HfModel:
    directory: Path
    hf_config: dict[str, Any]  # config.json as read
    config: ModelConfig
    state: dict[str, torch.Tensor]
    rules: TokenRules  # what generate() does with this model by default


def _layer_names(prefix: str, names: dict[str, str]) -> Callable[[str, int], dict[str, str]]:
    """Our name -> theirs for layer i of one stack (`side` is encoder or decoder)."""
    def names_of(side: str, i: int) -> dict[str, str]:
        return {f"{side}.layer_stack.{i}.{ours}": prefix.format(side=side, i=i) + theirs
                for ours, theirs in names.items()
                if side == "decoder" or not ours.startswith("enc_attn")}
    return names_of


def _linear(ours: str, theirs: str, bias: bool) -> dict[str, str]:
    return {f"{ours}.weight": f"{theirs}.weight", **({f"{ours}.bias": f"{theirs}.bias"} if bias else {})}


def _bart_layer() -> dict[str, str]:
    names: dict[str, str] = {}
    for ours, theirs in (("slf_attn", "self_attn"), ("enc_attn", "encoder_attn")):
        for w, proj in (("w_qs", "q_proj"), ("w_ks", "k_proj"), ("w_vs", "v_proj"), ("fc", "out_proj")):
            names |= _linear(f"{ours}.{w}", f"{theirs}.{proj}", bias=True)
        names |= _linear(f"{ours}.layer_norm", f"{theirs}_layer_norm", bias=True)
    names |= _linear("pos_ffn.w_1", "fc1", True) | _linear("pos_ffn.w_2", "fc2", True)
    return names | _linear("pos_ffn.layer_norm", "final_layer_norm", True)


def _t5_layer(gated: bool) -> Callable[[str, int], dict[str, str]]:
    def names_of(side: str, i: int) -> dict[str, str]:
        ffn = 2 if side == "decoder" else 1
        parts = [("slf_attn", 0, "SelfAttention")] + ([("enc_attn", 1, "EncDecAttention")] if ffn == 2 else [])
        names = {}
        for ours, index, theirs in parts:
            for w, proj in (("w_qs", "q"), ("w_ks", "k"), ("w_vs", "v"), ("fc", "o")):
                names[f"{ours}.{w}.weight"] = f"layer.{index}.{theirs}.{proj}.weight"
            names[f"{ours}.layer_norm.weight"] = f"layer.{index}.layer_norm.weight"
        dense = f"layer.{ffn}.DenseReluDense"
        names["pos_ffn.w_1.weight"] = f"{dense}.wi_0.weight" if gated else f"{dense}.wi.weight"
        if gated:
            names["pos_ffn.w_3.weight"] = f"{dense}.wi_1.weight"
        names["pos_ffn.w_2.weight"] = f"{dense}.wo.weight"
        names["pos_ffn.layer_norm.weight"] = f"layer.{ffn}.layer_norm.weight"
        return {f"{side}.layer_stack.{i}.{k}": f"{side}.block.{i}.{v}" for k, v in names.items()}
    return names_of


def _get(hf: dict[str, Any], path: Path, *names: str, default: Any = ...) -> Any:
    for name in names:
        if hf.get(name) is not None:
            return hf[name]
    if default is ...:
        raise CheckpointError(f"{path}: config.json has no {names[0]}; save the model again with save_pretrained")
    return default


def _same(hf: dict[str, Any], path: Path, a: str, b: str) -> Any:
    """A value the encoder and decoder must share (our family uses one per model)."""
    if hf.get(b) is not None and hf.get(a) != hf.get(b):
        raise CheckpointError(f"{path}: {a} ({hf.get(a)}) differs from {b} ({hf.get(b)}); tfm-export needs the "
                              "encoder and decoder to have the same depth, heads and FFN size")
    return _get(hf, path, a)


def _activation(name: Any, path: Path) -> str:
    if not isinstance(name, str) or name not in HF_ACTIVATIONS:
        raise CheckpointError(f"{path}: activation {name!r} is not supported (supported: "
                              f"{', '.join(sorted(HF_ACTIVATIONS))})")
    return HF_ACTIVATIONS[name]


def _t5_scales_output(hf: dict[str, Any]) -> bool:
    """T5 v1.0 scales the decoder output by d_model^-0.5 before its tied head; v1.1 does not. transformers 5
    writes `scale_decoder_outputs`; older files say it through `tie_word_embeddings: false`. mT5 is v1.1."""
    if hf["model_type"] == "mt5":
        return False
    if "scale_decoder_outputs" in hf:
        return bool(hf["scale_decoder_outputs"])
    return hf.get("tie_word_embeddings", True) is not False


SIDES = ("encoder", "decoder")


class FamilyLoader:
    """One Hugging Face family as a member of the variant family, registered per model_type as CTranslate2 registers
    its converters' loaders: what its config implies, which of its weight names become ours, its position table, the
    constants folded into the weights, its tokenizer and its language codes. The BART-shaped families differ only in
    the class attributes and their position tables; T5 overrides the rest."""

    model_types: tuple[str, ...] = ()
    placement = "post"
    embedding_norm = False
    final_norm = False
    output_bias = False
    language_codes: str | None = None  # the pattern of its language tokens, where it has them

    def config(self, hf: dict[str, Any], path: Path) -> ModelConfig:
        """The variant-family config that computes what this HF config does."""
        d_model, heads = _get(hf, path, "d_model"), _same(hf, path, "encoder_attention_heads",
                                                          "decoder_attention_heads")
        if not isinstance(heads, int) or isinstance(heads, bool) or heads < 1 or not isinstance(d_model, int) \
                or d_model % heads:
            raise CheckpointError(f"{path}: d_model ({d_model!r}) is not a multiple of the heads ({heads!r})")
        sizes = dict(d_model=d_model, d_inner=_same(hf, path, "encoder_ffn_dim", "decoder_ffn_dim"), n_head=heads,
                     d_k=d_model // heads, d_v=d_model // heads,
                     n_layers=_same(hf, path, "encoder_layers", "decoder_layers"),
                     n_position=_get(hf, path, "max_position_embeddings"))
        variant = dict(norm="layernorm", norm_eps=1e-5, activation=_activation(hf.get("activation_function"), path),
                       attention_bias=True, positions="learned")
        return self._config(hf, path, sizes | variant, "emb" if hf.get("scale_embedding") else "none")

    def _config(self, hf: dict[str, Any], path: Path, options: dict[str, Any], scale: str) -> ModelConfig:
        """The family's fixed options, the vocabularies and their sharing, with the sizes and options given."""
        pad, vocab = _get(hf, path, "pad_token_id"), _get(hf, path, "vocab_size")
        trg_vocab = hf.get("decoder_vocab_size") or vocab
        shared = bool(hf.get("share_encoder_decoder_embeddings", True))
        return ModelConfig(src_vocab_size=vocab, trg_vocab_size=trg_vocab, src_pad_idx=pad, trg_pad_idx=pad,
                           dropout=0.0, proj_share_weight=True, embs_share_weight=shared and vocab == trg_vocab,
                           scale_emb_or_prj=scale, placement=self.placement, embedding_norm=self.embedding_norm,
                           output_bias=self.output_bias, **options)

    def names(self, config: ModelConfig, tensors: dict[str, torch.Tensor], path: Path) -> dict[str, str]:
        """Our parameter name -> the file's, for every parameter the config's model has but positions and head."""
        stacks: dict[str, str] = {}
        for side in SIDES:
            if self.embedding_norm:
                stacks |= _linear(f"{side}.layer_norm", f"model.{side}.layernorm_embedding", True)
            if self.final_norm:
                stacks |= _linear(f"{side}.final_norm", f"model.{side}.layer_norm", True)
        return _with_layers_and_embeddings(stacks, _layer_names("model.{side}.layers.{i}.", _bart_layer()), config,
                                           tensors, path, "model.", "model.shared.weight")

    def positions(self, config: ModelConfig, tensors: dict[str, torch.Tensor], path: Path) -> dict[str, torch.Tensor]:
        """Each stack's position table, read from position 0: BART's learned one, whose row of position t is t + 2."""
        tables = {}
        for side in SIDES:
            name = _first(tensors, path, f"model.{side}.embed_positions.weight")
            table = tensors[name][BART_POSITION_OFFSET:BART_POSITION_OFFSET + config.n_position].unsqueeze(0)
            if table.shape[1] != config.n_position:
                raise CheckpointError(f"{path}: weight {name} has shape {tuple(tensors[name].shape)}, the config needs "
                                      f"({config.n_position + BART_POSITION_OFFSET}, {config.d_model})")
            tables[f"{side}.position_enc.pos_table"] = table
        return tables

    def fold(self, config: ModelConfig, state: dict[str, torch.Tensor]) -> None:
        """Constants of the family's maths that the variant family has no option for, folded into the weights."""

    def vocabulary(self, directory: Path, hf: dict[str, Any], config: ModelConfig) -> Vocabulary:
        return tokenizer_json(directory, config) or converted_vocabulary(directory, config)

    def languages(self, rules: TokenRules, vocab: Vocabulary) -> TokenRules:
        """The rules with the model's language codes, where the family has them."""
        return rules if self.language_codes is None else with_languages(rules, self.language_codes, vocab.target)


LOADERS: dict[str, FamilyLoader] = {}


def register_loader(cls: type[FamilyLoader]) -> type[FamilyLoader]:
    for model_type in cls.model_types:
        LOADERS[model_type] = cls()
    return cls


def _both_stacks(table: torch.Tensor) -> dict[str, torch.Tensor]:
    return {f"{side}.position_enc.pos_table": table for side in SIDES}


@register_loader
class MarianLoader(FamilyLoader):
    """opus-mt: post-norm, Marian's [sin | cos] table, two SentencePiece models, target codes before the source."""

    model_types = ("marian",)
    output_bias = True

    def positions(self, config: ModelConfig, tensors: dict[str, torch.Tensor], path: Path) -> dict[str, torch.Tensor]:
        return _both_stacks(halves_sinusoid_table(config.n_position, config.d_model))

    def vocabulary(self, directory: Path, hf: dict[str, Any], config: ModelConfig) -> Vocabulary:
        return tokenizer_json(directory, config) or marian_vocabulary(directory, hf, config)

    def languages(self, rules: TokenRules, vocab: Vocabulary) -> TokenRules:
        return with_languages(rules, MARIAN_CODES, vocab.source, "source_prefix")


@register_loader
class M2M100Loader(FamilyLoader):
    """M2M100 and NLLB: pre-norm with final norms, fairseq's sinusoid table at offset pad + 1."""

    model_types = ("m2m_100",)
    placement, final_norm = "pre", True
    language_codes = r"__[A-Za-z-]+__|[a-z]{3}_[A-Z][a-z]{3}"  # M2M100's __fr__, NLLB's fra_Latn

    def positions(self, config: ModelConfig, tensors: dict[str, torch.Tensor], path: Path) -> dict[str, torch.Tensor]:
        if config.d_model < 4:  # its frequencies divide by d/2 - 1
            raise CheckpointError(f"{path}: d_model {config.d_model} is too small for a sinusoid position table (at "
                                  "least 4)")
        return _both_stacks(fairseq_sinusoid_table(config.n_position, config.d_model, first=config.src_pad_idx + 1))

    def vocabulary(self, directory: Path, hf: dict[str, Any], config: ModelConfig) -> Vocabulary:
        return tokenizer_json(directory, config) or m2m100_vocabulary(directory, config)


@register_loader
class BartLoader(FamilyLoader):
    model_types = ("bart",)
    embedding_norm = output_bias = True


@register_loader
class MBartLoader(BartLoader):
    model_types = ("mbart",)
    placement, final_norm = "pre", True
    language_codes = r"[a-z]{2}_[A-Z]{2}"


@register_loader
class T5Loader(FamilyLoader):
    """T5, mT5 and Flan-T5: RMSNorm, pre-norm, relative position buckets, no 1/sqrt(d_kv) in attention."""

    model_types = ("t5", "mt5")
    placement, final_norm = "pre", True

    def config(self, hf: dict[str, Any], path: Path) -> ModelConfig:
        proj = str(_get(hf, path, "feed_forward_proj", default="relu"))
        gated, _, act = proj.rpartition("-")
        activation = _activation("gelu_new" if proj == "gated-gelu" else act, path)
        if gated:
            activation = {"gelu": "geglu", "gelu_tanh": "geglu_tanh", "swish": "swiglu"}.get(activation, "")
            if not activation or gated != "gated":
                raise CheckpointError(f"{path}: feed_forward_proj {proj!r} is not supported")
        options = dict(d_model=_get(hf, path, "d_model"), d_inner=_get(hf, path, "d_ff"),
                       n_head=_get(hf, path, "num_heads"), d_k=_get(hf, path, "d_kv"), d_v=_get(hf, path, "d_kv"),
                       n_layers=_same(hf, path, "num_layers", "num_decoder_layers"),
                       n_position=_get(hf, path, "n_positions", default=T5_DEFAULT_POSITIONS),
                       norm="rmsnorm", norm_eps=_get(hf, path, "layer_norm_epsilon", default=1e-6),
                       activation=activation, ffn_bias=False, attention_bias=False, positions="relative",
                       relative_buckets=_get(hf, path, "relative_attention_num_buckets", default=32),
                       relative_max_distance=_get(hf, path, "relative_attention_max_distance", default=128))
        return self._config(hf, path, options, "prj" if _t5_scales_output(hf) else "none")

    def names(self, config: ModelConfig, tensors: dict[str, torch.Tensor], path: Path) -> dict[str, str]:
        stacks = {f"{side}.relative_attention_bias.weight":
                  f"{side}.block.0.layer.0.SelfAttention.relative_attention_bias.weight" for side in SIDES}
        stacks |= {f"{side}.final_norm.weight": f"{side}.final_layer_norm.weight" for side in SIDES}
        return _with_layers_and_embeddings(stacks, _t5_layer(config.activation in GATED_ACTIVATIONS), config,
                                           tensors, path, "", "shared.weight")

    def positions(self, config: ModelConfig, tensors: dict[str, torch.Tensor], path: Path) -> dict[str, torch.Tensor]:
        return {}  # the relative bias buckets are computed, never stored

    def fold(self, config: ModelConfig, state: dict[str, torch.Tensor]) -> None:
        """T5 does not divide attention scores by sqrt(d_kv): its query weights carry the factor instead."""
        for key in [k for k in state if k.endswith("attn.w_qs.weight")]:
            state[key] = state[key] * config.d_k ** 0.5


SUPPORTED = ", ".join(sorted(LOADERS))


def _with_layers_and_embeddings(stacks: dict[str, str], layer: Callable[[str, int], dict[str, str]],
                                config: ModelConfig, tensors: dict[str, torch.Tensor], path: Path, base: str,
                                shared: str) -> dict[str, str]:
    """A family's name map: its stack-level names, every layer's, and the two embedding tables (stored under their
    own names or only as the shared table)."""
    names = dict(stacks)
    for side in SIDES:
        for i in range(config.n_layers):
            names |= layer(side, i)
    names["encoder.src_word_emb.weight"] = _first(tensors, path, f"{base}encoder.embed_tokens.weight", shared)
    names["decoder.trg_word_emb.weight"] = _first(tensors, path, f"{base}decoder.embed_tokens.weight", shared)
    return names


def _json_object(directory: Path, name: str, what: str) -> dict[str, Any]:
    path = contained_file(directory, name, CheckpointError, what, LINKED)
    data = read_json(path, CheckpointError, "save the model again with save_pretrained")
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: holds a {type(data).__name__}, expected a JSON object")
    return data


def read_config(directory: Path) -> dict[str, Any]:
    if not (directory / CONFIG_FILE).is_file():
        raise CheckpointError(f"{directory}: no {CONFIG_FILE}; pass a directory written by save_pretrained")
    hf = _json_object(directory, CONFIG_FILE, "model config")
    path = directory / CONFIG_FILE
    if not isinstance(hf.get("model_type"), str) or hf["model_type"] not in LOADERS:
        raise CheckpointError(f"{path}: model_type {hf.get('model_type')!r} is not supported; tfm-export reads "
                              f"{SUPPORTED}")
    return hf


def _safetensors(files: list[Path]) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file
    tensors: dict[str, torch.Tensor] = {}
    for file in files:
        try:
            tensors.update(load_file(file))
        except (SafetensorError, OSError, ValueError) as exc:
            raise CheckpointError(f"{file}: not a readable safetensors file ({first_line(exc)}); "
                                  "copy or save it again") from None
    return tensors


def read_weights(directory: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the model: safetensors (one file or an index of shards), else the weights-only pickle."""
    inside = lambda name: contained_file(directory, name, CheckpointError, "weights file", LINKED)  # noqa: E731
    if (directory / SAFETENSORS_FILE).is_file():
        return _safetensors([inside(SAFETENSORS_FILE)])
    if (directory / SAFETENSORS_INDEX).is_file():
        weight_map = _json_object(directory, SAFETENSORS_INDEX, "shard index").get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise CheckpointError(f"{directory / SAFETENSORS_INDEX}: has no weight_map of tensor -> shard file; "
                                  "save the model again with save_pretrained")
        # contained_file refuses any shard name that is not a plain file name inside the directory
        shards = list(dict.fromkeys(weight_map.values()))
        return _safetensors([contained_file(directory, name, CheckpointError, f"shard named by {SAFETENSORS_INDEX}",
                                            LINKED) for name in shards])
    if (directory / PICKLE_FILE).is_file():
        data = read_checkpoint_file(inside(PICKLE_FILE))  # weights_only: code in the pickle is refused
        bad = [k for k, v in data.items() if not isinstance(v, torch.Tensor)]
        if bad:
            raise CheckpointError(f"{directory / PICKLE_FILE}: {bad[0]!r} is not a tensor; expected a state_dict")
        return data
    raise CheckpointError(f"{directory}: no {SAFETENSORS_FILE}, {SAFETENSORS_INDEX} or {PICKLE_FILE}; "
                          "copy the weights file into the directory")


def _first(tensors: dict[str, torch.Tensor], path: Path, *names: str) -> str:
    """The first of these names the file has (tied tables are stored under any one of them)."""
    for name in names:
        if name in tensors:
            return name
    raise CheckpointError(f"{path}: missing weight {names[0]}")


def _head(hf: dict[str, Any], config: ModelConfig, tensors: dict[str, torch.Tensor],
          state: dict[str, torch.Tensor]) -> ModelConfig:
    """The output projection: tied to the target embedding unless the file holds a different lm_head (then the
    embedding scale, which the family applies only with a tied head, is folded into the tables)."""
    if config.output_bias:
        bias = tensors.get("final_logits_bias", torch.zeros(1, config.trg_vocab_size))
        state["trg_word_prj.bias"] = bias.reshape(-1)
    head = tensors.get("lm_head.weight")
    if head is None or torch.equal(head, state["decoder.trg_word_emb.weight"]):
        state["trg_word_prj.weight"] = state["decoder.trg_word_emb.weight"]
        return config
    state["trg_word_prj.weight"] = head
    if config.scale_emb:
        for name in ("encoder.src_word_emb.weight", "decoder.trg_word_emb.weight"):
            state[name] = state[name] * config.d_model ** 0.5
    return dataclasses.replace(config, proj_share_weight=False, embs_share_weight=False,
                               scale_emb_or_prj="none" if config.scale_emb_or_prj == "emb" else
                               config.scale_emb_or_prj)


def convert(hf: dict[str, Any], tensors: dict[str, torch.Tensor], path: Path) -> tuple[ModelConfig,
                                                                                       dict[str, torch.Tensor]]:
    """The config and state_dict of the reference Transformer that computes this HF model."""
    loader = LOADERS[hf["model_type"]]
    config = loader.config(hf, path)
    names = loader.names(config, tensors, path)
    missing = [theirs for theirs in names.values() if theirs not in tensors]
    if missing:
        raise CheckpointError(f"{path}: missing weight {missing[0]}" +
                              (f" (and {len(missing) - 1} more)" if len(missing) > 1 else "") +
                              f"; the config says {config.n_layers} layers of {hf['model_type']}")
    # half precision is widened; an integer tensor is left as it is for validate_state_dict to name
    state = {ours: tensors[theirs].float() if tensors[theirs].is_floating_point() else tensors[theirs]
             for ours, theirs in names.items()}
    state |= loader.positions(config, tensors, path)
    config = _head(hf, config, tensors, state)
    names |= {"trg_word_prj.bias": "final_logits_bias",
              "trg_word_prj.weight": names["decoder.trg_word_emb.weight"] if config.proj_share_weight
              else "lm_head.weight"}
    loader.fold(config, state)
    if config.embs_share_weight and not torch.equal(state["encoder.src_word_emb.weight"],
                                                    state["decoder.trg_word_emb.weight"]):
        config = dataclasses.replace(config, embs_share_weight=False)
    validate_state_dict(state, config, path, names)
    return config, {k: v.contiguous() for k, v in state.items()}


def _first_id(merged: dict[str, Any], key: str) -> int | None:
    """An id field (transformers allows a list for eos; the first one is the one that ends a sentence here)."""
    value = merged.get(key)
    if isinstance(value, list) and value:
        value = value[0]
    if value is None or is_token_id(value):
        return value
    raise CheckpointError(f"{key} must be a token id, got {value!r}")


def _banned(merged: dict[str, Any]) -> tuple[int, ...]:
    """bad_words_ids of one token each (generate() bans them at every step); longer ones are refused rather
    than ignored, since decoding would then differ from generate()."""
    words = merged.get("bad_words_ids") or []
    if not isinstance(words, list) or not all(isinstance(w, list) and w and all(map(is_token_id, w)) for w in words):
        raise CheckpointError(f"bad_words_ids must be a list of lists of token ids, got {words!r}")
    if any(len(w) > 1 for w in words):
        raise CheckpointError("bad_words_ids of more than one token are not supported; remove them from the "
                              "generation config")
    return tuple(sorted({w[0] for w in words}))


def _max_new_tokens(merged: dict[str, Any]) -> int:
    """Tokens generate() makes by default: max_new_tokens, else max_length less the decoder start; neither set,
    20 new tokens (capped by max_position_embeddings)."""
    if merged.get("max_new_tokens") is not None:
        value = merged["max_new_tokens"]
        if not is_token_id(value) or value < 1:
            raise CheckpointError(f"max_new_tokens must be a whole number of at least 1, got {value!r}")
        return value
    value = merged.get("max_length")
    if value is not None:
        if not is_token_id(value) or value < 2:
            raise CheckpointError(f"max_length must be a whole number of at least 2, got {value!r}")
        return value - 1
    cap = merged.get("max_position_embeddings")
    return min(DEFAULT_NEW_TOKENS + 1, cap) - 1 if is_token_id(cap) and cap > 1 else DEFAULT_NEW_TOKENS


def _search_defaults(merged: dict[str, Any]) -> dict[str, Any]:
    """num_beams, length_penalty and early_stopping as generate() would use them."""
    beams, penalty = merged.get("num_beams", 1), merged.get("length_penalty", 1.0)
    stopping = merged.get("early_stopping", False)
    if not is_token_id(beams) or beams < 1:
        raise CheckpointError(f"num_beams must be a whole number of at least 1, got {beams!r}")
    if not is_finite_number(penalty):
        raise CheckpointError(f"length_penalty must be a number, got {penalty!r}")
    if not is_early_stopping(stopping):
        raise CheckpointError(f"early_stopping must be {EARLY_STOPPING_VALUES}, got {stopping!r}")
    return dict(num_beams=beams, length_penalty=float(penalty), early_stopping=stopping)


def _warn_unapplied(merged: dict[str, Any], directory: Path) -> None:
    """Generation settings tfm-export does not apply: named once at export, since outputs may differ from
    generate() where they act."""
    unapplied = [f"{key}={merged[key]!r}" for key, neutral in UNAPPLIED_GENERATION.items()
                 if merged.get(key) not in (None, *neutral)]
    if unapplied:
        log.warning("%s: the generation config sets %s, which tfm-export does not apply; translations may differ "
                    "from generate()'s where they would act", directory, ", ".join(unapplied))


def generation(hf: dict[str, Any], directory: Path, vocab_size: int) -> TokenRules:
    """generation_config.json over config.json, with generate()'s own fallbacks for what neither says."""
    gen = (_json_object(directory, GENERATION_CONFIG_FILE, "generation config")
           if (directory / GENERATION_CONFIG_FILE).is_file() else {})
    merged = {**hf, **gen}
    try:
        pad, eos = _first_id(merged, "pad_token_id"), _first_id(merged, "eos_token_id")
        start = _first_id(merged, "decoder_start_token_id")
        start = _first_id(merged, "bos_token_id") if start is None else start  # generate()'s fallback
        rules = TokenRules(pad=pad, start=start, eos=eos, banned=_banned(merged),
                           forced_bos=_first_id(merged, "forced_bos_token_id"),
                           forced_eos=_first_id(merged, "forced_eos_token_id"),
                           max_new_tokens=_max_new_tokens(merged), beam_rule="transformers",
                           **_search_defaults(merged))
    except CheckpointError as exc:
        raise CheckpointError(f"{directory}: {exc}") from None
    if pad is None or eos is None:
        raise CheckpointError(f"{directory}: the config gives no pad_token_id or eos_token_id")
    if start is None:
        raise CheckpointError(f"{directory}: neither decoder_start_token_id nor bos_token_id is set, so the "
                              "decoder has no first token; add decoder_start_token_id to generation_config.json")
    named = [pad, start, eos, *rules.banned, rules.forced_bos, rules.forced_eos]
    outside = sorted({i for i in named if i is not None and i >= vocab_size})
    if outside:
        raise CheckpointError(f"{directory}: the generation config names token ids {outside} outside the "
                              f"target vocabulary of {vocab_size}")
    _warn_unapplied(merged, directory)
    return rules


def load_hf_checkpoint(directory: Path) -> Checkpoint:
    """The directory as a checkpoint: the reference model, its tokenizers and its generation rules. Its sha256
    covers every file it was read from."""
    hf = load_hf_directory(directory)
    loader = LOADERS[hf.hf_config["model_type"]]
    vocab = loader.vocabulary(directory, hf.hf_config, hf.config)
    files = sorted(p for p in directory.iterdir() if p.is_file() and not p.is_symlink())
    digest = hashlib.sha256("".join(f"{p.name}:{file_sha256(p)}\n" for p in files).encode()).hexdigest()
    rules = loader.languages(hf.rules, vocab)
    model = build_model(hf.config, hf.state, directory, checked=True)  # convert() validated the state
    return Checkpoint(directory, HUGGINGFACE, hf.config, model, vocab, digest, rules, hf.hf_config["model_type"])


def load_hf_directory(directory: str | Path) -> HfModel:
    """Read a local Hugging Face model directory; nothing is downloaded, nothing outside it is read."""
    directory = Path(directory)
    hf = read_config(directory)
    config, state = convert(hf, read_weights(directory), directory)
    return HfModel(directory, hf, config, state, generation(hf, directory, config.trg_vocab_size))
