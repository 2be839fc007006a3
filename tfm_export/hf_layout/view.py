"""`tfm-export hf`: a model directory as the layout transformers.js and Optimum load (`onnx/encoder_model.onnx`,
`onnx/decoder_model_merged.onnx`, Optimum's decoder pair, and config.json, generation_config.json, tokenizer.json,
tokenizer_config.json), written atomically after its parity check.

A seed model presents itself as a Marian model: both libraries compute nothing of the model outside its graphs, and
Marian's loaders read the sizes they need (layers, heads, d_model) under the names written here.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx
from onnx.external_data_helper import load_external_data_for_model
from tqdm import tqdm

from ..artifacts.manifest import HF_VIEW_FORMAT, HF_VIEW_FORMAT_VERSION, MANIFEST
from ..artifacts.model_dir import ModelDir
from ..artifacts.staging import staged_directory
from ..core.config import ModelConfig
from ..core.errors import TfmExportError
from ..core.files import file_sha256
from ..core.graph_spec import Graph
from ..core.token_rules import TokenRules
from ..core.tokenizer import BOS, EOS, Vocabulary, template_codes
from ..graphs.hf_graphs import encoder_model, first_step_decoder, merged_decoder, with_past_decoder
from ..graphs.onnx_io import EXTERNAL_DATA_BYTES, load_graph, weight_bytes
from ..model.checkpoint import HUGGINGFACE
from .tokenizer_view import decoding_targets, dumps, js_tokenizer, same_decodes, same_ids
from .weights_file import WeightsFile

ONNX_DIR = "onnx"
# The file stems both libraries look for, and each precision's suffix (transformers.js's dtype: fp32, fp16, q8)
ENCODER, MERGED, FIRST_STEP, WITH_PAST = "encoder_model", "decoder_model_merged", "decoder_model", \
    "decoder_with_past_model"
STEMS = (ENCODER, MERGED, FIRST_STEP, WITH_PAST)
SUFFIXES = {"fp32": "", "fp16": "_fp16", "int8": "_quantized"}
DTYPES = {"fp32": "fp32", "fp16": "fp16", "int8": "q8"}  # transformers.js's dtype option for each
EXTERNAL_SUFFIX = "_data"  # transformers.js fetches `<file>.onnx_data`
# Written twice: at the top for transformers.js, and beside the graphs for Optimum, which reads it from the
# subfolder it loads the graphs from (and otherwise decodes with generate()'s bare defaults)
GENERATION_CONFIG = "generation_config.json"
SEED_MODEL_TYPE = "marian"
# The families whose config.json names the sizes as Marian's does (with their model class), and T5's
ARCHITECTURES = {"marian": "MarianMTModel", "m2m_100": "M2M100ForConditionalGeneration",
                 "bart": "BartForConditionalGeneration", "mbart": "MBartForConditionalGeneration"}
BART_NAMED, T5_NAMED = tuple(ARCHITECTURES), ("t5", "mt5")
# The language rule transformers.js cannot follow: its translation pipeline forces a target language as the first
# generated token only
DECODER_START_LANGUAGE = "decoder_start"


@dataclass(frozen=True)
class LanguageClass:
    """A tokenizer class transformers.js translates with between language codes: it reads the model's codes as its
    special tokens that match `pattern`, and takes src_lang and tgt_lang as `spell` writes them."""

    name: str  # tokenizer_config.json's tokenizer_class (transformers.js drops a "Fast")
    pattern: str
    bare: bool = False  # M2M100's: a code without its underscores (__fr__ -> fr)

    def spell(self, code: str) -> str:
        return code.strip("_") if self.bare else code


LANGUAGE_CLASSES = (LanguageClass("NllbTokenizerFast", r"[a-z]{3}_[A-Z][a-z]{3}"),
                    LanguageClass("M2M100Tokenizer", r"__[a-z]{2,3}__", bare=True),
                    LanguageClass("MBart50TokenizerFast", r"[a-z]{2}_[A-Z]{2}"))


class HfViewError(TfmExportError):
    """A model the Hugging Face layout cannot express."""


@dataclass(frozen=True)
class HfView:
    """What was written: the directory, its graph files, and the parity lines."""

    output: Path
    files: list[str]
    parity: list[str]


def graph_file(stem: str, precision: str) -> str:
    return f"{ONNX_DIR}/{stem}{SUFFIXES[precision]}.onnx"


def family(model_dir: ModelDir) -> str:
    """The model_type config.json declares: the seed's and its variants' present as Marian, a Hugging Face
    family's as itself."""
    source = model_dir.manifest.source_checkpoint
    if source.format != HUGGINGFACE:
        return SEED_MODEL_TYPE
    model_type = source.model_type
    if model_type not in (*BART_NAMED, *T5_NAMED):
        raise HfViewError(f"{model_dir.path}: its manifest does not name its Hugging Face family (exported before "
                          "manifests recorded it); export it again with `tfm-export onnx`")
    return model_type


