"""The random Marian and T5 model directories of the Hugging Face text tests, built offline: here rather than in a
test file because serving's tests export and serve the same models (made() caches them once per run for both).

Tokenizers are trained on the repository's own text (SentencePiece: two models and vocab.json for Marian, T5's
fast tokenizer), the models are random (tiny configs, fixed seeds), nothing is downloaded.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from support.hf_oracle import generate, made_and_exported, randomize, repository_lines, retarget_stop, sample_texts

transformers = pytest.importorskip("transformers", reason="the models are built with the hf extra: pip install "
                                   "'.[hf]'")
spm = pytest.importorskip("sentencepiece", reason="the models are built with the hf extra: pip install '.[hf]'")

SIZES = dict(d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
             encoder_ffn_dim=48, decoder_ffn_dim=48, max_position_embeddings=64)
T5_SIZES = dict(d_model=32, d_kv=16, d_ff=48, num_layers=2, num_heads=4, relative_attention_num_buckets=8,
                relative_attention_max_distance=20, decoder_start_token_id=0)
# weights whose greedy and beam outputs end at many lengths (seed 3 gave the gated T5 only two at beam 4)
SEEDS = {"marian": 3, "t5": 3, "t5-v1.1": 5, "t5-even": 3}
# t5-even: heads d_model / num_heads wide, as t5-small to t5-large have them (Optimum assumes it)
EVEN_HEADS = {"d_kv": T5_SIZES["d_model"] // T5_SIZES["num_heads"]}


def _train_spm(text: list[str], prefix: Path, size: int, **ids: int) -> Path:
    spm.SentencePieceTrainer.train(sentence_iterator=iter(text), model_prefix=str(prefix), vocab_size=size,
                                   model_type="unigram", character_coverage=0.995, minloglevel=2, **ids)
    return prefix.with_suffix(".model")


def marian_tokenizer(directory: Path) -> int:
    """source.spm (on the prose) and target.spm (on the code, upper-cased: characters the source lacks), joined in
    one vocab.json as opus-mt has it; returns the vocabulary size."""
    lines = [t for t in repository_lines() if t.strip()]
    ids = dict(unk_id=1, eos_id=0, bos_id=-1, pad_id=-1)
    source = _train_spm(lines[: len(lines) // 2], directory / "src", 300, **ids)
    target = _train_spm([t.upper() for t in lines[len(lines) // 2:]], directory / "tgt", 250, **ids)
    source.rename(directory / "source.spm")
    target.rename(directory / "target.spm")
    vocab: dict[str, int] = {}
    for name in ("source.spm", "target.spm"):
        sp = spm.SentencePieceProcessor(model_file=str(directory / name))
        for piece in ["</s>", "<unk>", ">>fra<<"] + [sp.id_to_piece(i) for i in range(sp.get_piece_size())]:
            vocab.setdefault(piece, len(vocab))
    vocab["<pad>"] = len(vocab)
    (directory / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    for leftover in directory.glob("*.vocab"):
        leftover.unlink()
    (directory / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "MarianTokenizer"}))
    return len(vocab)


def _t5_tokenizer(directory: Path) -> int:
    """T5's fast tokenizer over a SentencePiece model (pad 0, </s> 1, <unk> 2), saved as tokenizer.json."""
    model = _train_spm([t for t in repository_lines() if t.strip()], directory / "t5", 300,
                       pad_id=0, eos_id=1, unk_id=2, bos_id=-1)
    sp = spm.SentencePieceProcessor(model_file=str(model))
    tok = transformers.T5Tokenizer(vocab=[(sp.id_to_piece(i), sp.get_score(i)) for i in range(sp.get_piece_size())],
                                   extra_ids=0)
    tok.save_pretrained(directory)
    for leftover in directory.glob("t5.*"):
        leftover.unlink()
    return len(tok)


def random_model(kind: str, vocab_size: int):
    """The kind's ("marian", "t5", "t5-v1.1", "t5-even") tiny model with random weights, seeded by SEEDS."""
    torch.manual_seed(SEEDS[kind])
    if kind == "marian":
        config = transformers.MarianConfig(**SIZES, vocab_size=vocab_size, pad_token_id=vocab_size - 1,
                                           decoder_start_token_id=vocab_size - 1, eos_token_id=0,
                                           activation_function="swish", scale_embedding=True)
        return randomize(transformers.MarianMTModel(config), 2.0)
    gated = dict(feed_forward_proj="gated-gelu", tie_word_embeddings=False) if kind == "t5-v1.1" else {}
    sizes = {**T5_SIZES, **(EVEN_HEADS if kind == "t5-even" else {})}
    config = transformers.T5Config(**sizes, **gated, vocab_size=vocab_size)
    return randomize(transformers.T5ForConditionalGeneration(config), 1.0)


def _save_model(kind: str, directory: Path) -> Path:
    """A random model with its tokenizer, stopping and banning where they change outputs (retarget_stop)."""
    size = marian_tokenizer(directory) if kind == "marian" else _t5_tokenizer(directory)
    model = random_model(kind, size)
    model.save_pretrained(directory)
    outputs = generate(transformers, directory, sample_texts(), num_beams=1, do_sample=False, eos_token_id=None,
                       max_length=21)
    retarget_stop(model, outputs, force_eos=False)
    model.generation_config.max_length = 24
    model.save_pretrained(directory)
    return directory


def made(tmp_path_factory, kind: str) -> tuple[Path, Path]:
    """The kind's model and its export, made once per run (the text tests and serving's take the same two)."""
    return made_and_exported(tmp_path_factory, f"text-{kind}", lambda directory: _save_model(kind, directory))
