"""The random multilingual and BPE model directories of the Hugging Face languages tests (NLLB, M2M100, mBART-50,
mBART-cc25, BART), built offline: here rather than in a test file because serving's tests export and serve the same
NLLB (made() caches each once per run for both).

Tokenizers are trained on the repository's own text (with `tokenizers`, and SentencePiece for M2M100 and mBART) and
handed to the transformers tokenizer classes, the models are random (tiny configs, a fixed seed), each saved with its
case's generation defaults (CASES); nothing is downloaded.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from support.hf_oracle import generate, made_and_exported, randomize, repository_lines, retarget_stop, sample_texts

transformers = pytest.importorskip("transformers", reason="the models are built with the hf extra: pip install "
                                   "'.[hf]'")

SIZES = dict(d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
             encoder_ffn_dim=48, decoder_ffn_dim=48, max_position_embeddings=128)
FAIRSEQ_IDS = dict(bos_token_id=0, pad_token_id=1, eos_token_id=2, decoder_start_token_id=2)
SPECIALS = ["<s>", "<pad>", "</s>", "<unk>"]
NLLB_CODES = ["eng_Latn", "fra_Latn", "deu_Latn", "spa_Latn"]
# family -> (source language to translate from, target language, generation defaults the model is saved with)
CASES = {
    "nllb": ("fra_Latn", "deu_Latn", dict(num_beams=4, early_stopping=True)),
    "m2m100": ("__fr__", "__de__", dict(num_beams=5, early_stopping=True)),
    "mbart-50": ("fr_XX", "de_DE", dict(num_beams=4, length_penalty=0.6, early_stopping="never")),
    "mbart-cc25": (None, "de_DE", dict(num_beams=3, length_penalty=1.5)),
    "bart": (None, None, dict(num_beams=4, early_stopping=True, forced_bos_token_id=0)),
}
RULES = {"nllb": "forced_bos", "m2m100": "forced_bos", "mbart-50": "forced_bos", "mbart-cc25": "decoder_start",
         "bart": None}


def _lines() -> list[str]:
    return [t for t in repository_lines() if t.strip()]


def _trained(model: models.Model, pre_tokenizer, trainer) -> dict:
    tok = Tokenizer(model)
    tok.pre_tokenizer = pre_tokenizer
    tok.train_from_iterator(_lines(), trainer)
    return json.loads(tok.to_str())["model"]


def _merges(model: dict) -> list[tuple[str, str]]:
    return [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]


def _tokenizer(family: str, work: Path):
    """The family's transformers tokenizer over a vocabulary trained here (SentencePiece-style BPE for NLLB,
    SentencePiece's own BPE for M2M100, its Unigram for mBART, byte-level BPE for BART)."""
    if family == "m2m100":
        return _m2m100_tokenizer(work)
    if family == "nllb":
        bpe = _trained(models.BPE(unk_token="<unk>"), pre_tokenizers.Metaspace(),
                       trainers.BpeTrainer(vocab_size=400, special_tokens=SPECIALS, show_progress=False))
        return transformers.NllbTokenizer(vocab=bpe["vocab"], merges=_merges(bpe), extra_special_tokens=NLLB_CODES,
                                          src_lang=NLLB_CODES[0])
    if family == "bart":
        byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False)
        bpe = _trained(models.BPE(), byte_level, trainers.BpeTrainer(
            vocab_size=400, special_tokens=[*SPECIALS, "<mask>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False))
        return transformers.BartTokenizer(vocab=bpe["vocab"], merges=_merges(bpe))
    tokenizer_class = transformers.MBart50Tokenizer if family == "mbart-50" else transformers.MBartTokenizer
    return tokenizer_class(vocab=_unigram(work), src_lang="en_XX")


def _unigram(work: Path) -> list[tuple[str, float]]:
    """mBART's Unigram vocabulary (specials first, fairseq's ids), trained by SentencePiece as mBART's own
    sentencepiece.bpe.model was. Not by `tokenizers`' UnigramTrainer: its pieces' ids and scores change from one
    process to the next (its sums run in hash-map order), so every mBART case would be another model on each
    run. SentencePiece splits the work over a fixed number of threads, not the machine's cores: the same
    vocabulary on any machine."""
    spm = pytest.importorskip("sentencepiece", reason="the models are built with the hf extra: pip install '.[hf]'")
    spm.SentencePieceTrainer.train(sentence_iterator=iter(_lines()), model_prefix=str(work / "unigram"),
                                   vocab_size=400, model_type="unigram", bos_id=0, pad_id=1, eos_id=2, unk_id=3,
                                   num_threads=16, minloglevel=2)
    pieces = spm.SentencePieceProcessor(model_file=str(work / "unigram.model"))
    return [(pieces.id_to_piece(i), pieces.get_score(i)) for i in range(pieces.get_piece_size())]


def _m2m100_tokenizer(work: Path):
    """M2M100Tokenizer over a SentencePiece BPE model and a fairseq-ordered vocab.json (specials first)."""
    spm = pytest.importorskip("sentencepiece", reason="the models are built with the hf extra: pip install '.[hf]'")
    spm.SentencePieceTrainer.train(sentence_iterator=iter(_lines()), model_prefix=str(work / "bpe"),
                                   vocab_size=400, model_type="bpe", minloglevel=2)
    pieces = spm.SentencePieceProcessor(model_file=str(work / "bpe.model"))
    vocab = dict.fromkeys([*SPECIALS, *(pieces.id_to_piece(i) for i in range(pieces.get_piece_size()))])
    (work / "vocab.json").write_text(json.dumps({t: i for i, t in enumerate(vocab)}))
    return transformers.M2M100Tokenizer(vocab_file=str(work / "vocab.json"), spm_file=str(work / "bpe.model"),
                                        src_lang="en")


def nllb_hub_tokenizer(work: Path):
    """NLLB as its repositories ship it: sentencepiece.bpe.model (SentencePiece's own BPE, trained here) and the
    BPE tokenizer.json converted from it (its merges, its charsmap, fairseq's ids with the specials first, NLLB's
    codes), which NllbTokenizer saves."""
    from tokenizers import Regex, decoders, normalizers

    from tfm_export.model.hf_tokenizer import BPE, NORMAL, _bpe_merges, _spm_proto
    spm = pytest.importorskip("sentencepiece", reason="the models are built with the hf extra: pip install '.[hf]'")
    spm.SentencePieceTrainer.train(sentence_iterator=iter(_lines()), model_prefix=str(work / "bpe"),
                                   vocab_size=400, model_type="bpe", minloglevel=2)
    proto = _spm_proto(work / "bpe.model", BPE)
    pieces = [p.piece for p in proto.pieces if p.type == NORMAL]
    vocab = {t: i for i, t in enumerate(dict.fromkeys([*SPECIALS, *pieces]))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=_bpe_merges(proto), unk_token="<unk>", fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.Precompiled(proto.normalizer_spec.precompiled_charsmap),
                                           normalizers.Replace(Regex(" {2,}"), " ")])
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=True)
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always", split=True)
    return transformers.NllbTokenizer(tokenizer_object=tok, extra_special_tokens=NLLB_CODES, src_lang=NLLB_CODES[0])


def save_nllb_hub(directory: Path) -> Path:
    """A random NLLB with nllb_hub_tokenizer's two files (the C++ command's tests; no generate() oracle here)."""
    work = Path(tempfile.mkdtemp(dir=directory.parent))
    tokenizer = nllb_hub_tokenizer(work)
    tokenizer.save_pretrained(directory)
    (directory / "sentencepiece.bpe.model").write_bytes((work / "bpe.model").read_bytes())
    model = _model("nllb", tokenizer)
    model.generation_config.max_length = 24
    model.save_pretrained(directory)
    return directory


def hf_language(code: str | None) -> str | None:
    """M2M100Tokenizer's src_lang is the bare code ("fr"); --source-lang names the token (__fr__)."""
    return code.strip("_") if code and code.startswith("__") else code


def _vocab_size(tokenizer) -> int:
    """M2M100's table ends with its language codes and 8 made-up words, past len(tokenizer)."""
    codes = getattr(tokenizer, "lang_token_to_id", {})
    return max([len(tokenizer), *(i + 9 for i in codes.values())])


def _model(family: str, tokenizer):
    torch.manual_seed(5)
    ids = dict(FAIRSEQ_IDS, vocab_size=_vocab_size(tokenizer))
    if family in ("nllb", "m2m100"):
        return randomize(transformers.M2M100ForConditionalGeneration(
            transformers.M2M100Config(**SIZES, **ids, scale_embedding=True)), 2.0)
    if family == "bart":
        return randomize(transformers.BartForConditionalGeneration(
            transformers.BartConfig(**SIZES, **ids, forced_eos_token_id=2)), 2.0)
    if family == "mbart-cc25":  # as mbart-large-en-ro: the target language is the decoder's first token
        ids["decoder_start_token_id"] = tokenizer.convert_tokens_to_ids("ro_RO")
    return randomize(transformers.MBartForConditionalGeneration(
        transformers.MBartConfig(**SIZES, **ids, scale_embedding=True)), 2.0)


def target_options(tokenizer, family: str) -> dict:
    """generate()'s options that choose the case's target language."""
    target = CASES[family][1]
    if target is None:
        return {}
    key = "decoder_start_token_id" if RULES[family] == "decoder_start" else "forced_bos_token_id"
    return {key: tokenizer.convert_tokens_to_ids(target)}


def save(family: str, directory: Path) -> Path:
    """A random model saved with its tokenizer and generation defaults; stopping and banning retargeted where
    they change outputs (retarget_stop)."""
    tokenizer = _tokenizer(family, Path(tempfile.mkdtemp(dir=directory.parent)))
    tokenizer.save_pretrained(directory)
    model = _model(family, tokenizer)
    model.save_pretrained(directory)
    source, _, defaults = CASES[family]
    target = target_options(tokenizer, family)
    outputs = generate(transformers, directory, sample_texts(), hf_language(source), num_beams=1, do_sample=False,
                       eos_token_id=None, forced_eos_token_id=None, max_length=21, **target)
    retarget_stop(model, outputs, force_eos=True, keep=tuple(target.values()))
    for key, value in dict(defaults, max_length=24).items():
        setattr(model.generation_config, key, value)
    model.save_pretrained(directory)
    return directory


def made(tmp_path_factory, family: str) -> tuple[Path, Path]:
    """The family's model and its export, made once per run (the languages tests take each, serving's NLLB's)."""
    return made_and_exported(tmp_path_factory, f"languages-{family}", lambda directory: save(family, directory))