@dataclass(frozen=True)
class Expressible:
    """What the layout says of a model: its family, the tokenizer JSON tokenizers.js reads, and for a multilingual
    model the tokenizer class that chooses its languages."""

    model_type: str
    tokenizer: dict[str, Any]
    languages: LanguageClass | None


def check_expressible(model_dir: ModelDir) -> Expressible:
    """Refuses, in one line each, what the layout cannot hold."""
    cfg, where = model_dir.config, model_dir.path
    model_type = family(model_dir)
    if model_dir.rules.language_rule == DECODER_START_LANGUAGE:
        raise HfViewError(f"{where}: its target language is the decoder's first input (mBART-cc25's rule), but "
                          "transformers.js's translation pipeline forces a target language only as the first "
                          "generated token, so this model cannot be expressed in their layout (use tfm-run "
                          "--target-lang)")
    languages = language_class(model_dir)
    if cfg.d_k != cfg.d_v or cfg.d_k * cfg.n_head != cfg.d_model:
        raise HfViewError(f"{where}: its attention heads are {cfg.d_k} (keys) and {cfg.d_v} (values) wide, but "
                          f"Optimum assumes d_model / heads = {cfg.d_model // cfg.n_head}; it would size the "
                          "empty past wrongly, so this model cannot be expressed in their layout")
    vocab = model_dir.vocabulary()  # its files checked against the manifest
    original = dumps(_one_tokenizer(model_dir, vocab, languages))
    rewritten = js_tokenizer(json.loads(original), vocab.source.origin)
    tokens = vocab.source.tokens()
    probes = [" ".join(tokens[i::7][:40]).replace("\u2581", " ") for i in range(7)]
    if (text := same_ids(original, dumps(rewritten), probes)) is not None:
        raise HfViewError(f"{vocab.source.origin}: its rewrite for transformers.js encodes {text[:40]!r} "
                          "differently; this tokenizer cannot be expressed in their layout")
    return Expressible(model_type, rewritten, languages)


def language_class(model_dir: ModelDir) -> LanguageClass | None:
    """The class whose pattern every one of a multilingual model's codes (chosen as generate()'s first token)
    matches; a model whose target language goes before the source text (>>fra<<) needs none."""
    rules = model_dir.rules
    if rules.language_rule != "forced_bos":
        return None
    for cls in LANGUAGE_CLASSES:
        if all(re.fullmatch(cls.pattern, code) for code in rules.languages):
            return cls
    raise HfViewError(f"{model_dir.path}: its language codes ({', '.join(rules.languages[:4])}, ...) follow none "
                      "of the patterns transformers.js's translation tokenizers (NLLB's, M2M100's, mBART's) read "
                      "codes by, so this model cannot be expressed in their layout")


def _one_tokenizer(model_dir: ModelDir, vocab: Vocabulary, languages: LanguageClass | None) -> dict[str, Any]:
    """Both libraries take one tokenizer: the source's, which must then decode every target id as the target's
    does (opus-mt: two SentencePiece models over one vocab.json; M2M100: language codes only the target has). A
    multilingual model's codes are its special tokens: transformers.js finds them there."""
    source = json.loads(vocab.source.tokenizer.to_str())
    if languages is not None:
        source = _with_special(source, {code: vocab.target.tokenizer.token_to_id(code)
                                        for code in model_dir.rules.languages})
    if vocab.shared:
        return source
    view = decoding_targets(source)
    if same_decodes(dumps(view), vocab.target.tokenizer.to_str(), vocab.target.vocab_size) is not None:
        raise HfViewError(f"{model_dir.path}: has separate source and target vocabularies; transformers.js and "
                          "Optimum take one tokenizer for both, so this model cannot be expressed in their layout")
    return view


def _with_special(tokenizer: dict[str, Any], tokens: dict[str, int]) -> dict[str, Any]:
    """A copy with `tokens` (name: id) among its special added tokens."""
    added = {t["content"]: t for t in tokenizer.get("added_tokens", [])}
    for name, token_id in tokens.items():
        added[name] = {**added.get(name, {"id": token_id, "content": name, "single_word": False, "lstrip": False,
                                          "rstrip": False, "normalized": False}), "special": True}
    return {**tokenizer, "added_tokens": sorted(added.values(), key=lambda t: t["id"])}


def model_config(model_type: str, cfg: ModelConfig, rules: TokenRules, max_target: int) -> dict[str, Any]:
    """config.json: the family's names for the sizes the loaders read, and the ids generate() starts from."""
    if model_type in T5_NAMED:
        sizes = {"architectures": ["T5ForConditionalGeneration"], "d_model": cfg.d_model, "d_kv": cfg.d_k,
                 "d_ff": cfg.d_inner, "num_layers": cfg.n_layers, "num_decoder_layers": cfg.n_layers,
                 "num_heads": cfg.n_head, "relative_attention_num_buckets": cfg.relative_buckets,
                 "relative_attention_max_distance": cfg.relative_max_distance, "tie_word_embeddings": False}
    else:
        sizes = {"architectures": [ARCHITECTURES[model_type]], "d_model": cfg.d_model,
                 "encoder_layers": cfg.n_layers, "decoder_layers": cfg.n_layers,
                 "encoder_attention_heads": cfg.n_head, "decoder_attention_heads": cfg.n_head,
                 "encoder_ffn_dim": cfg.d_inner, "decoder_ffn_dim": cfg.d_inner,
                 "max_position_embeddings": max_target, "scale_embedding": False}
    return {"model_type": model_type, "is_encoder_decoder": True, "vocab_size": cfg.trg_vocab_size,
            "decoder_vocab_size": cfg.trg_vocab_size, "use_cache": True, **sizes, **_ids(rules)}


def generation_config(rules: TokenRules, max_target: int) -> dict[str, Any]:
    """generation_config.json: tfm-run's decoding rules as generate() spells them (its max_length counts the
    decoder's first input; tfm-run's counts generated tokens)."""
    generated = min(rules.max_new_tokens or max_target, max_target)
    config = {**_ids(rules), "max_length": generated + 1, "num_beams": rules.num_beams,
              "length_penalty": rules.length_penalty, "early_stopping": rules.early_stopping}
    if rules.banned:
        config["bad_words_ids"] = [[token] for token in rules.banned]
    return config


def _ids(rules: TokenRules) -> dict[str, Any]:
    return {"decoder_start_token_id": rules.start, "eos_token_id": rules.eos, "pad_token_id": rules.pad,
            "forced_bos_token_id": rules.forced_bos, "forced_eos_token_id": rules.forced_eos}


def tokenizer_config(tokenizer: dict[str, Any], rules: TokenRules, languages: LanguageClass | None) -> dict[str, Any]:
    """tokenizer_config.json: transformers.js loads no tokenizer without it and reads the unknown token here (a
    word-level vocabulary's unknown words have no id otherwise); the padding token batches sources. A multilingual
    model names its family's class and its default languages (transformers' Python classes would otherwise
    reframe sources with eng_Latn or en_XX)."""
    tokens = _tokens(tokenizer)
    special = {"unk_token": _unknown(tokenizer, tokens), "pad_token": tokens.get(rules.pad)}
    special |= {name: token for name, token in (("bos_token", BOS), ("eos_token", EOS)) if token in tokens.values()}
    config = {"tokenizer_class": "PreTrainedTokenizerFast"}
    if languages is not None:
        framing = template_codes(tokenizer.get("post_processor") or {}, rules.languages)
        defaults = {"src_lang": framing[0] if framing else None, "tgt_lang": tokens.get(rules.forced_bos)}
        config = {"tokenizer_class": languages.name,
                  **{k: languages.spell(code) for k, code in defaults.items() if code is not None}}
    return {**config, **{k: v for k, v in special.items() if v is not None},
            "clean_up_tokenization_spaces": False, "model_max_length": 1_000_000}


def _tokens(tokenizer: dict[str, Any]) -> dict[int, str]:
    model = tokenizer["model"]
    vocab = model.get("vocab", {})
    by_id = dict(enumerate(piece for piece, _ in vocab)) if isinstance(vocab, list) else \
        {i: token for token, i in vocab.items()}
    return by_id | {t["id"]: t["content"] for t in tokenizer.get("added_tokens", [])}


def _unknown(tokenizer: dict[str, Any], tokens: dict[int, str]) -> str | None:
    model = tokenizer["model"]
    if model.get("unk_token"):
        return model["unk_token"]
    return tokens.get(model["unk_id"]) if model.get("unk_id") is not None else None


def write_view(model_dir: ModelDir, output: Path, force: bool, parity: Callable[[Path], list[str]],
               external_above: int = EXTERNAL_DATA_BYTES, progress: bool = False) -> HfView:
    """Checks what can be expressed, writes every file into a staging directory, runs `parity(staging)` (which
    raises on a failure) and only then puts the directory in place. external_above: the weight bytes (encoder
    and decoder) from which the graphs keep their weights in external files (tests lower it); progress: a bar per
    graph written, and the check."""
    made = check_expressible(model_dir)
    precision, cfg, rules = model_dir.precision, model_dir.config, model_dir.rules
    max_target = model_dir.limits["max_target_length"]
    with (staged_directory(output, force, keep=(model_dir.path,)) as staging,
          tqdm(total=len(STEMS) + 1, desc="hf layout", disable=not progress) as bar):
        (staging / ONNX_DIR).mkdir()
        files = _write_graphs(model_dir, staging, precision, external_above, bar)
        texts = {"config.json": {**model_config(made.model_type, cfg, rules, max_target),
                                 **_js_config(staging, files, precision)},
                 GENERATION_CONFIG: generation_config(rules, max_target),
                 "tokenizer_config.json": tokenizer_config(made.tokenizer, rules, made.languages)}
        texts[f"{ONNX_DIR}/{GENERATION_CONFIG}"] = texts[GENERATION_CONFIG]
        for name, data in texts.items():
            (staging / name).write_text(json.dumps(data, indent=2) + "\n")
        (staging / "tokenizer.json").write_text(dumps(made.tokenizer))
        bar.set_postfix_str("checking every graph")
        lines = parity(staging)
        bar.update()
        written = sorted(str(p.relative_to(staging)) for p in staging.rglob("*") if p.is_file())
        (staging / MANIFEST).write_text(json.dumps(_manifest(model_dir, staging, written), indent=2) + "\n")
    return HfView(output, files, lines)


def _write_graphs(model_dir: ModelDir, staging: Path, precision: str, external_above: int, bar: tqdm) -> list[str]:
    """The four graphs: weights inline below protobuf's 2 GB; above, copied into `<file>.onnx_data` a chunk at a
    time, the decoders' once for all three. The directory's graphs and weights are checked against its manifest
    and read once, their weights only where they go inline."""
    directory, cfg = model_dir.path, model_dir.config
    encoder, decoder = (load_graph(model_dir, g.value, external_data=False)
                        for g in (Graph.ENCODER, Graph.DECODER_STEP))
    streamed = weight_bytes(encoder) + weight_bytes(decoder) >= external_above
    if not streamed:
        for proto in (encoder, decoder):
            load_external_data_for_model(proto, str(directory))
    names = [graph_file(stem, precision) for stem in STEMS]
    encoder_only, merged = encoder_model(encoder), merged_decoder(encoder, decoder, cfg)
    del encoder
    decoder = with_past_decoder(decoder)
    if streamed:
        WeightsFile(staging / (names[0] + EXTERNAL_SUFFIX)).store(encoder_only, directory)
        shared = WeightsFile(staging / (names[1] + EXTERNAL_SUFFIX))
        shared.store(merged, directory)
        shared.refer(decoder)
    for name, proto in zip(names, (encoder_only, merged, first_step_decoder(merged, cfg), decoder), strict=True):
        bar.set_postfix_str(name)
        onnx.save_model(proto, str(staging / name))
        onnx.checker.check_model(str(staging / name), full_check=True)
        bar.update()
    return names


def _js_config(staging: Path, files: list[str], precision: str) -> dict[str, Any]:
    """transformers.js's own section: which files have external data (it fetches only what this names), and the
    dtype that picks this precision's files."""
    external = {Path(f).name: 1 for f in files if (staging / (f + EXTERNAL_SUFFIX)).exists()}
    return {"transformers.js_config": {"dtype": DTYPES[precision],
                                       **({"use_external_data_format": external} if external else {})}}


def _manifest(model_dir: ModelDir, staging: Path, files: list[str]) -> dict[str, Any]:
    """Ours, beside Hugging Face's files: what the view was made from, each file's sha256."""
    return {"format": HF_VIEW_FORMAT, "format_version": HF_VIEW_FORMAT_VERSION, "tool": "tfm-export",
            "precision": model_dir.precision,
            "source_model": {"manifest_sha256": file_sha256(model_dir.path / MANIFEST),
                             "source_checkpoint_sha256": model_dir.manifest.source_checkpoint.sha256},
            "files": {name: file_sha256(staging / name) for name in files}}
